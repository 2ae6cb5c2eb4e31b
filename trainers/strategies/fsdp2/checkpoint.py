"""Checkpoints of the FSDP2 strategy: each rank's shards of the model and optimizer
with ``torch.distributed.checkpoint`` (a resume may use another number of ranks), and
a complete Hugging Face folder written tensor by tensor (never the whole model in
memory at once: safetensors shards of at most ``MAX_SHARD_SIZE``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch.distributed as dist

from agentgym.trainers.strategies.hf_folder import write_streamed

if TYPE_CHECKING:
    from agentgym.trainers.strategies.fsdp2.strategy import FSDP2Strategy

SHARDS = "fsdp2"
"""The folder of the ranks' shards (``torch.distributed.checkpoint``'s format)."""

STATE = "fsdp2.json"
"""The schedule's state and whether the optimizer had stepped (rank 0 writes it)."""


def save(strategy: FSDP2Strategy, directory: Path) -> None:
    """Every rank: its shards under :data:`SHARDS`; rank 0: ``model/`` (Hugging Face
    weights, config, tokenizer) and :data:`STATE`. A checkpoint taken before the first
    optimizer step (as when no sample was kept) resumes with a fresh optimizer."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    fresh = not strategy.optimizer.state
    model, optimizer = get_state_dict(strategy.model, strategy.optimizer)
    dcp.save({"model": model, "optimizer": optimizer}, checkpoint_id=str(directory / SHARDS))
    if fresh:  # get_state_dict gave it a zero state with step 1: Adam's next step is its first
        strategy.optimizer.state.clear()
    write_hf_folder(strategy, directory / "model")
    if dist.get_rank() == 0:
        state = {"scheduler": strategy.scheduler.state_dict(), "optimizer_stepped": not fresh}
        (directory / STATE).write_text(json.dumps(state))
    dist.barrier()


def load(strategy: FSDP2Strategy, directory: Path) -> None:
    """Restore the shards (resharded to this run's ranks) and the schedule, in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, optimizer = get_state_dict(strategy.model, strategy.optimizer)
    dcp.load({"model": model, "optimizer": optimizer}, checkpoint_id=str(directory / SHARDS))
    set_state_dict(
        strategy.model, strategy.optimizer, model_state_dict=model, optim_state_dict=optimizer
    )
    saved = json.loads((directory / STATE).read_text())
    if not saved["optimizer_stepped"]:
        strategy.optimizer.state.clear()
    strategy.scheduler.load_state_dict(saved["scheduler"])


def write_hf_folder(
    strategy: FSDP2Strategy, folder: Path, *, shard_bytes: int | None = None
) -> None:
    """A complete Hugging Face folder of the policy (:func:`~.hf_folder.write_streamed`):
    weights gathered one tensor at a time, written by rank 0. Collective."""
    tensors = strategy.export_weights()
    if dist.get_rank() == 0:
        write_streamed(
            folder,
            tensors,
            model=strategy.model,
            tokenizer_from=strategy.model_path,
            shard_bytes=shard_bytes,
        )
    else:
        for _ in tensors:  # every rank takes part in each gather
            pass
    dist.barrier()
