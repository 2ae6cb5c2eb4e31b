"""A decoupled job's parts (``mode: explore | train``): its experience buffer, its
weight channel, and the trainer's rollout source."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.job.buffer import ExperienceBuffer
from agentgym.job.buffer_source import BufferSource
from agentgym.job.published_weights import FolderChannel, WeightChannel, WeightPublisher
from agentgym.schema import TrainConfig

if TYPE_CHECKING:
    from agentgym.job.buffer import JobBuffer


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
        target = Path(given).expanduser() if given else config.job_dir
        if target.suffix != ".jsonl":  # a folder (as Trinity-RFT's file paths are)
            target = target / "experiences.jsonl"
        copy_to = target.absolute()
        given = str(copy_to.with_suffix(".sqlite"))
    path = Path(given or config.job_dir / "buffer.sqlite").expanduser().absolute()
    if storage == "queue":
        from agentgym.job.ray_job import RayExperienceBuffer  # imports ray: only for queue

        return RayExperienceBuffer(config.job_name, path, address=config.ray_address)
    return ExperienceBuffer(path, copy_to=copy_to)


def weight_channel(config: TrainConfig) -> WeightChannel:
    """Where the job's trainer publishes weights (``synchronizer.sync_method``): folders
    in the job folder (``checkpoint``), the job's Ray actor (``memory``), or the
    trainer's serving thread (``nccl``, its address in the job folder)."""
    if config.synchronizer.sync_method == "memory":
        from agentgym.job.ray_job import MemoryChannel  # imports ray: only for memory

        return MemoryChannel(config.job_name, address=config.ray_address)
    if config.synchronizer.sync_method == "nccl":
        from agentgym.job.collective_weights import (  # torch.distributed: only for nccl
            CollectiveChannel,
            collective_backend,
        )

        return CollectiveChannel(config.job_dir, backend=collective_backend())
    return FolderChannel(config.job_dir)


def trainer_source(
    config: TrainConfig,
    weights: Iterable[tuple[str, Any]] | None,
    *,
    resume_step: int | None = None,
) -> BufferSource:
    """``mode: train``'s rollout source: the job's experience buffer, each update
    published on the job's weight channel; a new run publishes the starting
    ``weights`` as version 0 (its explorers start from them), a resume from step ``S``
    publishes the checkpoint's as ``S`` (:meth:`BufferSource.send_weights`)."""
    channel = weight_channel(config)
    publisher = WeightPublisher(
        channel, groups_per_step=config.train_env_manager.env_groups, version=(resume_step or 0) - 1
    )
    if weights is not None:
        publisher.publish(0, weights)
    return BufferSource(
        experience_buffer(config),
        publisher,
        groups_per_step=config.train_env_manager.env_groups,
        ratio=config.staleness_versions,
        schedule=config.sync_schedule,
        last_step=config.max_steps,
        max_read_timeout=config.buffer.max_read_timeout,
        explorer_timeout=config.buffer.explorer_timeout,
    )
