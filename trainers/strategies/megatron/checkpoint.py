"""Checkpoints of the Megatron strategy: a Hugging Face folder for people and engines,
megatron-core's distributed checkpoint (model and optimizer shards) for resuming."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from agentgym.trainers.strategies.megatron.cpu import device_mode

if TYPE_CHECKING:
    from agentgym.trainers.strategies.megatron.strategy import MegatronStrategy

HF_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
"""Files of the source folder copied next to the saved weights."""


def _sharded(strategy: MegatronStrategy, *, is_loading: bool) -> dict[str, object]:
    model = strategy.model.sharded_state_dict()  # type: ignore[operator]
    return {
        "model": model,
        "optimizer": strategy.optimizer.sharded_state_dict(model, is_loading=is_loading),
    }


def save(strategy: MegatronStrategy, directory: Path) -> None:
    """Every rank: its shards under ``megatron/``; rank 0: ``model/`` (Hugging Face
    weights, config, tokenizer) and ``megatron.json`` (the step count)."""
    from megatron.core import dist_checkpointing
    from safetensors.torch import save_file

    directory = Path(directory)
    weights = {
        name: tensor.detach().clone().contiguous() for name, tensor in strategy.export_weights()
    }
    if dist.get_rank() == 0:
        (directory / "model").mkdir(parents=True, exist_ok=True)
        save_file(weights, str(directory / "model" / "model.safetensors"))
        for name in HF_FILES:
            if (strategy.model_path / name).exists():
                shutil.copy(strategy.model_path / name, directory / "model" / name)
        (directory / "megatron").mkdir(parents=True, exist_ok=True)
        (directory / "megatron.json").write_text(json.dumps({"step": strategy.step}))
    dist.barrier()
    with device_mode():
        dist_checkpointing.save(_sharded(strategy, is_loading=False), str(directory / "megatron"))
    dist.barrier()


def load(strategy: MegatronStrategy, directory: Path) -> None:
    """Restore the model and optimizer shards and the step count, in place."""
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    with device_mode(), torch.no_grad():
        state = dist_checkpointing.load(
            _sharded(strategy, is_loading=True), str(directory / "megatron")
        )
        strategy.model.load_state_dict(state["model"])
        strategy.optimizer.load_state_dict(state["optimizer"])
    strategy.step = int(json.loads((directory / "megatron.json").read_text())["step"])
