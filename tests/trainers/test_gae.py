"""GAE over generated tokens and the clipped value loss, against hand-computed values."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from agentgym.trainers.gae import gae_advantages, value_loss
from agentgym.trainers.losses import LOSS_AGG_MODES

NAN = float("nan")


def test_gae_on_one_contiguous_turn_by_hand() -> None:
    # Position 0 is the prompt; 1..3 are generated; the reward sits on the last token.
    # gamma = lambd = 0.5:
    #   t=3: delta = 1 + 0.5*0 - 2 = -1            A = -1
    #   t=2: delta = 0 + 0.5*2 - 1 = 0             A = 0 + 0.25*(-1) = -0.25
    #   t=1: delta = 0 + 0.5*1 - 0.5 = 0           A = 0 + 0.25*(-0.25) = -0.0625
    # returns = A + V: 0.4375, 0.75, 1.0
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[9.0, 0.5, 1.0, 2.0]])
    mask = torch.tensor([[0, 1, 1, 1]])
    out = gae_advantages(rewards, values, mask, gamma=0.5, lambd=0.5)
    assert_close(out.advantages, torch.tensor([[0.0, -0.0625, -0.25, -1.0]]))
    assert_close(out.returns, torch.tensor([[0.0, 0.4375, 0.75, 1.0]]))


def test_gae_skips_an_observation_gap_by_hand() -> None:
    # Generated: t=1, 2 (turn 1, reward 0.5 on t=2) and t=5, 6 (turn 2, reward 1 on t=6).
    # t=3, 4 are an observation (a stray reward and a NaN value there must not count),
    # t=7 is padding. The step after t=2 is t=5. gamma = lambd = 0.5:
    #   t=6: delta = 1 + 0 - 4 = -3                  A = -3
    #   t=5: delta = 0 + 0.5*4 - 2 = 0               A = 0 + 0.25*(-3) = -0.75
    #   t=2: delta = 0.5 + 0.5*2 - 1 = 0.5           A = 0.5 + 0.25*(-0.75) = 0.3125
    #   t=1: delta = 0 + 0.5*1 - 1 = -0.5            A = -0.5 + 0.25*0.3125 = -0.421875
    # returns = A + V: 0.578125, 1.3125, 1.25, 1.0
    rewards = torch.tensor([[0.0, 0.0, 0.5, 7.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[5.0, 1.0, 1.0, 3.0, NAN, 2.0, 4.0, NAN]])
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 0]])
    out = gae_advantages(rewards, values, mask, gamma=0.5, lambd=0.5)
    assert_close(
        out.advantages, torch.tensor([[0.0, -0.421875, 0.3125, 0.0, 0.0, -0.75, -3.0, 0.0]])
    )
    assert_close(out.returns, torch.tensor([[0.0, 0.578125, 1.3125, 0.0, 0.0, 1.25, 1.0, 0.0]]))


def test_gae_with_gamma_and_lambd_one_is_reward_to_go_minus_value() -> None:
    rewards = torch.tensor([[0.0, 2.0, 0.0, 0.0, 3.0]])
    values = torch.tensor([[0.0, 1.0, 0.0, 1.5, 0.5]])
    mask = torch.tensor([[0, 1, 0, 1, 1]])
    out = gae_advantages(rewards, values, mask, gamma=1.0, lambd=1.0)
    # rewards to go over the generated tokens: 5, 3, 3
    assert_close(out.advantages, torch.tensor([[0.0, 4.0, 0.0, 1.5, 2.5]]))
    assert_close(out.returns, torch.tensor([[0.0, 5.0, 0.0, 3.0, 3.0]]))


def _reference_gae_contiguous(
    rewards: list[float], values: list[float], gamma: float, lambd: float
) -> tuple[list[float], list[float]]:
    """verl's compute_gae_advantage_return on one contiguous response, written as a plain loop."""
    n = len(rewards)
    advantages = [0.0] * n
    last = 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lambd * last
        advantages[t] = last
    return advantages, [a + v for a, v in zip(advantages, values, strict=True)]


def test_gae_equals_the_plain_loop_on_random_contiguous_masks() -> None:
    generator = torch.Generator().manual_seed(0)
    batch, width, gamma, lambd = 6, 12, 0.9, 0.8
    rewards = torch.randn(batch, width, generator=generator, dtype=torch.float64)
    values = torch.randn(batch, width, generator=generator, dtype=torch.float64)
    mask = torch.zeros(batch, width, dtype=torch.long)
    spans = [(0, 12), (3, 12), (2, 7), (5, 6), (1, 1), (4, 10)]  # prompt | generated | padding
    for row, (start, end) in enumerate(spans):
        mask[row, start:end] = 1
    out = gae_advantages(rewards, values, mask, gamma=gamma, lambd=lambd)
    expected_adv = torch.zeros_like(rewards)
    expected_ret = torch.zeros_like(rewards)
    for row, (start, end) in enumerate(spans):
        adv, ret = _reference_gae_contiguous(
            rewards[row, start:end].tolist(), values[row, start:end].tolist(), gamma, lambd
        )
        expected_adv[row, start:end] = torch.tensor(adv, dtype=torch.float64)
        expected_ret[row, start:end] = torch.tensor(ret, dtype=torch.float64)
    assert_close(out.advantages, expected_adv)
    assert_close(out.returns, expected_ret)


def test_gae_rejects_bad_inputs() -> None:
    ones = torch.ones(1, 3)
    with pytest.raises(ValueError, match="lambd must be in"):
        gae_advantages(ones, ones, ones, gamma=1.0, lambd=1.5)
    with pytest.raises(ValueError, match=r"one \[B, T\] shape"):
        gae_advantages(ones, torch.ones(1, 4), ones, gamma=1.0, lambd=1.0)


# Value loss --------------------------------------------------------------------------

# Row 0: V = 1, 2, 3 with V_old = 1.5 and R = 2, 0, 3; row 1 counts only V = 0 vs R = 1.
VALUES = torch.tensor([[1.0, 2.0, 3.0], [0.0, NAN, 5.0]])
OLD = torch.tensor([[1.5, 1.5, 1.5], [0.0, 0.0, 0.0]])
RETURNS = torch.tensor([[2.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


def test_value_loss_without_clip_by_hand() -> None:
    # squared errors: row 0: 1, 4, 0 (mean 5/3); row 1: 1 (mean 1) -> seq-mean 4/3, times 0.5
    loss, metrics = value_loss(VALUES, OLD, RETURNS, MASK)
    assert_close(loss, torch.tensor(2 / 3))
    assert "vf_clipfrac" not in metrics
    assert_close(metrics["vf_error"], torch.tensor(6 / 4))
    assert_close(metrics["vpred_mean"], torch.tensor(6 / 4))


def test_value_loss_with_clip_by_hand() -> None:
    # c = 0.2: row 0 clipped V = 1.3, 1.7, 1.7 -> (V_c - R)^2 = 0.49, 2.89, 1.69
    #   max with 1, 4, 0 -> 1, 4, 1.69 (only the third token takes the clipped term)
    # row 1: V = 0 stays inside [-0.2, 0.2] -> 1
    # token-mean: 0.5 * (1 + 4 + 1.69 + 1) / 4
    loss, metrics = value_loss(
        VALUES, OLD, RETURNS, MASK, value_clip=0.2, loss_agg_mode="token-mean"
    )
    assert_close(loss, torch.tensor(0.5 * 7.69 / 4))
    assert_close(metrics["vf_clipfrac"], torch.tensor(1 / 4))
    # seq-mean-token-mean: 0.5 * (6.69 / 3 + 1) / 2
    loss, _ = value_loss(VALUES, OLD, RETURNS, MASK, value_clip=0.2)
    assert_close(loss, torch.tensor(0.5 * (6.69 / 3 + 1) / 2))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_micro_batch_shares_add_up(mode: str) -> None:
    full, _ = value_loss(
        VALUES, OLD, RETURNS, MASK, value_clip=0.2, loss_agg_mode=mode, norm_length=3
    )
    parts = [
        value_loss(
            VALUES[rows], OLD[rows], RETURNS[rows], MASK[rows], value_clip=0.2,
            loss_agg_mode=mode, norm_length=3, num_tokens=MASK.sum(), num_seqs=2,
        )[0]
        for rows in ([0], [1])
    ]  # fmt: skip
    assert_close(sum(parts), full)


def test_value_loss_gradient_stops_at_the_clip() -> None:
    values = torch.tensor([[3.0]], requires_grad=True)
    old, returns = torch.tensor([[1.5]]), torch.tensor([[3.0]])
    loss, _ = value_loss(values, old, returns, torch.ones(1, 1), value_clip=0.2)
    loss.backward()
    # the clipped term (1.7 - 3)^2 wins and does not depend on V
    assert values.grad is not None
    assert_close(values.grad, torch.zeros(1, 1))


def test_value_loss_rejects_a_non_positive_clip() -> None:
    with pytest.raises(ValueError, match="value_clip must be positive"):
        value_loss(VALUES, OLD, RETURNS, MASK, value_clip=0.0)
