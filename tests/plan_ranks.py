"""What each spawned rank of tests/test_plan.py runs: the Megatron strategy in several
layouts, one training step each, and the bytes its parameters, gradients and optimizer
state occupy on this rank; and the activation peak of a memory profile of a step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages under ``tensors`` (views of one buffer count once)."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def optimizer_tensors(optimizer: Any) -> list[torch.Tensor]:
    """Adam's moments and, for half-precision weights, the fp32 main copies megatron-core
    keeps outside ``state`` (0-dim step counters left out)."""
    tensors: list[torch.Tensor] = []
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        for per_param in part.optimizer.state.values():
            tensors += [v for v in per_param.values() if isinstance(v, torch.Tensor) and v.dim()]
        for name in ("fp32_from_float16_groups", "shard_fp32_from_float16_groups"):
            for group in getattr(part, name, None) or []:
                tensors += [t for t in group if t is not None]
    return tensors


def megatron_memory(strategy: Any) -> dict[str, int]:
    """This rank's bytes of weights, gradients (megatron-core's ``main_grad`` buffer) and
    optimizer state, and its place in the groups."""
    params = list(strategy.model.parameters())
    groups = strategy.groups
    return {
        "weights": storage_bytes(params),
        "gradients": storage_bytes([p.main_grad for p in params]),
        "optimizer": storage_bytes(optimizer_tensors(strategy.optimizer)),
        "tp_rank": groups.tp_rank,
        "pp_rank": groups.pp_rank,
    }


def every_layout(
    rank: int, world: int, layouts: list[tuple[str, Path, dict[str, Any]]]
) -> dict[str, list[dict[str, int]]]:
    """Each ``(name, model folder, strategy config)`` built, stepped once and measured;
    every rank's figures, in rank order."""
    import torch.distributed as dist

    from agentgym.trainers.updates import update_policy
    from tests.trainers.megatron.ranks import grpo_config, megatron
    from tests.trainers.test_update_path import ragged_batch

    measured = {}
    for name, folder, config in layouts:
        dealt = megatron(folder, rank, world, **config)
        update_policy(grpo_config(), dealt, ragged_batch(0), 1)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, megatron_memory(dealt.strategy))
        measured[name] = gathered
    return measured


def activation_peak(step: Callable[[], None], parameters: torch.nn.Module) -> int:
    """The peak over ``step`` (a forward and backward) of torch.profiler's memory
    profile, less ``parameters``' bytes and the gradients and optimizer state: the
    activations kept for the backward pass and everything transient (recomputed layers,
    the gradients flowing back, the head's copies) that the planner's activation estimate
    must cover. (The profile's ACTIVATION category alone misses what recomputation makes
    in the backward pass; its PARAMETER category may also take in a tensor of the step,
    so the parameters' own bytes are subtracted instead.)"""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX as INDEX
    from torch.profiler._memory_profiler import Category, MemoryProfileTimeline

    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    weights = sum(p.numel() * p.element_size() for p in parameters.parameters())
    state = [INDEX[Category.GRADIENT] + 1, INDEX[Category.OPTIMIZER_STATE] + 1]  # 0: the time
    return max(sum(row[1:]) - weights - sum(row[c] for c in state) for row in sizes)


def megatron_activation_peak(
    rank: int, world: int, folder: Path, batch: Any, recompute: str | None
) -> int:
    """:func:`activation_peak` of the Megatron strategy's forward (its own model call and
    log-probabilities) and backward on one rank, its model in training mode."""
    from agentgym.trainers.strategies.megatron.cpu import device_mode
    from tests.trainers.megatron.ranks import megatron

    strategy = megatron(folder, rank, world, recompute_granularity=recompute).strategy
    (model,) = strategy.model if isinstance(strategy.model, list) else [strategy.model]
    model.train()

    def step() -> None:  # the logits live no longer than in the strategy's own step
        first = strategy._scored_from(batch)
        logits = strategy._forward(model, batch, first)
        outputs = strategy._outputs(logits, batch, with_entropy=False, first=first)
        del logits
        (outputs.logprobs * batch.loss_mask).sum().backward()

    with device_mode():
        return activation_peak(step, model)
