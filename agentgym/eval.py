"""Evaluate a policy (a model on any backend, or a scripted agent) on an env.

Episodes run through the real rollout (chat template, token-in-token-out,
env groups with fixed validation seeds); the per-tag metrics are printed and
written to ``eval.json``, trajectories are rendered to ``render_save_dir``
and dumped to ``rollout_dump_dir``.

Given a trained checkpoint (``model.path=<run>/checkpoints/checkpoint-N/model``,
the checkpoint folder, or the run's ``output_dir``), eval plays as the run
validated: its validation envs (every tag, with its own arguments), rollout
mode, history, turns, sequence length, sampling, validation seeds and vLLM
engine arguments, read from the run's saved ``train_config.yaml``; a key given on the command line
still wins (``env=...`` plays that env instead).

Usage::

    python -m agentgym.eval env=sokoban                        # the env's solver
    python -m agentgym.eval env=frozen_lake agent=random episodes=20
    python -m agentgym.eval model.path=outputs/train/<run>     # a run's latest checkpoint
    python -m agentgym.eval env=sokoban model.path=DIR generation=hf
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from agentgym.builders.engines import generation_backend
from agentgym.builders.players import episode_players
from agentgym.builders.rollouts import env_rollout
from agentgym.command_line import open_mapping_overrides, register_env_configs, run_hydra
from agentgym.envs.adapter import make_text_env
from agentgym.envs.scripted import AGENTS
from agentgym.envs.text_env import TextEnv
from agentgym.errors import ConfigError, check_choice
from agentgym.models.tiny import build_tokenizer
from agentgym.rollout.backends import GenerationBackend
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.evaluation import evaluate
from agentgym.rollout.loop import RolloutResult
from agentgym.rollout.metrics import failure_report
from agentgym.rollout.render import dump_trajectories, render_trajectories
from agentgym.schema import TrainConfig, validate
from agentgym.trainers.checkpoint import latest_checkpoint
from agentgym.trainers.run_state import RUN_CONFIG

POLICIES = ("auto", "model", *AGENTS)

FALLBACKS = {
    "episodes": 50,
    "seed": 0,
    "rollout_mode": "trajectory",
    "history_length": 2,
    "max_turns": 30,
    "sequence_length": 4096,
    "prefix_check": "warn",
    "env": {"name": "sokoban", "kwargs": {}},
}
"""Eval's settings when neither the command line nor a training run gives them:
a model that no run of ours trained plays with its full history."""


def resolve_model(path: str) -> tuple[Path, dict[str, Any] | None]:
    """The model folder ``path`` names, and the saved config of the run it comes from.

    ``path`` may be a Hugging Face folder (inside a checkpoint or not), a
    checkpoint folder, or a run's ``output_dir`` (its latest checkpoint).

    Raises:
        ConfigError: If no model folder is found there.
    """
    folder = Path(path).expanduser()
    if (folder / "checkpoints").is_dir():
        latest = latest_checkpoint(folder / "checkpoints")
        folder = latest if latest is not None else folder
    if (folder / "model" / "config.json").is_file():
        folder = folder / "model"
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"model.path={path!r} is not a model folder (no config.json); pass a Hugging Face "
            "folder, a checkpoint, or a training run's output_dir (models are loaded from "
            "local folders, never downloaded)"
        )
    for candidate in (folder, folder.parent, folder.parent.parent.parent):
        if (candidate / RUN_CONFIG).is_file():
            return folder, yaml.safe_load((candidate / RUN_CONFIG).read_text())
    return folder, None


def eval_config(cfg: DictConfig, run: dict[str, Any] | None, given: set[str]) -> TrainConfig:
    """The settings to play with: the command line's, else the run's, else :data:`FALLBACKS`.

    Args:
        cfg: The composed eval config.
        run: The training run's saved config, if the model comes from one.
        given: The keys set on the command line.
    """
    base: dict[str, Any] = dict(run) if run else TrainConfig().model_dump()

    def pick(key: str, from_run: Any) -> Any:
        if key in given or run is None:
            value = OmegaConf.select(cfg, key)
            return FALLBACKS[key] if value is None and key in FALLBACKS else value
        return from_run

    env_given = any(k == "env" or k.startswith("env.") for k in given)
    env: dict[str, Any] = (
        OmegaConf.to_container(cfg.env, resolve=True)  # type: ignore[assignment]
        if "env" in cfg and (run is None or env_given)
        else (base["env"] if run else FALLBACKS["env"])
    )
    episodes = pick("episodes", base["val_batch_size"])
    envs: dict[str, Any] = {"tags": [env["name"]], "env_configs": {}, "n_groups": None}
    if run is not None and not env_given:  # every env the run validated on, as it did
        envs = {key: base["val_env_manager"][key] for key in envs}
        if sum(envs["n_groups"] or [episodes]) != episodes:  # other counts: an even split
            envs["n_groups"] = None
    generating = dict(base["actor_infer"]["generating_args"])
    for key in ("top_p", "top_k", "max_new_tokens"):
        value = cfg.generation.get(key)
        if f"generation.{key}" in given or (run is None and value is not None):
            generating[key] = value
    if run is None and cfg.generation.get("max_new_tokens") is None:
        generating["max_new_tokens"] = (env or {}).get("max_new_tokens") or 64
    temperature = pick("generation.temperature", base["validation"]["temperature"])
    settings = {
        **base,
        "env": env,
        "pretrain": None,
        "seed": pick("seed", base["seed"]),
        "max_turns": pick("max_turns", base["max_turns"]),
        "sequence_length": pick("sequence_length", base["sequence_length"]),
        "rollout_mode": pick("rollout_mode", base["rollout_mode"]),
        "history_length": pick("history_length", base["history_length"]),
        "prefix_check": pick("prefix_check", base["prefix_check"]),
        "render_save_dir": cfg.render_save_dir,
        "val_batch_size": episodes,
        "val_env_manager": {
            **base["val_env_manager"],
            **envs,
            "env_groups": episodes,
            "group_size": 1,
        },
        "validation": {
            **base["validation"],
            "temperature": 1.0 if temperature is None else temperature,
        },
        "generation": {
            **OmegaConf.to_container(cfg.generation, resolve=True),  # type: ignore[dict-item]
            "temperature": 1.0 if temperature is None else temperature,
            "max_new_tokens": generating["max_new_tokens"],
            "top_p": generating["top_p"],
            "top_k": generating["top_k"],
        },
        "actor_infer": {
            **base["actor_infer"],
            "generating_args": generating,
            # the run's vLLM engine arguments (the engine keeps those vLLM takes)
            "strategy_args": {
                "strategy_name": cfg.generation.backend,
                "strategy_config": (
                    (base["actor_infer"].get("strategy_args") or {}).get("strategy_config") or {}
                )
                if run
                else {},
            },
        },
    }
    return validate(settings, training=False)


def scripted_tokenizer(env: TextEnv) -> Any:
    """A small tokenizer for scripted agents, trained on the env's own text."""
    observation, _ = env.reset(seed=0)
    corpus = [env.instructions, observation] * 4
    template = "qwen2.5" if env.tools else "chatml"
    return build_tokenizer(corpus, vocab_size=400, chat_template=template)


def build_policy(
    cfg: DictConfig, config: TrainConfig, model: Path | None
) -> tuple[GenerationBackend, Any, str]:
    """The backend, its tokenizer, and a description of the policy."""
    agent = check_choice("agent", str(cfg.agent), POLICIES)
    if agent == "auto":
        agent = "model" if model is not None else "solver"
    if agent != "model":
        tokenizer = scripted_tokenizer(make_text_env(config.env.name, config.env.kwargs))
        return ScriptedBackend(tokenizer, agent, seed=config.seed), tokenizer, f"scripted {agent}"
    if model is None:
        raise ConfigError("agent=model needs model.path (a Hugging Face model folder)")
    from transformers import AutoTokenizer

    backend = generation_backend(config, model, dtype=cfg.model.dtype, device=cfg.model.device)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    return backend, tokenizer, f"model {model} on {config.backend_name}"


async def evaluate_envs(
    config: TrainConfig, backend: GenerationBackend, tokenizer: Any
) -> RolloutResult:
    """Play the validation episodes (group size 1, fixed seeds) as a run validates them
    (:func:`~agentgym.rollout.evaluation.evaluate`); the envs and the backend are closed
    after."""
    chat = ChatTokenizer(tokenizer)
    val = env_rollout(config, backend, chat, validation=True, players=episode_players(config))
    try:
        return (await evaluate(val)).result
    finally:
        val.manager.close()
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


def given_keys() -> set[str]:
    """The keys set on the command line (group choices included)."""
    return {item.split("=", 1)[0].lstrip("+~") for item in HydraConfig.get().overrides.task}


@dataclass(frozen=True)
class PolicyEvaluation:
    """What :func:`evaluate_policy` played.

    Attributes:
        config: The settings it played with.
        policy: A description of the policy.
        tokenizer: The policy's tokenizer.
        result: The episodes and their per-tag metrics.
    """

    config: TrainConfig
    policy: str
    tokenizer: Any
    result: RolloutResult


def evaluate_policy(
    cfg: DictConfig, model: Path | None, run_config: dict[str, Any] | None, given: set[str]
) -> PolicyEvaluation:
    """Settle the settings (:func:`eval_config`), build the policy and play the
    validation episodes: what ``python -m agentgym.eval`` does before it reports.

    Args:
        cfg: The composed eval config.
        model: The model folder (:func:`resolve_model`), or None for a scripted agent.
        run_config: The saved config of the training run the model comes from, if any.
        given: The keys set on the command line.
    """
    config = eval_config(cfg, run_config, given)
    if run_config is not None:
        envs = ", ".join(config.val_env_manager.tags)
        print(
            f"playing as the training run validated: env {envs}, "
            f"{config.rollout_mode} mode, history {config.history_length}, "
            f"{config.max_turns} turns, temperature {config.validation.temperature}, "
            f"{config.val_batch_size} episodes, seed {config.seed}"
        )
    backend, tokenizer, policy = build_policy(cfg, config, model)
    result = asyncio.run(evaluate_envs(config, backend, tokenizer))
    return PolicyEvaluation(config, policy, tokenizer, result)


def run(cfg: DictConfig) -> None:
    """Resolve the policy and the settings, play, report, render and dump."""
    model, run_config = resolve_model(cfg.model.path) if cfg.model.path else (None, None)
    played = evaluate_policy(cfg, model, run_config, given_keys())
    config, policy, tokenizer, result = (
        played.config,
        played.policy,
        played.tokenizer,
        played.result,
    )
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
        tokenizer_path = model
        if tokenizer_path is None:  # scripted agents' tokenizer is built on the fly: keep it
            tokenizer_path = Path(cfg.rollout_dump_dir) / "tokenizer"
            tokenizer.save_pretrained(tokenizer_path)
        meta = {
            "config": OmegaConf.to_container(cfg, resolve=True),
            "settings": config.model_dump(mode="json"),
            "tokenizer": str(tokenizer_path.resolve()),
            "policy": policy,
        }
        path = dump_trajectories(result.trajectories, cfg.rollout_dump_dir, meta=meta)
        print(f"dump: {path}")
    failures = failure_report(result.trajectories)
    if failures.failed == len(result.trajectories):  # nothing was evaluated: say why
        print(f"every episode failed; {failures.messages[0]}", file=sys.stderr)
        sys.exit(1)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m agentgym.eval [key=value ...]`` (``agentgym eval``): see
    ``configs/eval.yaml``; ``argv`` replaces the command line's arguments."""
    register_env_configs()  # env=<plugin name> works without a YAML file
    arguments = sys.argv[1:] if argv is None else argv
    run_hydra(run, "eval", open_mapping_overrides(arguments))  # env.kwargs.x=1 needs no '+'


if __name__ == "__main__":
    main()
