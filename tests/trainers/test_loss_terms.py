"""SFT and TOPR terms, their mixing, and per-sample weights, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from agentgym.trainers.loss_terms import (
    group_difficulty,
    mix_losses,
    sample_weights,
    sft_loss,
    topr_loss,
    weight_rows,
)
from agentgym.trainers.losses import LOSS_AGG_MODES, aggregate_loss

NAN = float("nan")
LN2 = math.log(2.0)

# Row 0 is positive (score 1): A = 2 on t=0, 1; t=2 is off the mask (NaN must not leak).
# Row 1 is negative (score 0): A = -1 everywhere; ratios r = 2, 1, 0.5 -> taper 1, 1, 0.5.
LOGPROBS = torch.tensor([[-1.0, -2.0, NAN], [-1.0, -2.0, -3.0]])
OLD = torch.tensor([[-1.0, -2.0, NAN], [-1.0 - LN2, -2.0, -3.0 + LN2]])
ADVANTAGES = torch.tensor([[2.0, 2.0, NAN], [-1.0, -1.0, -1.0]])
SCORES = torch.tensor([1.0, 0.0])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])

# positive: -A * logp = 2, 4; negative: -taper * A * logp = -1, -2, -1.5
TOPR = torch.tensor([[2.0, 4.0, 0.0], [-1.0, -2.0, -1.5]])


def test_topr_per_token_by_hand() -> None:
    assert_close(topr_loss(LOGPROBS, OLD, ADVANTAGES, SCORES, MASK), TOPR)
    weighted = topr_loss(
        LOGPROBS, OLD, ADVANTAGES, SCORES, MASK, positive_weight=0.5, negative_weight=2.0
    )
    assert_close(weighted, torch.tensor([[1.0, 2.0, 0.0], [-2.0, -4.0, -3.0]]))


def test_sft_loss_is_the_positive_term_and_topr_with_use_topr_loss() -> None:
    positive_only = torch.tensor([[2.0, 4.0, 0.0], [0.0, 0.0, 0.0]])
    assert_close(sft_loss(LOGPROBS, OLD, ADVANTAGES, SCORES, MASK), positive_only)
    assert_close(sft_loss(LOGPROBS, OLD, ADVANTAGES, SCORES, MASK, use_topr_loss=True), TOPR)


# 2 + 4 - 1 - 2 - 1.5 = 1.5 over 5 tokens; row sums 6 and -4.5; row means 3 and -1.5
TOPR_AGGREGATES = {
    "token-mean": 1.5 / 5,
    "seq-mean-token-sum": (6.0 - 4.5) / 2,
    "seq-mean-token-mean": (3.0 - 1.5) / 2,
    "seq-mean-token-sum-norm": 1.5 / 3,
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_topr_aggregates_in_every_mode_by_hand(mode: str) -> None:
    per_token = topr_loss(LOGPROBS, OLD, ADVANTAGES, SCORES, MASK)
    loss = aggregate_loss(per_token, MASK, mode, norm_length=3)
    assert_close(loss, torch.tensor(TOPR_AGGREGATES[mode]))


def test_topr_gradient_does_not_flow_through_the_taper() -> None:
    logprobs = LOGPROBS.clone().requires_grad_(True)
    topr_loss(logprobs, OLD, ADVANTAGES, SCORES, MASK).sum().backward()
    # d/dlogp of -w * A * logp with w held fixed: -A on row 0, taper * 1 on row 1
    # (through the taper, t=2 would get r * logp + r = -1 instead of 0.5)
    assert logprobs.grad is not None
    assert_close(logprobs.grad, torch.tensor([[-2.0, -2.0, 0.0], [1.0, 1.0, 0.5]]))


def test_mix_losses_by_hand() -> None:
    rl, sft = torch.tensor(2.0), torch.tensor(3.0)
    assert_close(mix_losses(rl, sft, rl_loss_coef=0.5, sft_loss_coef=0.1), torch.tensor(1.3))
    assert_close(mix_losses(rl), rl)
    assert_close(mix_losses(rl, sft, rl_loss_coef=0.0, sft_loss_coef=1.0), sft)
    with pytest.raises(ValueError, match="needs the aggregated sft_loss"):
        mix_losses(rl, rl_loss_coef=1.0, sft_loss_coef=0.5)
    with pytest.raises(ValueError, match="rl_loss_coef must be"):
        mix_losses(rl, rl_loss_coef=-1.0)


# Sample weights ----------------------------------------------------------------------

# generated lengths 2, 4, 6
LENGTH_MASK = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
DIFFICULTY = torch.tensor([0.2, 0.6, 1.0])


def test_length_weights_by_hand() -> None:
    # (L - 2) / (4 + 1e-8) = 0, 0.5, 1 -> 1.5, 1.0, 0.5; they already sum to 3
    weights = sample_weights(LENGTH_MASK, length_loss_weight=True)
    assert_close(weights, torch.tensor([1.5, 1.0, 0.5]))


def test_difficulty_and_length_weights_by_hand() -> None:
    # difficulty 0.5 + 1.5 * [0.2, 0.6, 1.0] = 0.8, 1.4, 2.0; times 1.5, 1.0, 0.5 = 1.2, 1.4, 1.0
    # sum 3.6 -> times 3 / 3.6
    weights = sample_weights(
        LENGTH_MASK, difficulty=DIFFICULTY, difficulty_loss_weight=True, length_loss_weight=True
    )
    assert_close(weights, torch.tensor([1.2, 1.4, 1.0]) * 3 / 3.6)
    clamped = sample_weights(
        LENGTH_MASK, difficulty=torch.tensor([-1.0, 0.0, 5.0]), difficulty_loss_weight=True
    )
    # 0.5, 0.5, 2.0 -> sum 3
    assert_close(clamped, torch.tensor([0.5, 0.5, 2.0]))


def test_no_weight_option_gives_ones_and_equal_lengths_give_ones() -> None:
    assert_close(sample_weights(LENGTH_MASK), torch.ones(3))
    assert_close(sample_weights(torch.ones(4, 3), length_loss_weight=True), torch.ones(4))


def test_group_difficulty_is_the_groups_failure_rate_by_hand() -> None:
    # group 3: scores 1, -0.5, 0 -> 2 of 3 failed (score <= 0); group 1: 2, 5 -> 0; group 8: -1 -> 1
    scores = torch.tensor([1.0, -0.5, 2.0, 0.0, 5.0, -1.0])
    groups = torch.tensor([3, 3, 1, 3, 1, 8])
    assert_close(group_difficulty(scores, groups), torch.tensor([2 / 3, 2 / 3, 0, 2 / 3, 0, 1]))
    assert_close(group_difficulty(scores, groups, of=torch.tensor([8, 1])), torch.tensor([1.0, 0]))
    with pytest.raises(ValueError, match=r"group ids \[5\]"):
        group_difficulty(scores, groups, of=torch.tensor([3, 5]))


def test_difficulty_weight_without_difficulty_raises() -> None:
    with pytest.raises(ValueError, match="needs each sample's difficulty"):
        sample_weights(LENGTH_MASK, difficulty_loss_weight=True)


# Row 0 counts 1, 2 (weight 0.5); row 1 counts 3 (weight 1.5); 5 is off the mask.
ROW_LOSS = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
ROW_MASK = torch.tensor([[1, 1], [1, 0]])
ROW_WEIGHTS = torch.tensor([0.5, 1.5])
# ROLL's agg_loss with weights: weighted tokens 0.5, 1, 4.5
WEIGHTED_AGGREGATES = {
    "token-mean": 6.0 / 3,  # sum(loss * w) / tokens
    "seq-mean-token-sum": (1.5 + 4.5) / 2,  # sum(row sum * w) / rows
    "seq-mean-token-mean": (0.75 + 4.5) / 2,  # sum(row mean * w) / rows
    "seq-mean-token-sum-norm": 6.0 / 2,  # sum(row sum * w) / T
}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_weighted_rows_aggregate_like_rolls_weighted_agg_loss(mode: str) -> None:
    loss = aggregate_loss(weight_rows(ROW_LOSS, ROW_WEIGHTS), ROW_MASK, mode, norm_length=2)
    assert_close(loss, torch.tensor(WEIGHTED_AGGREGATES[mode]))


def test_weight_rows_rejects_a_wrong_shape() -> None:
    with pytest.raises(ValueError, match="weights"):
        weight_rows(ROW_LOSS, torch.ones(3))
