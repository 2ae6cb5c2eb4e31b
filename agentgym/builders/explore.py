"""``mode: explore``: an explorer's parts (envs, engines, the job's buffer and weight
channel, a tracker; no strategy); ``mode: serve``: a serving explorer's (engines, the
validation envs, the job's ends, a tracker)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from agentgym.builders.cluster import build_cluster
from agentgym.builders.engines import run_engines
from agentgym.builders.env_check import check_envs
from agentgym.builders.job import connect_to_job
from agentgym.builders.model import model_path
from agentgym.builders.players import episode_players
from agentgym.builders.rollouts import build_rollouts, env_rollout, rollout_config
from agentgym.builders.run_folder import open_run_folder
from agentgym.job.explorer import ExplorerParts, close_all
from agentgym.proxy.serve import ServeParts
from agentgym.rollout.backends.base import GenerationBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.source import Rollout
from agentgym.schema import TrainConfig
from agentgym.trainers.tracking import Tracker


def build_explorer(config: TrainConfig, resolved: dict[str, Any]) -> ExplorerParts:
    """``mode: explore``'s parts: the envs, the engines and a tracker (no strategy)."""
    check_envs(config)
    players = episode_players(config)
    floor = _explorer_floor(config, resolved, partial(build_rollouts, config, players=players))
    train, val = floor.rollouts
    assert train is not None
    job = connect_to_job(config)
    return ExplorerParts(
        name=config.explorer.name,
        job_dir=config.job_dir,
        buffer=job.buffer,
        weights=job.weights,
        train=train,
        val=val,
        tracker=floor.tracker,
        ratio=config.staleness_versions,
        schedule=config.sync_schedule,
        eval_steps=config.eval_steps,
        eval_on_startup=config.validation.on_startup,
        sync_timeout=config.synchronizer.sync_timeout,
        close=lambda: close_all(floor.closers),
    )


def build_server(config: TrainConfig, resolved: dict[str, Any]) -> ServeParts:
    """``mode: serve``'s parts: the engines, the validation envs (``eval_steps``), a
    tracker and the job's ends; no train envs (the agents bring their own)."""
    if config.eval_steps:
        check_envs(config)

    def validation(backend: Any, chat: ChatTokenizer, workers: Any) -> tuple[Rollout | None]:
        if not config.eval_steps:
            return (None,)
        return (env_rollout(config, backend, chat, validation=True, cluster=workers),)

    floor = _explorer_floor(config, resolved, validation)
    (val,) = floor.rollouts
    job = connect_to_job(config)
    agent = config.agent
    return ServeParts(
        name=config.explorer.name,
        job_dir=config.job_dir,
        buffer=job.buffer,
        weights=job.weights,
        backend=floor.backend,
        chat=floor.chat,
        config=rollout_config(config),
        val=val,
        tracker=floor.tracker,
        ratio=config.staleness_versions,
        group_size=config.train_env_manager.group_size,
        max_steps=config.max_steps,
        eval_steps=config.eval_steps,
        eval_on_startup=config.validation.on_startup,
        sync_timeout=config.synchronizer.sync_timeout,
        host=agent.host,
        port=agent.port,
        api_key=agent.api_key,
        timeout=agent.timeout,
        close=lambda: close_all(floor.closers),
    )


@dataclass
class _Floor:
    """What every explorer stands on: its engines, their chat template, its rollouts,
    a tracker, and the closers of all of it (engines' workers last)."""

    backend: GenerationBackend
    chat: ChatTokenizer
    rollouts: Sequence[Rollout | None]
    tracker: Tracker
    closers: list[Callable[[], Any]]


def _explorer_floor(
    config: TrainConfig,
    resolved: dict[str, Any],
    rollouts: Callable[[GenerationBackend, ChatTokenizer, Any], Sequence[Rollout | None]],
) -> _Floor:
    """Start the engines, then the rollouts ``rollouts`` makes on them, then the run
    folder's tracker (all of it closed again if any part fails)."""
    path = model_path(config)
    workers = build_cluster(config)
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    closers: list[Callable[[], Any]] = [workers.shutdown]
    try:
        backend = run_engines(config, path, output_dir, workers)
        chat = ChatTokenizer(AutoTokenizer.from_pretrained(str(path)))
        made = rollouts(backend, chat, workers)
        closers[:0] = [r.manager.close for r in made if r is not None]
        tracker = open_run_folder(
            config,
            resolved,
            meta={"model": str(path)},
            exp_name=f"{config.exp_name}-{config.explorer.name}",
        )
        closers.insert(0, tracker.close)
    except BaseException:
        close_all(closers)
        raise
    print(
        f"mode={config.mode}: explorer {config.explorer.name}, job folder {config.job_dir}; "
        f"generation backend: {config.backend_name}; model: {path}",
        flush=True,
    )
    return _Floor(backend, chat, made, tracker, closers)
