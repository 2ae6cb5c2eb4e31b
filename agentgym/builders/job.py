"""A decoupled job's parts (``mode: explore | train``): its experience buffer, its
weight channel, and the trainer's rollout source."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.job.buffer import ExperienceBuffer
from agentgym.job.buffer_source import BufferSource
from agentgym.job.published_weights import FolderChannel, WeightChannel, WeightPublisher
from agentgym.schema import TrainConfig

if TYPE_CHECKING:
    from agentgym.job.buffer import JobBuffer


@dataclass(frozen=True)
class JobConnections:
    """A process's ends of its decoupled job.

    Attributes:
        buffer: The job's experience buffer.
        weights: Where the trainer publishes weights and explorers read them.
    """

    buffer: JobBuffer
    weights: WeightChannel


def connect_to_job(config: TrainConfig) -> JobConnections:
    """The job's experience buffer and weight channel, as this process reaches them.

    The buffer is a SQLite file (``buffer.path``, else ``<job>/buffer.sqlite``) that this
    process opens (``storage_type: sql``) or that the job's Ray actor serves (``queue``;
    the path is then on the actor's node); ``file``: ``sql`` plus a JSONL copy of every
    group stored, for inspection (``buffer.path`` names the JSONL file or a folder for
    ``experiences.jsonl``, default the job folder; the database sits beside it as
    ``.sqlite``). The weights go through folders in the job folder (``sync_method:
    checkpoint``), the job's Ray actor (``memory``), or the trainer's serving thread
    (``nccl``, its address in the job folder).
    """
    storage, given = config.buffer.storage_type, config.buffer.path
    method = config.synchronizer.sync_method
    copy_to = None
    if storage == "file":
        target = Path(given).expanduser() if given else config.job_dir
        if target.suffix != ".jsonl":  # a folder (as Trinity-RFT's file paths are)
            target = target / "experiences.jsonl"
        copy_to = target.absolute()
        given = str(copy_to.with_suffix(".sqlite"))
    path = Path(given or config.job_dir / "buffer.sqlite").expanduser().absolute()
    ray_buffer: JobBuffer | None = None
    ray_weights: WeightChannel | None = None
    if storage == "queue" or method == "memory":
        from agentgym.job.ray_job import job_actors  # imports ray: only for its actors

        ray_buffer, ray_weights = job_actors(
            config.job_name,
            address=config.ray_address,
            buffer_path=path if storage == "queue" else None,
            weights=method == "memory",
        )
    buffer = ray_buffer or ExperienceBuffer(path, copy_to=copy_to)
    if ray_weights is not None:
        return JobConnections(buffer, ray_weights)
    if method == "nccl":
        from agentgym.job.collective_weights import (  # torch.distributed: only for nccl
            CollectiveChannel,
            collective_backend,
        )

        return JobConnections(
            buffer, CollectiveChannel(config.job_dir, backend=collective_backend())
        )
    return JobConnections(buffer, FolderChannel(config.job_dir))


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
    job = connect_to_job(config)
    publisher = WeightPublisher(
        job.weights,
        groups_per_step=config.train_env_manager.env_groups,
        version=(resume_step or 0) - 1,
    )
    if weights is not None:
        publisher.publish(0, weights)
    return BufferSource(
        job.buffer,
        publisher,
        groups_per_step=config.train_env_manager.env_groups,
        ratio=config.staleness_versions,
        schedule=config.sync_schedule,
        last_step=config.max_steps,
        max_read_timeout=config.buffer.max_read_timeout,
        explorer_timeout=config.buffer.explorer_timeout,
    )
