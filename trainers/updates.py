"""The updates of one step: ``ppo_epochs`` shuffled passes of policy mini-batches, and
the critic's one pass (ROLL's critic takes one epoch), each through its strategy's
``train_step`` with the micro-batches of a mini-batch: ``micro_batch_size`` rows, or
with ``actor_train``'s dynamic batching a token budget's
(:mod:`~agentgym.trainers.strategies.batching`; the same update either way).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import torch

from agentgym.progress import progress
from agentgym.trainers.loss_terms import group_difficulty, sample_weights
from agentgym.trainers.objectives import PolicyLoss, ValueLoss
from agentgym.trainers.strategies import Critic, Metric, MetricReducer, Strategy, micro_batches
from agentgym.trainers.strategies.batching import cut, padded_tokens
from agentgym.trajectory import RolloutBatch

if TYPE_CHECKING:
    from agentgym.trainers.grpo import GRPOConfig


def minibatches(config: GRPOConfig, batch: RolloutBatch, step: int) -> list[RolloutBatch]:
    """The mini-batches of one step: ``ppo_epochs`` shuffled passes over ``batch``,
    each mini-batch trimmed to its longest sequence."""
    size = config.schedule.micro_batch_size * config.schedule.gradient_accumulation_steps
    generator = torch.Generator().manual_seed(config.schedule.seed * 100_003 + step)
    chunks = []
    for _ in range(config.schedule.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for start in range(0, len(batch), size):
            rows = order[start : start + size]
            chunks.append(batch.rows(rows, width=int(batch.attention_mask[rows].sum(1).max())))
    return chunks


def update_policy(
    config: GRPOConfig, strategy: Strategy, batch: RolloutBatch, step: int
) -> dict[str, float]:
    """``ppo_epochs`` passes of mini-batch updates (none in the first ``critic_warmup``
    steps, where only the critic trains).

    Returns:
        ``actor/*`` metrics: each mini-batch's value (over its micro-batches, by
        each metric's reduction) averaged over the updates; ``ratio_min`` and
        ``ratio_max`` are the extremes over all updates. With dynamic batching also
        ``padded_tokens`` (the forward passes' tokens beyond the real ones, summed
        over the updates) and ``padded_tokens_fixed`` (the same with micro-batches
        of ``micro_batch_size`` rows).
    """
    if step <= config.schedule.critic_warmup:
        return {"actor/updates": 0.0}
    size, budget = config.schedule.micro_batch_size, config.schedule.train_token_budget
    chunks = minibatches(config, batch, step)
    updates = MetricReducer()
    padded = {"actor/padded_tokens": 0.0, "actor/padded_tokens_fixed": 0.0}
    for chunk in progress(chunks, f"step {step} update", enabled=sys.stderr.isatty()):
        if (
            config.loss.length_loss_weight or config.loss.difficulty_loss_weight
        ):  # over the mini-batch
            chunk.sample_weights = sample_weights(
                chunk.loss_mask,
                difficulty=group_difficulty(batch.scores, batch.group_ids, of=chunk.group_ids),
                difficulty_loss_weight=config.loss.difficulty_loss_weight,
                length_loss_weight=config.loss.length_loss_weight,
            )
        loss = PolicyLoss(
            config.loss,
            num_tokens=chunk.loss_mask.sum().clamp(min=1),
            num_seqs=(chunk.loss_mask.sum(1) > 0).sum().clamp(min=1),
        )
        parts, _ = cut(chunk, size, budget)
        if budget is not None:
            padded["actor/padded_tokens"] += padded_tokens(parts)[0]
            padded["actor/padded_tokens_fixed"] += padded_tokens(cut(chunk, size, None)[0])[0]
        result = strategy.train_step(parts, loss)
        # a mini-batch's shares have added up to its value: average those over updates
        updates.add(
            {
                key: Metric(m.value, "mean" if m.reduce == "sum" else m.reduce)
                for key, m in result.items()
            }
        )
    logged = {f"actor/{key}": value for key, value in updates.values().items()}
    return logged | {"actor/updates": float(len(chunks))} | (padded if budget else {})


def update_critic(
    config: GRPOConfig, critic: Critic, batch: RolloutBatch, step: int
) -> dict[str, float]:
    """One shuffled pass of critic mini-batches over ``batch`` (ROLL's critic takes one
    epoch), sized by ``critic.training_args``.

    Returns:
        ``critic/*`` metrics averaged over the updates, and ``time/critic``.
    """
    started = time.perf_counter()
    sizes = config.with_values(
        ppo_epochs=1,
        micro_batch_size=config.schedule.critic_micro_batch_size,
        gradient_accumulation_steps=config.schedule.critic_gradient_accumulation_steps,
    )
    chunks = minibatches(sizes, batch, step)
    updates = MetricReducer()
    for chunk in chunks:
        mask = chunk.loss_mask if chunk.value_mask is None else chunk.value_mask  # [b, t]
        loss = ValueLoss(
            config.loss,
            num_tokens=mask.sum().clamp(min=1),
            num_seqs=(mask.sum(1) > 0).sum().clamp(min=1),
        )
        result = critic.train_step(
            list(micro_batches(chunk, sizes.schedule.micro_batch_size)), loss
        )
        updates.add({key: Metric(m.value, "mean") for key, m in result.items()})
    return {f"critic/{key}": value for key, value in updates.values().items()} | {
        "critic/updates": float(len(chunks)),
        "time/critic": time.perf_counter() - started,
    }
