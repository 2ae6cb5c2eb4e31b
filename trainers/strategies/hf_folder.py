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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

MAX_SHARD_SIZE = "5GB"
"""The largest weights file :func:`save_model` writes (Hugging Face's shard size)."""

SAFE_INDEX = "model.safetensors.index.json"
TORCH_INDEX = "pytorch_model.bin.index.json"


def save_model(model: Any, directory: Path, *, tokenizer_from: Path | None = None) -> None:
    """Write ``model`` (a ``PreTrainedModel``) as a Hugging Face folder, sharded past
    :data:`MAX_SHARD_SIZE`, with the tokenizer (and chat template) of ``tokenizer_from``."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, max_shard_size=MAX_SHARD_SIZE)
    if tokenizer_from is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(directory)


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
