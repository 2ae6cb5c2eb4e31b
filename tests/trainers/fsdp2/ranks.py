"""What each spawned rank of the FSDP2 tests runs (importable by the children)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from agentgym.trainers.strategies.fsdp2.strategy import FSDP2Strategy
from tests.trainers.megatron.launch import Dealt
from tests.trainers.megatron.ranks import SETTINGS, grpo_config
from tests.trainers.test_update_path import ragged_batch

STEPS = (1, 2, 3)

CONFIGS: dict[int, dict[str, dict[str, Any]]] = {
    2: {
        "full": {},
        "full_keep_after_forward": {"reshard_after_forward": False},
        "full_offload": {"offload_policy": True},
        "full_units_recompute_one_reduction": {
            "wrap_policy": {"wrap_embeddings": True, "wrap_lm_output": True},
            "gradient_checkpointing": True,
            "reduce_scatter_during_grad_accumulation": False,
        },
    },
    4: {
        "full": {"reshard_after_forward": True},
        "hybrid_keep_after_forward": {"fsdp_size": 2, "reshard_after_forward": False},
        "hybrid_offload": {"fsdp_size": 2, "offload_policy": True, "reshard_after_forward": True},
    },
}
"""World size -> the runs that must equal the single-process torch strategy."""


def fsdp2(model_dir: Path, rank: int, world: int, **config: Any) -> Dealt:
    """The strategy behind the rank group's dealing (micro-batches, rows)."""
    return Dealt(FSDP2Strategy(model_dir, **SETTINGS, **config), rank, world)


def weights(strategy: Any) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in strategy.export_weights()}


def steps(strategy: Any, numbers: tuple[int, ...] = STEPS) -> tuple[list[Any], Any, Any]:
    """GRPO updates on ragged batches (seed = step - 1): the metrics, the logprobs of
    a batch under the result, and the exported weights."""
    from agentgym.trainers.updates import update_policy

    metrics = [update_policy(grpo_config(), strategy, ragged_batch(n - 1), n) for n in numbers]
    return metrics, strategy.logprobs(ragged_batch(7)), weights(strategy)


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages under ``tensors`` (a DTensor: its local shard's)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def memory(strategy: Any) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state."""
    params = list(strategy.model.parameters())
    state = [
        value
        for per_param in strategy.optimizer.state.values()
        for value in per_param.values()
        if isinstance(value, torch.Tensor)
    ]
    return {
        "parameters": storage_bytes(params),
        "gradients": storage_bytes([p.grad for p in params if p.grad is not None]),
        "optimizer": storage_bytes(state),
    }


def after_one_step(strategy: Any) -> dict[str, int]:
    """Memory after a step, with the gradients still held (zeroed only by the next)."""
    from agentgym.trainers.updates import update_policy

    config = grpo_config()
    update_policy(config, strategy, ragged_batch(0), 1)
    return memory(strategy)


def every_config(
    rank: int,
    world: int,
    model_dir: Path,
    out: Path,
    other: Path | None = None,
    tied_dir: Path | None = None,
) -> dict[str, Any]:
    """Each of :data:`CONFIGS` [world] for :data:`STEPS`; each rank's memory after a
    step; a checkpoint after step 1 (to ``out``) and steps 2, 3 resumed from it, and
    from ``other`` (a checkpoint written by another number of ranks)."""
    import torch.distributed as dist

    runs = {name: steps(fsdp2(model_dir, rank, world, **c)) for name, c in CONFIGS[world].items()}
    mine = after_one_step(fsdp2(model_dir, rank, world))
    per_rank: list[Any] = [None] * world
    dist.all_gather_object(per_rank, mine)
    saved = fsdp2(model_dir, rank, world)
    steps(saved, (1,))
    saved.save(out)
    resumed = {"same": resume(rank, world, model_dir, out)}
    if other is not None:
        resumed["other"] = resume(rank, world, model_dir, other)
    with_reference = fsdp2(model_dir, rank, world, reference_path=model_dir)
    reference = {
        "logprobs": with_reference.reference_logprobs(ragged_batch(7)),
        "bytes": storage_bytes(list(with_reference.reference.parameters())),
    }
    read = checkpoint_reads(rank, world, model_dir)
    tied = None if tied_dir is None else tied_run(rank, world, tied_dir, out.parent)
    return {
        "runs": runs,
        "memory": per_rank,
        "resumed": resumed,
        "reference": reference,
        "reads": read,
        "tied": tied,
    }


def tied_run(rank: int, world: int, tied_dir: Path, root: Path) -> dict[str, Any]:
    """Two updates of a model whose ``lm_head`` is its embedding (loaded on rank 0 and
    broadcast), whether each rank still holds one tied parameter and how many the
    optimizer steps, and a checkpoint saved after them."""
    import torch.distributed as dist

    strategy = fsdp2(tied_dir, rank, world)
    run = steps(strategy, (1, 2))
    model = strategy.model
    mine = {
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "optimized": sum(len(group["params"]) for group in strategy.optimizer.param_groups),
        "parameters": len(list(model.parameters())),
    }
    per_rank: list[Any] = [None] * world
    dist.all_gather_object(per_rank, mine)
    strategy.save(root / f"tied-{world}")
    return {"run": run, "ranks": per_rank}


def checkpoint_reads(rank: int, world: int, model_dir: Path) -> dict[str, list[int]]:
    """How many times each rank read the checkpoint (``from_pretrained``) to build the
    strategy, without and with CPU offload."""
    from unittest import mock

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    found = {}
    for name, config in (("sharded", {}), ("offload", {"offload_policy": True})):
        read = AutoModelForCausalLM.from_pretrained
        with mock.patch.object(AutoModelForCausalLM, "from_pretrained", wraps=read) as spy:
            fsdp2(model_dir, rank, world, **config)
        per_rank: list[Any] = [None] * world
        dist.all_gather_object(per_rank, spy.call_count)
        found[name] = per_rank
    return found


def resume(rank: int, world: int, model_dir: Path, checkpoint: Path) -> Any:
    """Steps 2 and 3 from ``checkpoint`` (taken after step 1)."""
    strategy = fsdp2(model_dir, rank, world)
    strategy.load(checkpoint)
    return steps(strategy, (2, 3))
