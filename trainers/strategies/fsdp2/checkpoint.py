"""Checkpoints of the FSDP2 strategy: each rank's shards of the model and optimizer
with ``torch.distributed.checkpoint`` (a resume may use another number of ranks), and
a complete Hugging Face folder written tensor by tensor (never the whole model in
memory at once: safetensors shards of at most ``MAX_SHARD_SIZE``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from agentgym.trainers.strategies.hf_folder import MAX_SHARD_SIZE, SAFE_INDEX, tied_aliases

if TYPE_CHECKING:
    from agentgym.trainers.strategies.fsdp2.strategy import FSDP2Strategy

SHARDS = "fsdp2"
"""The folder of the ranks' shards (``torch.distributed.checkpoint``'s format)."""

STATE = "fsdp2.json"
"""The schedule's state and whether the optimizer had stepped (rank 0 writes it)."""

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""A source folder with one of these has a tokenizer to copy (with its chat template)."""

UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9}


def size_bytes(size: str) -> int:
    """``"5GB"`` -> 5 * 10**9 (Hugging Face's units)."""
    for unit, factor in UNITS.items():
        if size.upper().endswith(unit):
            return int(float(size[: -len(unit)]) * factor)
    return int(size)


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
    strategy: FSDP2Strategy, folder: Path, *, shard_bytes: int = size_bytes(MAX_SHARD_SIZE)
) -> None:
    """A complete Hugging Face folder of the policy: weights gathered one tensor at a
    time and written by rank 0 in safetensors files of at most ``shard_bytes`` (with
    ``model.safetensors.index.json`` past one), a tied output layer stored once, the
    config and the tokenizer (with its chat template). Collective."""
    from safetensors.torch import save_file

    writer = dist.get_rank() == 0
    aliases = tied_aliases(strategy.model)
    bucket: dict[str, torch.Tensor] = {}
    size = total = 0
    names: list[list[str]] = []
    folder.mkdir(parents=True, exist_ok=True)

    def flush() -> None:
        save_file(bucket, str(folder / f"part-{len(names)}.safetensors"))
        names.append(list(bucket))

    for name, tensor in strategy.export_weights():
        if name in aliases or not writer:
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > shard_bytes:
            flush()
            bucket, size = {}, 0
        bucket[name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += nbytes
        total += nbytes
    if writer:
        flush()
        _name_shards(folder, names, total)
        strategy.model.config.save_pretrained(folder)
        if getattr(strategy.model, "generation_config", None) is not None:
            strategy.model.generation_config.save_pretrained(folder)
        if any((strategy.model_path / name).is_file() for name in TOKENIZER_FILES):
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(str(strategy.model_path)).save_pretrained(folder)
    dist.barrier()


def _name_shards(folder: Path, names: list[list[str]], total: int) -> None:
    """Rename ``part-i`` files as Hugging Face names them, with the index past one."""
    if len(names) == 1:
        (folder / "part-0.safetensors").replace(folder / "model.safetensors")
        return
    weight_map: dict[str, str] = {}
    for index, tensors in enumerate(names):
        final = f"model-{index + 1:05d}-of-{len(names):05d}.safetensors"
        (folder / f"part-{index}.safetensors").replace(folder / final)
        weight_map |= dict.fromkeys(tensors, final)
    index_file = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / SAFE_INDEX).write_text(json.dumps(index_file, indent=2))
