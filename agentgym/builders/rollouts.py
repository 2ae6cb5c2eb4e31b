"""Env managers, the :class:`~agentgym.rollout.source.Rollout` bundles of a mode (train
and validation), and the train rollout source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym.cluster import Cluster
from agentgym.config_sections import EnvManagerSection, GeneratingArgs
from agentgym.rollout.backends import GenerationBackend, SamplingParams
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.dump import DumpingSource, ReplaySource
from agentgym.rollout.env_manager import EnvConfig, EnvManager
from agentgym.rollout.loop import PlayerFactory, RolloutConfig
from agentgym.rollout.source import AheadSource, Rollout, RolloutSource, SyncSource
from agentgym.schema import TrainConfig


def sampling_params(args: GeneratingArgs, *, temperature: float, seed: int) -> SamplingParams:
    """The engine's sampling parameters from ROLL's ``generating_args``."""
    return SamplingParams(
        temperature=temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        seed=seed,
        stop_strings=tuple(args.stop_strings),
    )


def rollout_config(config: TrainConfig, *, validation: bool = False) -> RolloutConfig:
    """How the train (or validation) episodes are collected."""
    args = config.actor_infer.generating_args
    temperature = config.validation.temperature if validation else args.temperature
    return RolloutConfig(
        mode=config.rollout_mode,
        max_turns=config.max_turns,
        sequence_length=config.sequence_length,
        sampling=sampling_params(args, temperature=temperature, seed=config.seed + validation),
        history_length=config.history_length,
        prefix_check=config.prefix_check,
        record_frames=validation and bool(config.render_save_dir),
        generate_opt_level=config.generate_opt_level,
    )


def env_manager(
    section: EnvManagerSection,
    config: TrainConfig,
    *,
    cluster: Cluster | None = None,
    **kwargs: Any,
) -> EnvManager:
    """An :class:`EnvManager` from a ``*_env_manager`` section (ROLL's keys).

    On a Ray cluster the envs live in env-worker actors (``max_env_num_per_worker``
    each; unset: one worker per node); in this process they are stepped in
    threads, or, with ``max_env_num_per_worker`` set, by env workers behind
    local handles (the same classes, for debugging).
    """
    env_configs: dict[str, EnvConfig | Any] = dict(section.env_configs)
    for tag in section.tags:
        env_configs.setdefault(tag, EnvConfig(tag, dict(config.env.kwargs)))
    if cluster is not None and cluster.kind == "local" and not section.max_env_num_per_worker:
        cluster = None
    if cluster is not None:
        kwargs |= {"cluster": cluster, "max_env_num_per_worker": section.max_env_num_per_worker}
    return EnvManager(
        tags=section.tags,
        env_groups=section.env_groups,
        group_size=section.group_size,
        n_groups=section.n_groups,
        env_configs=env_configs,
        seed=config.seed,
        max_traj_per_env=section.max_traj_per_env,
        format_penalty=section.format_penalty,
        **kwargs,
    )


def env_rollout(
    config: TrainConfig,
    backend: GenerationBackend,
    chat: ChatTokenizer,
    *,
    validation: bool = False,
    cluster: Cluster | None = None,
    players: PlayerFactory | None = None,
) -> Rollout:
    """The train episodes: ``train_env_manager``'s envs (with ROLL's extra groups when
    ``is_use_additional_prompts``), the train sampling; or, with ``validation``,
    ``val_env_manager``'s envs on fixed seeds (with frames for renders when
    ``render_save_dir`` is set), the validation sampling."""
    if validation:
        section = config.val_env_manager
        options: dict[str, Any] = {
            "fixed_seeds": True,
            "render_mode": "rgb_array" if config.render_save_dir else None,
        }
    else:
        section = config.train_env_manager
        extra = config.max_additional_running_prompts if config.is_use_additional_prompts else 0
        options = {"additional_groups": extra}
    manager = env_manager(section, config, cluster=cluster, **options)
    return Rollout(manager, backend, chat, rollout_config(config, validation=validation), players)


def rollout_source(config: TrainConfig, train: Rollout) -> RolloutSource:
    """The source ``async_generation_ratio`` asks for: 0 plays each step's batch when
    asked (:class:`~agentgym.rollout.source.SyncSource`), k > 0 up to k steps ahead
    (:class:`~agentgym.rollout.source.AheadSource`); with ``rollout_mock`` on, its
    batches dumped, or the dump's batches replayed instead (:mod:`agentgym.rollout.dump`).
    """
    mock = config.rollout_mock
    if mock.enable:
        folder = Path(mock.dump_dir or Path(config.output_dir) / "rollout_dump").expanduser()
        if mock.mode == "mock":
            return ReplaySource(train, folder, rollout_fingerprint(config))
    source: RolloutSource = SyncSource(train)
    if config.async_generation_ratio > 0:
        source = AheadSource(
            train, ratio=config.async_generation_ratio, partial=config.partial_rollout
        )
    if mock.enable:
        return DumpingSource(source, folder, rollout_fingerprint(config))
    return source


FINGERPRINT_KEYS = (
    "env", "seed", "train_env_manager", "rollout_batch_size", "max_turns", "sequence_length",
    "rollout_mode", "history_length", "pretrain", "model.tiny", "model.warm_start",
    "actor_infer.generating_args", "agent.kind", "agent.runner", "async_generation_ratio",
)  # fmt: skip
"""The keys that decide a step's batch: a dump replays only where they are equal (the
rest, how the batch is trained, may differ)."""


def rollout_fingerprint(config: TrainConfig) -> dict[str, Any]:
    """:data:`FINGERPRINT_KEYS`' values in ``config``."""
    data = config.model_dump(mode="json")
    values: dict[str, Any] = {}
    for key in FINGERPRINT_KEYS:
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        values[key] = node
    return values


def build_rollouts(
    config: TrainConfig,
    backend: GenerationBackend,
    chat: ChatTokenizer,
    cluster: Cluster,
    players: PlayerFactory | None,
) -> tuple[Rollout, Rollout | None]:
    """A mode's train and validation episodes on ``backend``, played by ``players``
    (:func:`~agentgym.builders.players.episode_players`; no validation envs when
    ``eval_steps`` is 0: nothing would play them)."""
    train = env_rollout(config, backend, chat, cluster=cluster, players=players)
    if not config.eval_steps:
        return train, None
    val = env_rollout(config, backend, chat, validation=True, cluster=cluster, players=players)
    return train, val
