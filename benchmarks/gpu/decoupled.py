"""A decoupled job's weight sync (issue 29): the trainer (this process) publishes the
sync shape's weights with ``sync_method=checkpoint`` and ``nccl``, an explorer (a
spawned process) loads each version onto its device; per sync, the trainer's publish
and the time until the explorer holds every tensor.

NCCL joins two ranks on two devices: with one visible GPU the ``nccl`` figures are
skipped (said in the row); the dry run sends the same bytes with gloo on the CPU.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from .runner import Context, Deadline

POLL_SECONDS = 0.005


def _channel(method: str, job: Path, backend: str, bucket_bytes: int) -> Any:
    from agentgym.job.collective_weights import CollectiveChannel
    from agentgym.job.published_weights import FolderChannel

    if method == "checkpoint":
        return FolderChannel(job)
    return CollectiveChannel(job, backend=backend, bucket_bytes=bucket_bytes, host="127.0.0.1")


def explorer(
    method: str, job: str, backend: str, bucket_bytes: int, device: str, syncs: int, out: Any
) -> None:
    """Load versions 1..``syncs`` as they appear; report each one's finish time (wall
    clock: the trainer is another process on this host) and bytes."""
    if device.startswith("cuda"):
        torch.cuda.set_device(1 if method == "nccl" else 0)
        device = f"cuda:{torch.cuda.current_device()}"
    channel = _channel(method, Path(job), backend, bucket_bytes)
    try:
        for version in range(1, syncs + 1):
            while (latest := channel.latest()) is None or latest.version < version:
                time.sleep(POLL_SECONDS)
            total = 0
            for _, tensor in channel.read(latest):
                total += tensor.to(device, non_blocking=True).numel() * tensor.element_size()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            out.put(("ok", version, time.time(), total))
    except Exception as error:  # reported, so that the trainer's side does not wait on
        out.put(("error", 0, 0.0, f"{type(error).__name__}: {error}"))


def _one_method(
    ctx: Context, deadline: Deadline, method: str, weights: dict[str, torch.Tensor]
) -> dict[str, float]:
    from agentgym.job.published_weights import WeightPublisher

    s = ctx.settings
    backend = "nccl" if s.device.startswith("cuda") else "gloo"
    syncs = max(2, min(s.max_reps, 5)) + 1  # the first is the warm-up
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    with tempfile.TemporaryDirectory(prefix=f"sync-{method}-", dir=ctx.work_dir) as job:
        channel = _channel(method, Path(job), backend, s.bucket_mb << 20)
        publisher = WeightPublisher(channel, groups_per_step=1)
        process = context.Process(
            target=explorer,
            args=(method, job, backend, s.bucket_mb << 20, s.device, syncs, out),
        )
        process.start()
        publish, total = [], []
        try:
            for version in range(1, syncs + 1):
                started_wall, started = time.time(), time.perf_counter()
                publisher.publish(version, weights.items())
                publish.append(time.perf_counter() - started)
                status, got, finished, size = out.get(timeout=max(deadline.left(), 60))
                if status != "ok":
                    raise RuntimeError(f"the explorer failed: {size}")
                assert got == version
                total.append(finished - started_wall)
        finally:
            process.join(30)
            if process.is_alive():
                process.kill()
            close = getattr(channel, "close", None)
            if close is not None:
                close()
    publish, total = publish[1:], total[1:]
    megabytes = size / 2**20
    median = sorted(total)[len(total) // 2]
    return {
        f"{method}_publish_s": sorted(publish)[len(publish) // 2],
        f"{method}_sync_s": median,
        f"{method}_mb_per_s": megabytes / median,
        "megabytes": megabytes,
    }


def decoupled_sync(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """Per sync of the sync shape's weights between separate processes: ``checkpoint``
    (a versioned folder, read back onto the explorer's device) and ``nccl`` (gloo on
    the CPU; skipped with one GPU)."""
    from agentgym.trainers.strategies.optim import OptimizerConfig
    from agentgym.trainers.strategies.torch_strategy import TorchStrategy

    s = ctx.settings
    trainer = TorchStrategy(
        ctx.model(s.sync_shape),
        dtype=s.dtype,
        device=s.device,
        optimizer=OptimizerConfig(learning_rate=1e-6),
    )
    weights = {name: tensor.detach() for name, tensor in trainer.export_weights()}
    figures: dict[str, Any] = _one_method(ctx, deadline, "checkpoint", weights)
    if s.device.startswith("cuda") and torch.cuda.device_count() < 2:
        figures["nccl"] = "skipped: NCCL needs a second GPU for the explorer"
    else:
        figures |= _one_method(ctx, deadline, "nccl", weights)
    figures["reps"] = float(max(2, min(s.max_reps, 5)))
    return figures
