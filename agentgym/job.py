"""A decoupled job (``mode: explore | train``): where its processes meet, its
experience buffer, its staleness bound, and the trainer's rollout source."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agentgym.config_checks import sync_schedule
from agentgym.rollout.buffer_source import BufferSource
from agentgym.rollout.experience_buffer import ExperienceBuffer
from agentgym.rollout.published_weights import FolderChannel, WeightChannel, WeightPublisher
from agentgym.rollout.source import RolloutSource
from agentgym.schema import TrainConfig

if TYPE_CHECKING:
    from agentgym.rollout.experience_buffer import JobBuffer


def job_dir(config: TrainConfig) -> Path:
    """A decoupled job's folder, where its processes meet:
    ``checkpoint_root_dir/project/name`` (``name`` defaults to ``exp_name``)."""
    return (
        Path(config.checkpoint_root_dir).expanduser()
        / config.project
        / (config.name or config.exp_name)
    )


def job_name(config: TrainConfig) -> str:
    """The job's name among a Ray cluster's jobs: ``project/name``."""
    return f"{config.project}/{config.name or config.exp_name}"


def experience_buffer(config: TrainConfig) -> JobBuffer:
    """The job's experience buffer: a SQLite file (``buffer.path``, else
    ``<job>/buffer.sqlite``) that this process opens (``storage_type: sql``) or that
    the job's Ray actor serves (``queue``; the path is then on the actor's node);
    ``file``: ``sql`` plus a JSONL copy of every group stored, for inspection
    (``buffer.path`` names the JSONL file or a folder for ``experiences.jsonl``,
    default the job folder; the database sits beside it as ``.sqlite``)."""
    storage, given = config.buffer.storage_type, config.buffer.path
    copy_to = None
    if storage == "file":
        target = Path(given).expanduser() if given else job_dir(config)
        if target.suffix != ".jsonl":  # a folder (as Trinity-RFT's file paths are)
            target = target / "experiences.jsonl"
        copy_to = target.absolute()
        given = str(copy_to.with_suffix(".sqlite"))
    path = Path(given or job_dir(config) / "buffer.sqlite").expanduser().absolute()
    if storage == "queue":
        from agentgym.rollout.ray_job import RayExperienceBuffer

        return RayExperienceBuffer(job_name(config), path, address=config.ray_address)
    return ExperienceBuffer(path, copy_to=copy_to)


def weight_channel(config: TrainConfig) -> WeightChannel:
    """Where the job's trainer publishes weights (``synchronizer.sync_method``): folders
    in the job folder (``checkpoint``), the job's Ray actor (``memory``), or the
    trainer's serving thread (``nccl``, its address in the job folder)."""
    if config.synchronizer.sync_method == "memory":
        from agentgym.rollout.ray_job import MemoryChannel

        return MemoryChannel(job_name(config), address=config.ray_address)
    if config.synchronizer.sync_method == "nccl":
        from agentgym.rollout.collective_weights import CollectiveChannel, collective_backend

        return CollectiveChannel(job_dir(config), backend=collective_backend())
    return FolderChannel(job_dir(config))


def staleness_versions(config: TrainConfig) -> float:
    """How many versions behind the weights it updates a trained sample may be in a
    decoupled job: ``async_generation_ratio`` where set, else what the sync schedule
    implies (``sync_interval + sync_offset - 1``: 0 for Trinity-RFT's defaults, where
    the explorer waits for each version)."""
    return config.async_generation_ratio or float(sync_schedule(config).implied_bound)


def buffer_source(config: TrainConfig, publisher: WeightPublisher) -> RolloutSource:
    """``mode: train``'s rollout source: the job's experience buffer."""
    return BufferSource(
        experience_buffer(config),
        publisher,
        groups_per_step=config.train_env_manager.env_groups,
        ratio=staleness_versions(config),
        schedule=sync_schedule(config),
        last_step=config.max_steps,
        max_read_timeout=config.buffer.max_read_timeout,
        explorer_timeout=config.buffer.explorer_timeout,
    )
