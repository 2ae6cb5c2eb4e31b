"""The optimizer and the learning-rate schedule every strategy takes
(:class:`OptimizerConfig`): AdamW, transformers' schedules with ROLL's warmup and
step count, and the step that sums gradients over a data-parallel group, clips and
steps (the torch-side strategies; Megatron takes the settings and the schedule).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym.trainers.strategies.base import Metric


def _warmup(step: int, warmup: int) -> float:
    return step / max(1, warmup)


def _constant(step: int, warmup: int, total: int) -> float:
    return 1.0


def _constant_with_warmup(step: int, warmup: int, total: int) -> float:
    return _warmup(step, warmup) if step < warmup else 1.0


def _linear(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return _warmup(step, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def _cosine(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return _warmup(step, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


LR_SCHEDULERS: dict[str, Callable[[int, int, int], float]] = {
    "constant": _constant,
    "constant_with_warmup": _constant_with_warmup,
    "linear": _linear,
    "cosine": _cosine,
}
"""``lr_scheduler_type`` → the learning-rate factor at optimizer step ``step`` (from 0)
given ``warmup`` warmup steps and ``total`` optimizer steps in the run, as
transformers' ``get_scheduler`` defines them (ROLL's torch-side strategies call
it): a linear warmup ``step / warmup`` (0 at step 0), then constant (``constant``
has no warmup), linear decay to 0 at ``total``, or a half cosine to 0 at ``total``
(``num_cycles`` 0.5). Past ``total`` the cosine rises again, as transformers' does."""

SCHEDULES_WITH_TOTAL = ("linear", "cosine")
"""Schedules that need the run's optimizer-step count."""


def warmup_steps_of(warmup_steps: int, warmup_ratio: float, total_steps: int | None) -> int:
    """ROLL's ``TrainingArguments.get_warmup_steps``: ``warmup_steps`` when > 0, else
    ``ceil(total_steps * warmup_ratio)``.

    Raises:
        ValueError: On ``warmup_ratio > 0`` without ``total_steps``.
    """
    if warmup_steps > 0 or warmup_ratio == 0:
        return warmup_steps
    if total_steps is None:
        raise ValueError(
            f"warmup_ratio={warmup_ratio} needs the run's optimizer-step count (total_steps)"
        )
    return math.ceil(total_steps * warmup_ratio)


def optimizer_steps(
    *, max_steps: int, rollout_batch_size: int, ppo_epochs: int, mini_batch_size: int
) -> int:
    """The run's optimizer steps as ROLL counts them for its schedule
    (``PPOConfig.set_max_steps``): ``max(1, max_steps * rollout_batch_size *
    ppo_epochs // mini_batch_size)``, with ``mini_batch_size`` =
    ``per_device_train_batch_size * gradient_accumulation_steps`` (ROLL divides
    both by the data-parallel size; here a mini-batch spans the ranks already).
    Exact in trajectory mode; in step mode a step has more samples than
    trajectories, so the schedule ends early, as ROLL's does."""
    return max(1, max_steps * rollout_batch_size * ppo_epochs // mini_batch_size)


def lr_schedule(
    lr_scheduler_type: str,
    *,
    warmup_steps: int = 0,
    warmup_ratio: float = 0.0,
    total_steps: int | None = None,
) -> Callable[[int], float]:
    """The learning-rate factor of each optimizer step (from 0) under
    ``lr_scheduler_type`` (:data:`LR_SCHEDULERS`), ROLL's warmup rule
    (:func:`warmup_steps_of`) and ``total_steps`` (:func:`optimizer_steps`).

    Raises:
        ValueError: On an unknown schedule, or ``linear``/``cosine``/``warmup_ratio``
            without ``total_steps``.
    """
    if lr_scheduler_type not in LR_SCHEDULERS:
        raise ValueError(
            f"lr_scheduler_type={lr_scheduler_type!r} is not supported; valid options: "
            f"{list(LR_SCHEDULERS)}"
        )
    if lr_scheduler_type in SCHEDULES_WITH_TOTAL and total_steps is None:
        raise ValueError(
            f"lr_scheduler_type={lr_scheduler_type!r} needs the run's optimizer-step count "
            "(total_steps, see optimizer_steps)"
        )
    schedule = LR_SCHEDULERS[lr_scheduler_type]
    warmup = warmup_steps_of(warmup_steps, warmup_ratio, total_steps)
    total = total_steps if total_steps is not None else 0
    return lambda step: schedule(step, warmup, total)


@dataclass(frozen=True)
class OptimizerConfig:
    """A training role's optimizer and learning-rate schedule: ROLL's
    ``training_args`` and the top-level ``max_grad_norm``. Every strategy (policy,
    critic; torch, Megatron, FSDP2) takes one.

    Attributes:
        learning_rate: The (Adam)W learning rate after warmup.
        weight_decay: Decoupled weight decay.
        betas: Adam betas.
        lr_scheduler_type: A key of :data:`LR_SCHEDULERS`.
        warmup_steps: Optimizer steps of linear warmup from 0.
        warmup_ratio: Warmup as a share of ``total_steps`` when ``warmup_steps`` is 0.
        total_steps: The run's optimizer steps (:func:`optimizer_steps`); needed by
            ``linear``, ``cosine`` and ``warmup_ratio``.
        max_grad_norm: Clip the global gradient norm to this (None: no clipping).
    """

    learning_rate: float = 3e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    total_steps: int | None = None
    max_grad_norm: float | None = 1.0

    def schedule(self) -> Callable[[int], float]:
        """The learning-rate factor of each optimizer step (:func:`lr_schedule`).

        Raises:
            ValueError: As :func:`lr_schedule`.
        """
        return lr_schedule(
            self.lr_scheduler_type,
            warmup_steps=self.warmup_steps,
            warmup_ratio=self.warmup_ratio,
            total_steps=self.total_steps,
        )


MULTI_TENSOR = True
"""AdamW's multi-tensor (``foreach``) path, which torch takes by default on a GPU but
not on the CPU, where it falls back to a loop of about ten ops per tensor. The two give
the same numbers to the bit (``tests/trainers/test_lr_schedules.py``); on the tiny
model's 27 tensors, 2 CPU threads, a step takes 0.76 ms against 0.88 ms idle, and
15 ms against 84 ms while other processes load the cores."""


def build_optimizer(
    model: torch.nn.Module, config: OptimizerConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model``'s trainable parameters (a LoRA adapter's alone, when the
    base is frozen), its learning rate times ``config.schedule()(step)``.

    Raises:
        ValueError: On a schedule :func:`lr_schedule` refuses.
    """
    schedule = config.schedule()
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        betas=(float(config.betas[0]), float(config.betas[1])),
        foreach=MULTI_TENSOR,
    )
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    max_grad_norm: float | None,
) -> dict[str, Metric]:
    """Sum the gradients over the data-parallel group (when ``torch.distributed`` is
    initialized), clip them and step the optimizer and the schedule.

    Returns:
        ``grad_norm`` (before clipping) and ``lr`` (of this step).
    """
    parameters = [p for p in model.parameters() if p.requires_grad]
    if _world_size() > 1:
        for p in parameters:
            if p.grad is None:  # a rank without micro-batches still joins the sum
                p.grad = torch.zeros_like(p)
        _all_reduce_sum([p.grad for p in parameters if p.grad is not None])
    grads = [p.grad for p in parameters if p.grad is not None]
    parameters = [p for p in parameters if p.grad is not None]
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    else:
        norm = torch.linalg.vector_norm(torch.stack([grad.norm() for grad in grads]))
    metrics = {
        "grad_norm": Metric(float(norm), "mean"),
        "lr": Metric(float(scheduler.get_last_lr()[0]), "mean"),
    }
    optimizer.step()
    scheduler.step()
    return metrics


def save_optimizer(optimizer: torch.optim.Optimizer, scheduler: Any, directory: Path) -> None:
    """Write ``optimizer``'s and ``scheduler``'s states under ``directory``."""
    torch.save(optimizer.state_dict(), directory / "optimizer.pt")
    torch.save(scheduler.state_dict(), directory / "scheduler.pt")


def load_optimizer(optimizer: torch.optim.Optimizer, scheduler: Any, directory: Path) -> None:
    """Restore what :func:`save_optimizer` wrote, through the host: the optimizer puts its
    state on each parameter's device (a checkpoint from a GPU loads where none is, or on
    another index)."""
    state = torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True)
    optimizer.load_state_dict(state)
    scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=True))


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _all_reduce_sum(tensors: list[torch.Tensor], bucket_bytes: int = 64 << 20) -> None:
    """Sum ``tensors`` in place over the process group, flattened into buckets and
    summed in float32 (as FSDP2 and megatron-core reduce: bf16 gradients summed in
    bf16 lose the small ones' bits)."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    bucket: list[torch.Tensor] = []
    size = 0
    for tensor in [*tensors, None]:
        if tensor is not None:
            bucket.append(tensor)
            size += tensor.numel() * tensor.element_size()
        if bucket and (tensor is None or size >= bucket_bytes):
            flat = _flatten_dense_tensors(bucket).float()
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            for target, summed in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                target.copy_(summed)
            bucket, size = [], 0
