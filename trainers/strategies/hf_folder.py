"""Hugging Face model folders: the one place that writes and reads their weights.

A folder written by ``save_pretrained`` holds ``model.safetensors``, or, past
``max_shard_size``, ``model-0000i-of-0000n.safetensors`` shards with a
``model.safetensors.index.json``; a model whose output layer shares the input
embedding (``tie_word_embeddings``) stores the shared tensor once, so
``lm_head.weight`` is absent from the files. :func:`load_weights` takes every
layout and checks that each tensor of the model was either read or is tied to
one that was.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

MAX_SHARD_SIZE = "5GB"
"""The largest weights file :func:`save_model` writes (Hugging Face's shard size)."""

SAFE_INDEX = "model.safetensors.index.json"
TORCH_INDEX = "pytorch_model.bin.index.json"

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""A source folder with one of these has a tokenizer to copy (with its chat template)."""

UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9}


def size_bytes(size: str) -> int:
    """``"5GB"`` -> 5 * 10**9 (Hugging Face's units)."""
    for unit, factor in UNITS.items():
        if size.upper().endswith(unit):
            return int(float(size[: -len(unit)]) * factor)
    return int(size)


def save_model(model: Any, directory: Path, *, tokenizer_from: Path | None = None) -> None:
    """Write ``model`` (a ``PreTrainedModel``) as a Hugging Face folder, sharded past
    :data:`MAX_SHARD_SIZE`, with the tokenizer (and chat template) of ``tokenizer_from``."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, max_shard_size=MAX_SHARD_SIZE)
    if tokenizer_from is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(directory)


def write_streamed(
    folder: Path,
    tensors: Iterator[tuple[str, torch.Tensor]],
    *,
    model: Any,
    tokenizer_from: Path | None = None,
    shard_bytes: int | None = None,
) -> None:
    """A complete Hugging Face folder from ``tensors`` taken one at a time (never the
    whole model in memory at once): safetensors files of at most ``shard_bytes``
    (default :data:`MAX_SHARD_SIZE`; past one, ``model.safetensors.index.json``),
    a tied tensor of ``model`` stored once, ``model``'s config and generation config,
    and the tokenizer (with its chat template) of ``tokenizer_from`` when it has one.

    Args:
        folder: Where to write (created).
        tensors: ``(Hugging Face name, tensor)`` pairs, as ``export_weights`` yields them.
        model: The ``PreTrainedModel`` whose names, config and tied tensors these are.
        tokenizer_from: A folder whose tokenizer to copy.
        shard_bytes: The largest weights file.
    """
    from safetensors.torch import save_file

    limit = size_bytes(MAX_SHARD_SIZE) if shard_bytes is None else shard_bytes
    aliases = tied_aliases(model)
    bucket: dict[str, torch.Tensor] = {}
    size = total = 0
    names: list[list[str]] = []
    folder.mkdir(parents=True, exist_ok=True)

    def flush() -> None:
        save_file(bucket, str(folder / f"part-{len(names)}.safetensors"))
        names.append(list(bucket))

    for name, tensor in tensors:
        if name in aliases:
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit:
            flush()
            bucket, size = {}, 0
        bucket[name] = tensor.detach().to("cpu", copy=True).contiguous()
        size += nbytes
        total += nbytes
    flush()
    _name_shards(folder, names, total)
    model.config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    if tokenizer_from is not None and any(
        (tokenizer_from / name).is_file() for name in TOKENIZER_FILES
    ):
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(folder)


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


def weight_files(directory: Path) -> list[Path]:
    """The weights files of a Hugging Face folder, in its index's order.

    Raises:
        FileNotFoundError: Naming the folder and the files it holds, when it has none.
    """
    for index in (SAFE_INDEX, TORCH_INDEX):
        if (directory / index).is_file():
            shards = json.loads((directory / index).read_text())["weight_map"].values()
            return [directory / name for name in dict.fromkeys(shards)]
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (directory / single).is_file():
            return [directory / single]
    held = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
    raise FileNotFoundError(
        f"{directory} holds no model weights (model.safetensors, its shards with "
        f"{SAFE_INDEX}, or pytorch_model.bin); it holds {held or 'nothing'}"
    )


def read_weights(directory: Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Every tensor stored in a Hugging Face folder by name, from all its shards."""
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for file in weight_files(directory):
        if file.suffix == ".safetensors":
            weights.update(load_file(str(file), device=str(device)))
        else:
            weights.update(torch.load(file, map_location=device, weights_only=True))
    return weights


class StoredWeights(Mapping[str, torch.Tensor]):
    """A Hugging Face folder's tensors by name, each read from its file when asked:
    of safetensors shards only the tensors a caller takes are in memory (a rank that
    builds one pipeline stage, or one tensor-parallel shard at a time, needs a part of
    the model, not all of it once per rank); a ``.bin`` shard is read whole, once."""

    def __init__(self, directory: Path) -> None:
        from safetensors import safe_open

        self._files: dict[str, Any] = {}  # name -> its open safetensors file, or .bin dict
        for file in weight_files(directory):
            if file.suffix == ".safetensors":
                opened = safe_open(str(file), framework="pt")
            else:
                opened = torch.load(file, map_location="cpu", weights_only=True)
            for name in opened.keys():  # noqa: SIM118 (safe_open has no __iter__)
                self._files[name] = opened

    def __getitem__(self, name: str) -> torch.Tensor:
        held = self._files[name]
        return held[name] if isinstance(held, dict) else held.get_tensor(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)


def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """``{name: the first name of the same tensor}`` for every tensor the model
    holds under two names (``lm_head.weight`` of a tied model, say)."""
    first: dict[int, str] = {}
    aliases = {}
    named: Iterable[tuple[str, torch.Tensor]] = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    for name, tensor in named:
        owner = first.setdefault(id(tensor), name)
        if owner != name:
            aliases[name] = owner
    return aliases


def load_weights(model: torch.nn.Module, directory: Path, *, device: str | torch.device) -> None:
    """Load a Hugging Face folder's weights into ``model`` in place.

    Raises:
        ValueError: When the folder lacks a tensor of the model that is not tied to
            one it holds, or holds one the model does not have (naming them).
    """
    weights = read_weights(directory, device=device)
    aliases = tied_aliases(model)
    for name, owner in aliases.items():  # a tied tensor may be stored under either name
        if owner not in weights and name in weights:
            weights[owner] = weights.pop(name)
        weights.pop(name, None)
    own = model.state_dict()
    missing = [name for name in own if name not in weights and name not in aliases]
    unexpected = [name for name in weights if name not in own]
    resized = [
        f"{name} {tuple(tensor.shape)} (the model's: {tuple(own[name].shape)})"
        for name, tensor in weights.items()
        if name in own and tensor.shape != own[name].shape
    ]
    if missing or unexpected or resized:
        raise ValueError(
            f"{directory} does not match the model: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, other shapes {resized[:5]} (was it saved from another model?)"
        )
    model.load_state_dict(weights, strict=False)
