"""Checkpoints of the Megatron strategy: a Hugging Face folder for people and engines,
megatron-core's distributed checkpoint (model and optimizer shards) for resuming."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}
"""The distributed optimizer's shards saved as they lie (each rank its own, no
gathering; resharding only over DP). megatron-core 0.16's default format fails
its own check on CPU (``ShardedTensor.flattened_range is not supported``)."""


def _sharded(strategy: MegatronStrategy, *, is_loading: bool) -> dict[str, object]:
    model = strategy.model.sharded_state_dict()
    return {
        "model": model,
        "optimizer": strategy.optimizer.sharded_state_dict(
            model, is_loading=is_loading, metadata=OPTIMIZER_METADATA
        ),
    }


def save(strategy: MegatronStrategy, directory: Path) -> None:
    """Every rank: its shards under ``megatron/``; rank 0: ``model/`` (Hugging Face
    weights, config, tokenizer) and ``megatron.json`` (the step count, and whether
    the optimizer has stepped: a checkpoint taken before its first step, as when no
    sample was kept, resumes with a fresh optimizer)."""
    from megatron.core import dist_checkpointing
    from safetensors.torch import save_file

    directory = Path(directory)
    keep = dist.get_rank() == 0  # every rank takes part in the export (it is collective)
    weights = {
        name: tensor.detach().to("cpu", copy=True).contiguous()
        for name, tensor in strategy.export_weights()
        if keep
    }  # host copies on rank 0 alone: a whole model beside each GPU's shards would not fit
    with device_mode(), torch.no_grad():
        fresh = _ensure_optimizer_state(strategy.optimizer)  # its sharded state needs tensors
    if dist.get_rank() == 0:
        (directory / "model").mkdir(parents=True, exist_ok=True)
        save_file(weights, str(directory / "model" / "model.safetensors"))
        weights.clear()
        for name in HF_FILES:
            if (strategy.model_path / name).exists():
                shutil.copy(strategy.model_path / name, directory / "model" / name)
        (directory / "megatron").mkdir(parents=True, exist_ok=True)
        meta = {"step": strategy.step, "optimizer_stepped": not fresh}
        (directory / "megatron.json").write_text(json.dumps(meta))
    dist.barrier()
    with device_mode():
        dist_checkpointing.save(_sharded(strategy, is_loading=False), str(directory / "megatron"))
    if fresh:
        _clear_optimizer_state(strategy.optimizer)
    dist.barrier()


def _ensure_optimizer_state(optimizer: Any) -> bool:
    """Give a fresh optimizer its (zero) state: megatron-core's sharded state dict
    needs the tensors to save or load into, and without Apex or Transformer Engine it
    reads Adam's ``step``. A step at learning rate 0 on zero gradients moves no weight.
    Returns whether the optimizer was fresh."""
    fresh = False
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_optimizer = inner.optimizer
        if torch_optimizer.state:
            continue
        fresh = True
        saved = [group["lr"] for group in torch_optimizer.param_groups]
        for group in torch_optimizer.param_groups:
            group["lr"] = 0.0
            for param in group["params"]:
                param.grad = torch.zeros_like(param)
        torch_optimizer.step()
        torch_optimizer.zero_grad(set_to_none=True)
        for group, lr in zip(torch_optimizer.param_groups, saved, strict=True):
            group["lr"] = lr
    return fresh


def _clear_optimizer_state(optimizer: Any) -> None:
    """Back to a fresh optimizer: Adam's next step is its first (Apex's and Transformer
    Engine's FusedAdam, which megatron-core takes where installed, count their steps in
    the parameter groups, torch's Adam in the per-parameter state)."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner.optimizer.state.clear()
        for group in inner.optimizer.param_groups:
            group.pop("step", None)


def _unshare_adam_steps(optimizer: Any) -> None:
    """Give each parameter its own Adam ``step`` tensor. Without Apex or Transformer
    Engine, megatron-core's distributed optimizer loads one shared ``step`` tensor into
    every parameter's state, and torch's Adam then adds 1 to it once per parameter,
    so the resumed step's bias correction used a step count far too large."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        for state in inner.optimizer.state.values():
            if "step" in state:
                state["step"] = state["step"].clone()


def load(strategy: MegatronStrategy, directory: Path) -> None:
    """Restore the model and optimizer shards and the step count, in place."""
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    with device_mode(), torch.no_grad():
        _ensure_optimizer_state(strategy.optimizer)
        state = dist_checkpointing.load(
            _sharded(strategy, is_loading=True), str(directory / "megatron")
        )
        strategy.model.load_state_dict(state["model"])
        strategy.optimizer.load_state_dict(state["optimizer"])
        _unshare_adam_steps(strategy.optimizer)
    meta = json.loads((directory / "megatron.json").read_text())
    if not meta.get("optimizer_stepped", True):
        _clear_optimizer_state(strategy.optimizer)
    strategy.step = int(meta["step"])
