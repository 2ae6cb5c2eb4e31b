"""``mode: both | train``: the recipe's settings and parts from a checked config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from agentgym.builders.cluster import build_cluster
from agentgym.builders.engines import run_engines
from agentgym.builders.env_check import check_envs
from agentgym.builders.job import trainer_source
from agentgym.builders.model import model_path
from agentgym.builders.players import episode_players
from agentgym.builders.recipe import grpo_config, kl_controller
from agentgym.builders.rollouts import build_rollouts, rollout_source
from agentgym.builders.run_folder import open_run_folder
from agentgym.builders.strategies import critic_strategy, policy_strategy
from agentgym.registry import env_versions
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.source import Rollout, RolloutSource
from agentgym.schema import TrainConfig
from agentgym.trainers.grpo import TrainParts
from agentgym.trainers.recipe_config import GRPOConfig
from agentgym.trainers.rewards import RunningMoments


def build_train(
    config: TrainConfig,
    resolved: dict[str, Any],
    *,
    resume_run_id: str | None = None,
    resume_step: int | None = None,
) -> tuple[GRPOConfig, TrainParts]:
    """The recipe's settings and parts from a checked config: ``mode: both`` plays its
    own episodes (train and validation rollouts, the source ``async_generation_ratio``
    asks for); ``mode: train`` takes them from its job's buffer and publishes its
    weights for the explorers (no engine, no env is built).

    Args:
        config: The checked config.
        resolved: The same config as plain data (saved with the run, given to trackers).
        resume_run_id: The tracker run to continue (from the checkpoint resumed).
        resume_step: The step resumed from (later metrics lines are dropped).
    """
    check_envs(config)
    grpo = grpo_config(config)
    kl = kl_controller(grpo)
    path = model_path(config)
    workers = build_cluster(config)
    try:
        tags = dict.fromkeys([*config.train_env_manager.tags, *config.val_env_manager.tags])
        configs = {**config.val_env_manager.env_configs, **config.train_env_manager.env_configs}
        envs = env_versions([configs.get(tag, {}).get("name", tag) for tag in tags])
        strategy = policy_strategy(
            config, path, needs_reference=grpo.needs_reference, cluster=workers
        )
        # the critic's value head is seeded on its own (the global RNG is left as it was)
        critic = critic_strategy(config, path, workers) if config.adv_estimator == "gae" else None
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        output_dir = Path(config.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        train: Rollout | None = None
        val: Rollout | None = None
        if config.mode == "train":  # the explorers generate: weights go to the job folder
            weights = None if resume_step is not None else strategy.export_weights()
            source: RolloutSource = trainer_source(config, weights, resume_step=resume_step)
            print(f"mode=train: job folder {config.job_dir}; model: {path}", flush=True)
        else:
            backend = run_engines(config, path, output_dir, workers)
            print(f"generation backend: {config.backend_name}; model: {path}", flush=True)
            chat = ChatTokenizer(tokenizer)
            players = episode_players(config)
            train, val = build_rollouts(config, backend, chat, workers, players)
            source = rollout_source(config, train)
        tracker = open_run_folder(
            config,
            resolved,
            meta={"envs": envs, "model": str(path)},
            run_id=resume_run_id,
            resume_step=resume_step,
            total_steps=config.max_steps,
            header={"envs": envs},
        )
    except BaseException:
        workers.shutdown()
        raise
    parts = TrainParts(
        strategy=strategy,
        source=source,
        train=train,
        val=val,
        tracker=tracker,
        checkpoint_dir=config.checkpoint_dir,
        render_dir=Path(config.render_save_dir) if config.render_save_dir else None,
        dump_dir=Path(config.rollout_dump_dir) if config.rollout_dump_dir else None,
        meta={"config": resolved, "tokenizer": str(path), "envs": envs},
        pad_token_id=pad,
        cluster=workers,
        critic=critic,
        kl_controller=kl,
        reward_moments=RunningMoments(),
    )
    return grpo, parts
