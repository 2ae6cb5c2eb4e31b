"""Micro-batches by token budget: ROLL's dynamic batching (``use_dynamic_batching_in_train``
and ``_in_infer``, ``max_tokens_per_microbatch_*``, ``sequence_length_round_*``).

Rows are sorted by length, so that rows of like length share a micro-batch and pad
little, and cut greedily: a micro-batch takes rows while its rows × width stays
within ``max_tokens``, its width being its longest row's length rounded up to a
multiple of ``round_to`` (ROLL's ``sequence_length_round``: fewer distinct shapes).
Fixed-size micro-batches (``per_device_train_batch_size`` rows, each trimmed to its
longest row) are :func:`~agentgym.trainers.strategies.base.micro_batches`.

The cut changes which rows share a forward pass, never the loss: each micro-batch's
loss is its share of the mini-batch's (normalized by the mini-batch's counts), so
the accumulated gradient is the same whichever way the mini-batch is cut. ROLL
also regroups the mini-batches (``gradient_accumulation_steps`` micro-batches each,
in length order over the whole batch); here the mini-batches stay the recipe's
shuffled ones of ``per_device_train_batch_size × gradient_accumulation_steps`` rows
and only their cut into micro-batches changes, so the update is exactly the one of
fixed-size micro-batches (``tests/trainers/test_dynamic_batching.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from agentgym.trainers.strategies.base import micro_batches
from agentgym.trajectory import RolloutBatch


@dataclass(frozen=True)
class TokenBudget:
    """One role's dynamic batching.

    Attributes:
        max_tokens: Padded tokens (rows × width) a micro-batch may hold
            (ROLL's ``max_tokens_per_microbatch_in_train`` / ``_in_infer``).
        round_to: Widths are rounded up to a multiple of this
            (ROLL's ``sequence_length_round_in_train`` / ``_in_infer``).
    """

    max_tokens: int
    round_to: int = 1

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.round_to < 1:
            raise ValueError(
                f"a token budget needs max_tokens >= 1 and round_to >= 1, got "
                f"max_tokens={self.max_tokens}, round_to={self.round_to}"
            )


def rounded_lengths(batch: RolloutBatch, round_to: int) -> torch.Tensor:
    """``[B]`` each row's length (its real tokens) rounded up to a multiple of ``round_to``."""
    lengths = batch.attention_mask.sum(1)  # [B]
    return (lengths + round_to - 1).div(round_to, rounding_mode="floor") * round_to


def plan(batch: RolloutBatch, budget: TokenBudget) -> list[tuple[torch.Tensor, int]]:
    """Each micro-batch's rows (indices into ``batch``, shortest first) and width.

    Raises:
        ValueError: If a row's rounded length alone exceeds ``budget.max_tokens``.
    """
    lengths = rounded_lengths(batch, budget.round_to)  # [B]
    order = torch.argsort(lengths, stable=True)  # [B]
    ordered = lengths[order]  # [B], non-decreasing
    longest = int(ordered[-1]) if len(ordered) else 0
    if longest > budget.max_tokens:
        raise ValueError(
            f"a sample of {longest} tokens (rounded up to a multiple of {budget.round_to}) "
            f"does not fit in max_tokens_per_microbatch={budget.max_tokens}: raise it to at "
            "least sequence_length rounded up the same way (ROLL recommends sequence_length "
            "× 2 × per_device_train_batch_size)"
        )
    cuts: list[tuple[torch.Tensor, int]] = []
    start = 0
    while start < len(ordered):
        rest = ordered[start:]  # [R]
        # rows start..start+k-1 hold k × rest[k-1] padded tokens, which grows with k
        fits = torch.arange(1, len(rest) + 1) * rest <= budget.max_tokens  # [R]
        count = int(fits.sum())
        cuts.append((order[start : start + count], max(int(rest[count - 1]), 1)))
        start += count
    return cuts


def fit_width(rows: torch.Tensor, width: int) -> torch.Tensor:
    """``[b, t]`` rows cut, or right-padded with zeros, to ``[b, width]``."""
    return torch.nn.functional.pad(rows[:, :width], (0, max(width - rows.shape[1], 0)))


def with_width(batch: RolloutBatch, width: int) -> RolloutBatch:
    """``batch`` cut or right-padded (zeros: no attention, no loss) to ``width`` columns."""
    fields: dict[str, Any] = {
        key: fit_width(value, width)
        if isinstance(value, torch.Tensor) and value.dim() == 2
        else value
        for key, value in vars(batch).items()
    }
    return RolloutBatch(**fields)


def token_micro_batches(batch: RolloutBatch, budget: TokenBudget) -> list[RolloutBatch]:
    """``batch``'s rows in micro-batches of at most ``budget.max_tokens`` padded tokens
    (rows sorted by length, each micro-batch as wide as its longest row rounded up)."""
    return [with_width(batch.rows(rows), width) for rows, width in plan(batch, budget)]


def cut(
    batch: RolloutBatch, rows: int, budget: TokenBudget | None
) -> tuple[list[RolloutBatch], torch.Tensor]:
    """The micro-batches of ``batch`` for forward passes, and the order of the rows they
    hold (their rows, concatenated, are ``batch.rows(order)``).

    Args:
        batch: The rows.
        rows: Rows per micro-batch without a budget (``per_device_train_batch_size``).
        budget: Micro-batches by token budget; None: ``rows`` rows each.
    """
    if budget is None:
        return list(micro_batches(batch, rows)), torch.arange(len(batch))
    cuts = plan(batch, budget)
    parts = [with_width(batch.rows(index), width) for index, width in cuts]
    order = torch.cat([index for index, _ in cuts]) if cuts else torch.arange(0)
    return parts, order


def in_batch_order(rows: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``rows`` computed in ``order`` (as :func:`cut` gives), put back in the batch's order."""
    restored = torch.empty_like(rows)
    restored[order.to(rows.device)] = rows
    return restored


def padded_tokens(parts: list[RolloutBatch]) -> tuple[int, int]:
    """``(padded, real)``: the tokens the micro-batches' forward passes compute beyond
    the real ones (rows × width − real), and the real ones."""
    real = sum(int(part.attention_mask.sum()) for part in parts)
    total = sum(part.input_ids.shape[0] * part.input_ids.shape[1] for part in parts)
    return total - real, real


def token_budget(switch: bool, max_tokens: int | None, round_to: int) -> TokenBudget | None:
    """A role's dynamic batching (ROLL's ``use_dynamic_batching_in_*``,
    ``max_tokens_per_microbatch_*``, ``sequence_length_round_*``), or None when off."""
    return TokenBudget(max_tokens or 0, round_to) if switch else None
