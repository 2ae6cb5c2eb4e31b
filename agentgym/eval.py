"""Evaluate a scripted agent on an env and render its episodes.

Usage::

    python -m agentgym.eval env=sokoban agent=solver episodes=50
    python -m agentgym.eval env=frozen_lake agent=random +env.kwargs.size=6
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import agentgym
from agentgym.envs.scripted import Agent, make_agent
from agentgym.envs.text_env import TextEnv


@dataclass(frozen=True)
class EpisodeResult:
    """Outcome of one evaluation episode."""

    seed: int
    success: bool
    score: float
    steps: int
    invalid_actions: int


def run_episode(
    env: TextEnv, agent: Agent, seed: int, render_path: Path | None = None
) -> EpisodeResult:
    """Play one episode; optionally write its frames as text to ``render_path``."""
    observation, _ = env.reset(seed=seed)
    agent.reset(env)
    frames = [f"seed {seed}\n{observation}"]
    score, steps, invalid = 0.0, 0, 0
    terminated = truncated = False
    info: dict[str, Any] = {"success": False}
    while not (terminated or truncated):
        response = agent.act(env)
        observation, reward, terminated, truncated, info = env.step(response)
        score += reward
        steps += 1
        invalid += not info["action_is_valid"]
        frames.append(f"> {response}\nreward {reward:+.2f}\n{observation}")
    if render_path is not None:
        render_path.parent.mkdir(parents=True, exist_ok=True)
        render_path.write_text("\n\n".join(frames) + "\n", encoding="utf-8")
    return EpisodeResult(seed, bool(info["success"]), score, steps, invalid)


def summarize(results: list[EpisodeResult]) -> dict[str, float]:
    """Mean success, score, length and invalid-action rate over episodes."""
    n = len(results)
    steps = sum(r.steps for r in results)
    return {
        "episodes": n,
        "success_rate": sum(r.success for r in results) / n,
        "mean_score": sum(r.score for r in results) / n,
        "mean_steps": steps / n,
        "invalid_action_rate": sum(r.invalid_actions for r in results) / max(steps, 1),
    }


def make_text_env(name: str, kwargs: Any) -> TextEnv:
    """Make a registered env from a config's ``name`` and ``kwargs`` mapping.

    Raises:
        TypeError: If ``kwargs`` is not a mapping or the env is not a TextEnv.
    """
    if OmegaConf.is_config(kwargs):
        kwargs = OmegaConf.to_container(kwargs, resolve=True)
    if not isinstance(kwargs, dict):
        raise TypeError(f"env.kwargs must be a mapping of constructor arguments, got {kwargs!r}")
    env = agentgym.make(name, **kwargs).unwrapped
    if not isinstance(env, TextEnv):
        raise TypeError(f"env {name!r} is a {type(env).__name__}, not an agentgym TextEnv")
    return env


@hydra.main(version_base=None, config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: see ``configs/eval.yaml``."""
    if cfg.episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {cfg.episodes}")
    env = make_text_env(cfg.env.name, cfg.env.kwargs)
    agent = make_agent(cfg.agent, seed=cfg.seed)
    render_dir = Path(cfg.render_save_dir) if cfg.render_save_dir else None
    results = []
    for i in range(cfg.episodes):
        seed = cfg.seed + i
        path = None
        if render_dir is not None and i < cfg.renders:
            path = render_dir / f"episode_{i:04d}_seed_{seed}.txt"
        results.append(run_episode(env, agent, seed, path))
    summary = summarize(results)
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    (output_dir / "eval.json").write_text(
        json.dumps({"summary": summary, "episodes": [asdict(r) for r in results]}, indent=2)
    )
    figures = " ".join(f"{key}={value:.3g}" for key, value in summary.items())
    print(f"env={cfg.env.name} agent={cfg.agent} {figures}")
    print(f"results: {output_dir / 'eval.json'}")
    if render_dir is not None:
        print(f"renders: {render_dir}")


if __name__ == "__main__":
    main()
