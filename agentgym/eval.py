"""Evaluate a policy (a model on any backend, or a scripted agent) on an env.

Episodes run through the real rollout (chat template, token-in-token-out,
env groups with fixed validation seeds); the per-tag metrics are printed and
written to ``eval.json``, trajectories are rendered to ``render_save_dir``
and dumped to ``rollout_dump_dir``.

Usage::

    python -m agentgym.eval env=sokoban                        # the env's solver
    python -m agentgym.eval env=frozen_lake agent=random episodes=20
    python -m agentgym.eval env=sokoban model.path=DIR generation=hf
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

import agentgym
from agentgym.envs.scripted import AGENTS
from agentgym.envs.text_env import TextEnv
from agentgym.rollout.backends import (
    GenerationBackend,
    SamplingParams,
    make_backend,
    resolve_backend,
)
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvConfig, EnvManager
from agentgym.rollout.loop import RolloutConfig, RolloutResult, collect
from agentgym.rollout.render import dump_trajectories, render_trajectories
from agentgym.train import register_env_configs

POLICIES = ("auto", "model", *AGENTS)

register_env_configs()  # env=<plugin name> works without a YAML file


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


def scripted_tokenizer(env: TextEnv) -> Any:
    """A small tokenizer for scripted agents, trained on the env's own text."""
    from agentgym.models.tiny import build_tokenizer

    observation, _ = env.reset(seed=0)
    corpus = [env.instructions, observation] * 4
    template = "qwen2.5" if env.tools else "chatml"
    return build_tokenizer(corpus, vocab_size=400, chat_template=template)


def build_policy(cfg: DictConfig, env: TextEnv) -> tuple[GenerationBackend, Any, str]:
    """The backend, its tokenizer, and a description of the policy, from the config."""
    from agentgym.rollout.backends.scripted import ScriptedBackend

    agent = cfg.agent
    if agent not in POLICIES:
        raise ValueError(f"Unknown agent {agent!r}; valid options: {sorted(POLICIES)}")
    if agent == "auto":
        agent = "model" if cfg.model.path else "solver"
    if agent != "model":
        tokenizer = scripted_tokenizer(env)
        return ScriptedBackend(tokenizer, agent, seed=cfg.seed), tokenizer, f"scripted {agent}"
    if not cfg.model.path:
        raise ValueError("agent=model needs model.path (a Hugging Face model folder)")
    if not (Path(cfg.model.path) / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path={cfg.model.path!r} is not a model folder (no config.json); "
            "models are loaded from local folders, never downloaded"
        )
    from transformers import AutoTokenizer

    generation = cfg.generation
    backend_name = resolve_backend(generation.backend)
    backend = make_backend(
        backend_name,
        str(cfg.model.path),
        dtype=cfg.model.dtype,
        device=cfg.model.device,
        max_model_len=generation.max_model_len,
        seed=cfg.seed,
        max_batch_size=generation.max_batch_size,
        base_url=generation.base_url,
        served_model_name=generation.served_model_name,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(cfg.model.path))
    return backend, tokenizer, f"model {cfg.model.path} on {backend_name}"


async def evaluate(cfg: DictConfig, backend: GenerationBackend, tokenizer: Any) -> RolloutResult:
    """Run ``cfg.episodes`` validation episodes (group size 1, fixed seeds)."""
    kwargs: dict[str, Any] = OmegaConf.to_container(cfg.env.kwargs, resolve=True)  # type: ignore[assignment]
    manager = EnvManager(
        tags=[cfg.env.name],
        env_groups=cfg.episodes,
        group_size=1,
        env_configs={cfg.env.name: EnvConfig(cfg.env.name, kwargs)},
        seed=cfg.seed,
        fixed_seeds=True,
        render_mode="rgb_array" if cfg.render_save_dir else None,
    )
    generation = cfg.generation
    config = RolloutConfig(
        max_turns=cfg.max_turns,
        sequence_length=cfg.sequence_length,
        prefix_check=cfg.prefix_check,
        record_frames=bool(cfg.render_save_dir),
        sampling=SamplingParams(
            temperature=generation.temperature,
            top_p=generation.top_p,
            top_k=generation.top_k,
            max_new_tokens=generation.max_new_tokens,
            seed=cfg.seed,
        ),
    )
    try:
        return await collect(manager, backend, ChatTokenizer(tokenizer), config)
    finally:
        manager.close()
        await backend.close()


def print_report(result: RolloutResult, policy: str) -> None:
    """One line per tag: success, score, turns, invalid-action and truncation rates."""
    tags = sorted({t.tag for t in result.trajectories})
    print(f"policy: {policy}")
    for tag in tags:
        m = result.metrics
        figures = " ".join(
            f"{key}={m.get(f'{tag}/{key}', float('nan')):.3g}"
            for key in ("success", "score", "turns", "invalid_action_rate", "truncation_rate")
        )
        counts = f"episodes={m[f'{tag}/trajectories']:.0f} failed={m[f'{tag}/failed']:.0f}"
        print(f"{tag}: {counts} {figures}")


@hydra.main(version_base=None, config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: see ``configs/eval.yaml``."""
    if cfg.episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {cfg.episodes}")
    env = make_text_env(cfg.env.name, cfg.env.kwargs)
    backend, tokenizer, policy = build_policy(cfg, env)
    result = asyncio.run(evaluate(cfg, backend, tokenizer))
    output_dir = Path(HydraConfig.get().runtime.output_dir)
    episodes = [
        {
            "seed": t.seed,
            "success": t.success,
            "score": t.score,
            "turns": len(t.turns),
            "invalid_actions": sum(not turn.action_is_valid for turn in t.turns),
            "termination_reason": t.termination_reason,
        }
        for t in result.trajectories
    ]
    report = {"policy": policy, "metrics": result.metrics, "episodes": episodes}
    (output_dir / "eval.json").write_text(json.dumps(report, indent=2))
    print_report(result, policy)
    print(f"results: {output_dir / 'eval.json'}")
    if cfg.render_save_dir:
        render_trajectories(result.trajectories[: cfg.renders], cfg.render_save_dir)
        print(f"renders: {cfg.render_save_dir}/index.html")
    if cfg.rollout_dump_dir:
        tokenizer_path = Path(cfg.model.path) if cfg.model.path else None
        if tokenizer_path is None:  # scripted agents' tokenizer is built on the fly: keep it
            tokenizer_path = Path(cfg.rollout_dump_dir) / "tokenizer"
            tokenizer.save_pretrained(tokenizer_path)
        meta = {
            "config": OmegaConf.to_container(cfg, resolve=True),
            "tokenizer": str(tokenizer_path.resolve()),
            "policy": policy,
        }
        path = dump_trajectories(result.trajectories, cfg.rollout_dump_dir, meta=meta)
        print(f"dump: {path}")


if __name__ == "__main__":
    main()
