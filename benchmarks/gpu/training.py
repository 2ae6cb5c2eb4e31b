"""Train-step items: the Megatron strategy (TP=1 and the planner's layout) and the torch
strategy, on the same random batch, timed as tokens/s and MFU against the measured peak.

MFU counts model FLOPs only, as the planner does (``docs/plan.md``): per token,
3 passes (forward, and backward twice the forward) of ``2 × parameters`` plus causal
attention's ``2 × layers × q_size × seq_len``; recomputation adds work but not model
FLOPs, so a layout that recomputes pays for it in MFU.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from agentgym.plan import Devices, Layout, ModelShape, Workload, search
from agentgym.plan.memory import activation_bytes, state_bytes, total_parameters
from agentgym.trajectory import RolloutBatch

from .models import Settings
from .runner import Context, Deadline, kernel_profile, time_reps


def step_flops(shape: ModelShape, samples: int, seq_len: int) -> float:
    """Model FLOPs of one training step over ``samples × seq_len`` tokens."""
    dense = 2 * total_parameters(shape)
    attention = 2 * shape.num_layers * shape.q_size * seq_len
    return samples * seq_len * 3 * (dense + attention)


def skipped_head_flops(shape: ModelShape, samples: int, seq_len: int) -> float:
    """The part of :func:`step_flops` the strategies do not compute: the LM head on the
    prompt positions before the one that predicts the first scored token."""
    return samples * (prompt_len(seq_len) - 1) * 3 * 2 * shape.vocab_size * shape.hidden_size


def random_batch(
    samples: int, seq_len: int, vocab: int, device: str, seed: int = 0
) -> RolloutBatch:
    """``samples`` full rows of random ids; the second half of each is the response
    (loss mask 1, from :func:`prompt_len` on), with made-up old logprobs and per-row
    advantages."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (samples, seq_len), generator=generator)  # [B, T]
    ones = torch.ones(samples, seq_len, dtype=torch.long)  # [B, T]
    loss_mask = torch.zeros_like(ones)
    loss_mask[:, prompt_len(seq_len) :] = 1
    old = -torch.rand(samples, seq_len, generator=generator) * 3 * loss_mask  # [B, T]
    batch = RolloutBatch(
        input_ids=input_ids,
        attention_mask=ones,
        position_ids=torch.arange(seq_len).expand(samples, seq_len).contiguous(),
        loss_mask=loss_mask,
        engine_logprobs=old,
        token_rewards=torch.zeros(samples, seq_len),
        scores=torch.zeros(samples),
        group_ids=torch.arange(samples) // 8,
        tags=["bench"] * samples,
    )
    batch.old_logprobs = old
    batch.advantages = (
        torch.randn(samples, 1, generator=generator).expand(samples, seq_len) * loss_mask
    )
    batch.advantages = batch.advantages.contiguous()
    from agentgym.trainers.strategies.torch_strategy import to_device

    return to_device(batch, torch.device(device))


def prompt_len(seq_len: int) -> int:
    """The prompt of :func:`random_batch`'s rows: their first half (the strategies' LM
    heads skip it, and the planner knows)."""
    return seq_len // 2


def workload(settings: Settings) -> Workload:
    """The planner's view of the suite's training step."""
    return Workload(
        seq_len=settings.seq_len,
        rollout_batch_size=settings.samples,
        dtype=settings.dtype,
        prompt_len=prompt_len(settings.seq_len),
    )


def policy_loss(batch: RolloutBatch) -> Any:
    """The recipe's default loss (PPO-clip, token-mean) with ``batch``'s counts."""
    from agentgym.builders.recipe import default_grpo_config
    from agentgym.trainers.objectives import PolicyLoss

    mask = batch.loss_mask
    return PolicyLoss(
        default_grpo_config().loss,
        num_tokens=mask.sum().clamp(min=1),
        num_seqs=(mask.sum(1) > 0).sum().clamp(min=1),
    )


def one_device(ctx: Context) -> Devices:
    """This process's device as the planner sees it: its memory, the measured peak."""
    return Devices(
        count=1,
        memory_gib=ctx.device_memory_gib(),
        per_node=1,
        peak_tflops=ctx.peak_tflops or 989.0,
    )


def planned_layouts(ctx: Context, shape: ModelShape) -> list[Layout]:
    """The layouts the planner keeps for this process's one device and the step's batch,
    best first: its memory, the measured peak and the planner's stated efficiency."""
    plans = search(shape, one_device(ctx), workload(ctx.settings))
    kept = [plan.layout for plan in plans if not plan.refused]
    if not kept:
        raise RuntimeError(f"the planner found no layout for {shape.name} on this device")
    return kept


def planned_memory(
    shape: ModelShape, layout: Layout, strategy: str, dtype: str, seq_len: int, micro_batches: int
) -> dict[str, float]:
    """The planner's state and activation GiB for one device of ``layout`` (issue 31's
    "activation estimate within 25% of ``torch.cuda.max_memory_allocated``")."""
    state = state_bytes(shape, layout, strategy=strategy, dtype=dtype)
    activations = activation_bytes(
        shape,
        layout,
        seq_len,
        dtype=dtype,
        micro_batches=micro_batches,
        prompt_len=prompt_len(seq_len),
    )
    return {
        "planned_state_gib": state.total / 2**30,
        "planned_activation_gib": activations / 2**30,
    }


def _measure_step(
    ctx: Context,
    deadline: Deadline,
    shape: ModelShape,
    build: Callable[[], Any],
    micro_batch_size: int,
    planned: Callable[[int], dict[str, float]],
    profile: bool = True,
) -> dict[str, Any]:
    s = ctx.settings
    cuda = s.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    strategy = build()
    batch = random_batch(s.samples, s.seq_len, shape.vocab_size, s.device)
    parts = [
        batch.rows(slice(i, i + micro_batch_size)) for i in range(0, s.samples, micro_batch_size)
    ]
    loss = policy_loss(batch)
    grad_norms: list[float] = []

    def step() -> None:
        metrics = strategy.train_step(parts, loss)
        grad_norms.append(metrics["grad_norm"].value)

    seconds = time_reps(step, deadline, ctx.settings.max_reps, ctx.synchronize)
    median = sorted(seconds)[len(seconds) // 2]
    flops = step_flops(shape, s.samples, s.seq_len)
    figures: dict[str, Any] = {
        "step_s": median,
        "tokens_per_s": s.samples * s.seq_len / median,
        "tflops": flops / median / 1e12,
        "micro_batch_size": float(micro_batch_size),
        "accumulation": float(len(parts)),
        "reps": float(len(seconds)),
        "grad_norm": grad_norms[-1],
    }
    computed = flops - skipped_head_flops(shape, s.samples, s.seq_len)
    figures["computed_tflops"] = computed / median / 1e12
    if ctx.peak_tflops:
        figures["mfu"] = figures["tflops"] / ctx.peak_tflops
        # the FLOPs the step computes (the head on the scored positions only)
        figures["mfu_computed"] = figures["computed_tflops"] / ctx.peak_tflops
    figures.update(planned(len(parts)))
    if cuda:  # the strategy's weights, gradients, optimizer state and the step's peak
        figures["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        # What the step held besides its state, the state as the planner counts it
        # (checked against the strategies' own tensors within 2% on the CPU).
        figures["activation_gib"] = figures["peak_gib"] - figures["planned_state_gib"]
        figures["activation_vs_planned"] = (
            figures["activation_gib"] / figures["planned_activation_gib"]
        )
    if ctx.kernels and profile:  # after the peak memory was read: profiling cannot change it
        try:
            figures.update(kernel_profile(step, median, s.device))
        except Exception as error:  # the step's own figures stand without the profile
            figures["kernels_error"] = f"{type(error).__name__}: {error}"
    return figures


def _megatron(
    ctx: Context, deadline: Deadline, layout: Layout | None, profile: bool = True
) -> dict[str, Any]:
    from agentgym.trainers.strategies.megatron import build_megatron
    from agentgym.trainers.strategies.optim import OptimizerConfig

    s = ctx.settings
    shape = ctx.shape(s.train_shape)
    path = ctx.model(s.train_shape)
    layout = layout or Layout(micro_batch_size=s.micro_batch_size)
    mbs, recompute = layout.micro_batch_size, layout.recompute
    config = {
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "context_parallel_size": layout.cp,
        "sequence_parallel": layout.sequence_parallel,
        "use_distributed_optimizer": layout.distributed_optimizer,
        "recompute_granularity": None if recompute == "none" else recompute,
    }

    def build() -> Any:
        return build_megatron(
            path,
            config,
            dtype=s.dtype,
            optimizer=OptimizerConfig(learning_rate=1e-6),
            micro_batch_size=mbs,
        )

    try:
        figures: dict[str, Any] = _measure_step(
            ctx,
            deadline,
            shape,
            build,
            mbs,
            lambda steps: planned_memory(shape, layout, "megatron", s.dtype, s.seq_len, steps),
            profile,
        )
    finally:
        _destroy_megatron_groups()
    figures["layout"] = f"tp={config['tensor_model_parallel_size']} recompute={recompute} mbs={mbs}"
    return figures


def _destroy_megatron_groups() -> None:
    try:
        from megatron.core import parallel_state
    except ImportError:
        return
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    gc.collect()


def megatron_tp1(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """The Megatron strategy's step at TP=1, no recomputation, the suite's micro-batch."""
    return _megatron(ctx, deadline, None)


def megatron_planned(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """The Megatron strategy's step at the layout ``agentgym plan`` ranks first for one
    device of this card (memory, measured peak): micro-batch and recomputation. Should
    that run out of memory (the planner was wrong: ``planned_oom`` names it), the
    runner-up's figures are measured instead."""
    layouts = planned_layouts(ctx, ctx.shape(ctx.settings.train_shape))
    try:
        return _megatron(ctx, deadline, layouts[0])
    except torch.cuda.OutOfMemoryError:
        if len(layouts) < 2:
            raise
    ctx.release()
    figures = _megatron(ctx, deadline, layouts[1])
    figures["planned_oom"] = _layout_name(layouts[0])
    return figures


def _hf_strategy_step(ctx: Context, deadline: Deadline, kind: type, **options: Any) -> Any:
    """A step of a strategy that trains the Hugging Face model (torch, FSDP2) on the
    same shape, batch and micro-batches as TP=1."""
    from agentgym.trainers.strategies.optim import OptimizerConfig

    s = ctx.settings
    path = ctx.model(s.train_shape)

    def build() -> Any:
        return kind(
            path,
            dtype=s.dtype,
            device=s.device,
            optimizer=OptimizerConfig(learning_rate=1e-6),
            micro_batch_size=s.micro_batch_size,
            attn_implementation="sdpa",
            **options,
        )

    shape = ctx.shape(s.train_shape)
    layout = Layout(micro_batch_size=s.micro_batch_size)
    return _measure_step(
        ctx,
        deadline,
        shape,
        build,
        s.micro_batch_size,
        lambda steps: planned_memory(shape, layout, "torch", s.dtype, s.seq_len, steps),
    )


def torch_step(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """The torch strategy's step on the same shape, batch and micro-batches as TP=1."""
    from agentgym.trainers.strategies.torch_strategy import TorchStrategy

    figures: dict[str, Any] = _hf_strategy_step(ctx, deadline, TorchStrategy)
    return figures


def fsdp2_step(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """The FSDP2 strategy's step (``fsdp2_train``, full sharding over this process's
    devices: one here) on the same shape, batch and micro-batches as ``torch_step``."""
    from agentgym.trainers.strategies.fsdp2.strategy import FSDP2Strategy

    figures: dict[str, Any] = _hf_strategy_step(
        ctx, deadline, FSDP2Strategy, reshard_after_forward=True
    )
    figures["layout"] = "full sharding, reshard_after_forward=true"
    return figures


def _layout_name(layout: Layout) -> str:
    return (
        f"tp={layout.tp} pp={layout.pp} recompute={layout.recompute} mbs={layout.micro_batch_size}"
    )


def planner_fit(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """``agentgym plan`` against the card's memory (issue 31's line): of the layouts it
    keeps for one device, the one it estimates nearest the card's memory trains a step
    without running out; of those it refuses for memory alone, the one nearest to
    fitting runs out (on the CPU nothing is refused for memory: that half is skipped)."""
    shape = ctx.shape(ctx.settings.train_shape)
    devices = one_device(ctx)
    plans = search(shape, devices, workload(ctx.settings))
    kept = [plan for plan in plans if not plan.refused]
    if not kept:
        raise RuntimeError(f"the planner keeps no layout for {shape.name} on this device")
    fullest = max(kept, key=lambda plan: plan.peak_gib)
    figures: dict[str, Any] = {
        "fits_layout": _layout_name(fullest.layout),
        "fits_estimate_gib": fullest.peak_gib,
        "usable_gib": devices.memory_gib - devices.reserve_gib,
    }
    try:
        measured = _megatron(ctx, deadline, fullest.layout, profile=False)
        figures["fits_ran"] = 1.0
        if "peak_gib" in measured:
            figures["fits_measured_gib"] = measured["peak_gib"]
    except torch.cuda.OutOfMemoryError:
        figures["fits_ran"] = 0.0  # the planner said it fits: it did not
    for_memory = [
        plan
        for plan in plans
        if plan.refused and all(reason.startswith("memory") for reason in plan.refused)
    ]
    if not for_memory:
        figures["refused"] = "skipped: no layout refused for memory alone on this device"
        return figures
    tightest = min(for_memory, key=lambda plan: plan.peak_gib)
    figures["refused_layout"] = _layout_name(tightest.layout)
    figures["refused_estimate_gib"] = tightest.peak_gib
    ctx.release()
    try:
        _megatron(ctx, deadline, tightest.layout, profile=False)
        figures["refused_ran_out"] = 0.0  # the planner refused a layout that fits
    except torch.cuda.OutOfMemoryError:
        figures["refused_ran_out"] = 1.0
    return figures
