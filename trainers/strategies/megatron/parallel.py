"""The collective plumbing of the Megatron strategy: who holds which rows, the
schedule call, TP gathers, PP broadcasts, and the optimizer.

Everything here runs inside
:func:`~agentgym.trainers.strategies.megatron.cpu.device_mode` on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from agentgym.trainers.strategies.base import Metric
from agentgym.trainers.strategies.megatron.weights import LAYOUTS, tp_merge
from agentgym.trainers.strategies.optim import OptimizerConfig
from agentgym.trajectory import RolloutBatch


@dataclass(frozen=True)
class Groups:
    """This rank's place in megatron-core's process groups."""

    world_rank: int
    world_size: int
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    dp_rank: int
    dp_size: int

    @classmethod
    def current(cls) -> Groups:
        """Read megatron-core's ``parallel_state``."""
        from megatron.core import parallel_state as ps

        return cls(
            dist.get_rank(),
            dist.get_world_size(),
            ps.get_tensor_model_parallel_rank(),
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_rank(),
            ps.get_pipeline_model_parallel_world_size(),
            ps.get_data_parallel_rank(),
            ps.get_data_parallel_world_size(),
        )


def even_micro_batches(parts: Sequence[RolloutBatch], groups: Groups) -> list[RolloutBatch]:
    """``parts`` and, where their count is not a multiple of the data-parallel size,
    masked copies of the last one (``loss_mask`` all 0) until it is.

    megatron-core runs the same number of micro-batches on every data-parallel
    replica. ROLL's rule (``per_device_train_batch_size × gradient_accumulation_steps
    × world_size / TP / PP / CP`` = the mini-batch) gives whole mini-batches that
    count, but the last mini-batch of a step-mode rollout (whose sample count varies)
    may fall short. A masked copy adds nothing to the loss or the gradient: each
    micro-batch's loss is its share of the mini-batch, counted over masked tokens.
    ROLL's ``batch_adjust_mode: copy`` adds unmasked copies instead, which weighs
    the copied samples twice.
    """
    padded = list(parts)
    if not padded:
        return padded
    while len(padded) % groups.dp_size:
        filler = padded[-1].rows(slice(None))
        filler.loss_mask = torch.zeros_like(filler.loss_mask)
        padded.append(filler)
    return padded


def gather_world(items: list[Any]) -> list[list[Any]]:
    """Every rank's ``items``, in rank order (just ``[items]`` for one process)."""
    if dist.get_world_size() == 1:
        return [items]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, items)
    return gathered


def concat_rows(batches: Sequence[RolloutBatch]) -> RolloutBatch:
    """One batch of all ``batches``' rows, right-padded to the widest."""
    if len(batches) == 1:
        return batches[0]
    width = max(batch.input_ids.shape[1] for batch in batches)
    fields: dict[str, Any] = {}
    for key, first in vars(batches[0]).items():
        values = [getattr(batch, key) for batch in batches]
        if isinstance(first, torch.Tensor):
            fields[key] = torch.cat(
                [
                    torch.nn.functional.pad(v, (0, width - v.shape[1])) if v.dim() == 2 else v
                    for v in values
                ]
            )
        elif key == "tags":
            fields[key] = [tag for value in values for tag in value]
        else:
            fields[key] = first
    return RolloutBatch(**fields)


def data_share(count: int, groups: Groups) -> tuple[int, int]:
    """``[start, stop)`` of ``count`` items for this rank's data-parallel replica
    (contiguous, larger shares first)."""
    base, extra = divmod(count, groups.dp_size)
    start = groups.dp_rank * base + min(groups.dp_rank, extra)
    return start, start + base + (groups.dp_rank < extra)


def run_schedule(
    model: torch.nn.Module,
    step: Callable[[Iterator[RolloutBatch], torch.nn.Module], Any],
    parts: Sequence[RolloutBatch],
    *,
    forward_only: bool = False,
) -> list[dict[str, Any]]:
    """megatron-core's ``forward_backward_func`` over ``parts``; the loss results of
    the last PP stage (empty elsewhere)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not parts:
        return []
    results = get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=iter(parts),
        model=[model],
        num_microbatches=len(parts),
        seq_length=max(part.input_ids.shape[1] for part in parts),
        micro_batch_size=max(len(part) for part in parts),
        forward_only=forward_only,
    )
    return list(results) if results else []


def _last_stage_tp0(groups: Groups) -> bool:
    return groups.pp_rank == groups.pp_size - 1 and groups.tp_rank == 0


def gather_results(
    local: torch.Tensor | None, share: tuple[int, int], groups: Groups
) -> torch.Tensor:
    """The rows every replica's last stage computed, in order, on every rank (through
    the host: a pickled CUDA tensor would land on its sender's device index)."""
    mine = (share, local.cpu()) if _last_stage_tp0(groups) and local is not None else None
    pieces = [piece for piece in gather_world([mine]) if piece[0] is not None]
    pieces.sort(key=lambda piece: piece[0][0][0])
    return torch.cat([piece[0][1] for piece in pieces])


def gather_metrics(
    local: list[dict[str, Metric]], share: tuple[int, int], count: int, groups: Groups
) -> list[dict[str, Metric]]:
    """Every micro-batch's metrics, in the mini-batch's order, on every rank."""
    merged: list[dict[str, Metric]] = [{} for _ in range(count)]
    mine = (share, local) if _last_stage_tp0(groups) else None
    for piece in gather_world([mine]):
        if piece[0] is not None:
            (start, _), metrics = piece[0]
            merged[start : start + len(metrics)] = metrics
    return merged


def tp_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Differentiable sum over the tensor-parallel group."""
    from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(tensor)


def tp_max(tensor: torch.Tensor) -> torch.Tensor:
    """Max over the tensor-parallel group (no gradient)."""
    from megatron.core import parallel_state as ps

    if ps.get_tensor_model_parallel_world_size() > 1:
        tensor = tensor.clone()
        dist.all_reduce(tensor, dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    return tensor


def tp_gather(shard: torch.Tensor, layout: str, groups: Groups) -> torch.Tensor:
    """The full Megatron tensor from every TP rank's ``shard``."""
    from megatron.core import parallel_state as ps

    if groups.tp_size == 1 or LAYOUTS[layout].split_dim is None:
        return shard
    shards = [torch.empty_like(shard) for _ in range(groups.tp_size)]
    dist.all_gather(shards, shard.contiguous(), group=ps.get_tensor_model_parallel_group())
    return tp_merge(shards, LAYOUTS[layout])


def rank_device() -> torch.device:
    """This rank's device: its current CUDA device where there is one (megatron-core's
    model, and NCCL's buffers, live there), else the CPU (CPU mode, gloo)."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_stage(
    owned: Iterator[tuple[str, torch.Tensor]] | None, stage: int, groups: Groups
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream PP stage ``stage``'s ``(name, tensor)`` pairs to every rank, one at a time
    (the other stages receive into buffers on their own device: NCCL takes no CPU
    tensor)."""
    from megatron.core import parallel_state as ps

    if groups.pp_size == 1:
        assert owned is not None
        yield from owned
        return
    group = ps.get_pipeline_model_parallel_group()
    source = dist.get_global_rank(group, stage)
    while True:
        item = next(owned, None) if owned is not None else None
        header: list[Any] = [None]
        if owned is not None:
            header = [None if item is None else (item[0], item[1].shape, item[1].dtype)]
        dist.broadcast_object_list(header, src=source, group=group)
        if header[0] is None:
            return
        name, shape, dtype = header[0]
        if item is not None:
            tensor = item[1].contiguous()
        else:
            tensor = torch.empty(shape, dtype=dtype, device=rank_device())
        dist.broadcast(tensor, src=source, group=group)
        yield name, tensor


def wrap_for_training(
    model: torch.nn.Module,
    config: Any,
    settings: OptimizerConfig,
    *,
    use_distributed_optimizer: bool,
    overlap_grad_reduce: bool,
) -> tuple[Any, Any]:
    """megatron-core's DDP wrapper (gradients summed over DP: the losses are
    already shares of the mini-batch) and optimizer (Adam, clipping) with
    ``settings``' learning rate, weight decay, betas and clip."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp = DistributedDataParallel(
        config,
        DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=overlap_grad_reduce,
            use_distributed_optimizer=use_distributed_optimizer,
        ),
        module=model,
    )

    def finalize(models: list[torch.nn.Module], num_tokens: Any = None, **kwargs: Any) -> None:
        finalize_model_grads(models, None, **kwargs)  # no division by a token count

    config.finalize_model_grads_func = finalize
    config.no_sync_func = ddp.no_sync
    config.grad_sync_func = None
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            optimizer="adam",
            lr=settings.learning_rate,
            weight_decay=settings.weight_decay,
            adam_beta1=float(settings.betas[0]),
            adam_beta2=float(settings.betas[1]),
            adam_eps=1e-8,
            clip_grad=settings.max_grad_norm or 0.0,
            use_distributed_optimizer=use_distributed_optimizer,
            params_dtype=config.params_dtype,
            bf16=config.bf16,
        ),
        [ddp],
    )
    return ddp, optimizer


def optimizer_step(optimizer: Any, lr: float) -> float:
    """Set the learning rate, step; returns the gradient norm before clipping.

    megatron-core's chained optimizer (what ``get_megatron_optimizer`` returns) computes
    the norm in ``step`` whether it clips or not, after copying the gradients in; asked
    before the step (they were already zeroed by then) it read 0.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    _, norm, _ = optimizer.step()
    return float("nan") if norm is None else float(norm)  # None: it skipped the step
