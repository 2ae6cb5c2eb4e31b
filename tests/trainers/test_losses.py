"""Losses, KL penalties and importance weights, against hand-computed values; a sign test."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

from agentgym.trainers.advantages import compute_advantages
from agentgym.trainers.losses import (
    KL_PENALTIES,
    LOSS_AGG_MODES,
    aggregate_loss,
    entropy_from_logits,
    kl_penalty,
    logprob_gap_metrics,
    policy_loss,
    truncated_is_weights,
)
from agentgym.trainers.normalization import normalize_rewards
from agentgym.trajectory import RolloutBatch, Trajectory, Turn

NAN, INF = float("nan"), float("inf")


def scalar(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


# Aggregation -----------------------------------------------------------------------

# Row 0 counts 1, 2; row 1 counts 5, 6, 7, 8; row 2 counts nothing. Off the mask sit
# values that must never leak: inf at [0, 3], NaN at [2, 0].
LOSS = torch.tensor([[1.0, 2.0, 3.0, INF], [5.0, 6.0, 7.0, 8.0], [NAN, 10.0, 11.0, 12.0]])
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])

AGGREGATES = {
    # 1 + 2 + 5 + 6 + 7 + 8 = 29 over 6 tokens
    "token-mean": 29 / 6,
    # row sums 3 and 26, averaged over the 2 rows that have tokens
    "seq-mean-token-sum": 29 / 2,
    # row means 1.5 and 6.5 -> 4
    "seq-mean-token-mean": 4.0,
    # the token sum over all rows over the constant 4, with no division by the rows
    "seq-mean-token-sum-norm": 29 / 4,
}
NORM = 4  # seq-mean-token-sum-norm's constant (the others ignore it)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_every_loss_agg_mode_by_hand_with_a_ragged_mask(mode: str) -> None:
    assert_close(aggregate_loss(LOSS, MASK, mode, norm_length=NORM), scalar(AGGREGATES[mode]))


def test_sum_norm_uses_the_given_length_and_counts_override_the_denominators() -> None:
    assert_close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=10), scalar(2.9))
    assert_close(aggregate_loss(LOSS, MASK, "token-mean", num_tokens=12), scalar(29 / 12))
    assert_close(aggregate_loss(LOSS, MASK, "seq-mean-token-sum", num_seqs=4), scalar(29 / 4))
    assert_close(aggregate_loss(LOSS, MASK, "seq-mean-token-mean", num_seqs=4), scalar(8 / 4))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_with_global_counts_add_up_to_the_full_batch(mode: str) -> None:
    full = aggregate_loss(LOSS, MASK, mode, norm_length=NORM)
    tokens, seqs = MASK.sum(), (MASK.sum(-1) > 0).sum()  # 6 tokens, 2 sequences
    parts = [
        aggregate_loss(
            LOSS[rows], MASK[rows], mode, norm_length=NORM, num_tokens=tokens, num_seqs=seqs
        )
        for rows in ([0], [1, 2])
    ]
    assert_close(sum(parts), full)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_an_empty_mask_gives_zero_and_a_finite_gradient(mode: str) -> None:
    loss = torch.tensor([[1.0, NAN], [INF, 4.0]], requires_grad=True)
    out = aggregate_loss(loss, torch.zeros(2, 2), mode, norm_length=NORM)
    out.backward()
    assert out.item() == 0.0
    assert loss.grad is not None and torch.equal(loss.grad, torch.zeros(2, 2))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda b: st.tuples(
            st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=b, max_size=b),
            st.lists(st.floats(-30, 30), min_size=b * 6, max_size=b * 6),
        )
    ),
    st.sampled_from(LOSS_AGG_MODES),
)
def test_policy_loss_is_finite_for_any_mask(data: tuple[list, list], mode: str) -> None:
    mask = torch.tensor(data[0], dtype=torch.long)
    values = torch.tensor(data[1]).view(mask.shape)
    logprobs = values.clone().requires_grad_(True)
    loss, metrics = policy_loss(
        logprobs,
        -values.flip(0),
        values.flip(1),
        mask,
        loss_agg_mode=mode,
        dual_clip=3.0,
        norm_length=NORM,
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(v) for v in metrics.values())
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all()
    assert (logprobs.grad[mask == 0] == 0).all()


def test_unknown_mode_suggests_a_close_match() -> None:
    with pytest.raises(
        ValueError, match=r"loss_agg_mode='token_mean' is not valid\. Did you mean 'token-mean'"
    ):
        aggregate_loss(LOSS, MASK, "token_mean")
    with pytest.raises(ValueError, match="must both be"):
        aggregate_loss(LOSS, MASK[:, :2], "token-mean")
    with pytest.raises(ValueError, match="needs a positive constant norm_length, got 0"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=0)
    with pytest.raises(ValueError, match="never a tensor's width"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm")


def test_sum_norm_matches_roll_and_verl_by_hand() -> None:
    # ROLL's and verl's agg_loss: loss = mask = ones(2, 3), constant 3 -> 6 / 3 = 2.0
    ones = torch.ones(2, 3)
    assert_close(aggregate_loss(ones, ones, "seq-mean-token-sum-norm", norm_length=3), scalar(2.0))


# PPO clip ---------------------------------------------------------------------------

LOW, HIGH = 0.25, 0.5  # bounds 0.75 and 1.5, both exact in float32 (exp(log(r)) == r)


def one_token(
    ratio: float,
    advantage: float,
    *,
    clip_ratio_low: float = LOW,
    clip_ratio_high: float = HIGH,
    dual_clip: float | None = None,
) -> tuple[float, float, dict[str, float]]:
    """Loss, d loss / d logprob and metrics for one token at ``ratio`` (old logprob 0)."""
    logprobs = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, metrics = policy_loss(
        logprobs,
        torch.zeros(1, 1),
        torch.tensor([[advantage]]),
        torch.ones(1, 1),
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        dual_clip=dual_clip,
    )
    loss.backward()
    assert logprobs.grad is not None
    return loss.item(), logprobs.grad.item(), {k: v.item() for k, v in metrics.items()}


# d(-A r)/d logprob = -A r where the unclipped term is active, 0 where the clipped one is.
@pytest.mark.parametrize(
    ("ratio", "advantage", "loss", "grad", "clipfrac"),
    [
        (1.0, 2.0, -2.0, -2.0, 0.0),  # on-policy: -A
        (1.5, 1.0, -1.5, -1.5, 0.0),  # exactly at 1 + high: still unclipped, full gradient
        (1.5 * (1 - 1e-3), 1.0, -1.4985, -1.4985, 0.0),  # just inside
        (1.5 * (1 + 1e-3), 1.0, -1.5, 0.0, 1.0),  # just outside: clamped, no gradient
        (3.0, 1.0, -1.5, 0.0, 1.0),  # far outside
        (0.5, 1.0, -0.5, -0.5, 0.0),  # A > 0 below 1 - low: never clipped (pessimistic side)
        (0.75, -1.0, 0.75, 0.75, 0.0),  # exactly at 1 - low
        (0.75 * (1 + 1e-3), -1.0, 0.75075, 0.75075, 0.0),  # just inside
        (0.75 * (1 - 1e-3), -1.0, 0.75, 0.0, 1.0),  # just outside: clamped
        (2.0, -1.0, 2.0, 2.0, 0.0),  # A < 0 above 1 + high: never clipped
    ],
)
def test_clip_edges(
    ratio: float, advantage: float, loss: float, grad: float, clipfrac: float
) -> None:
    got_loss, got_grad, metrics = one_token(ratio, advantage)
    assert got_loss == pytest.approx(loss, rel=1e-5)
    assert got_grad == pytest.approx(grad, rel=1e-5, abs=0.0)
    assert metrics["clipfrac"] == clipfrac
    side = "clipfrac_high" if advantage > 0 else "clipfrac_low"
    assert metrics[side] == clipfrac


def test_low_and_high_clip_are_separate() -> None:
    # A > 0, ratio 1.3: inside high = 0.5 (loss -1.3), clipped by high = 0.2 (loss -1.2)
    assert one_token(1.3, 1.0, clip_ratio_high=0.5)[0] == pytest.approx(-1.3)
    assert one_token(1.3, 1.0, clip_ratio_high=0.2)[0] == pytest.approx(-1.2)
    # ...and clip_ratio_low does not matter for it
    assert one_token(1.3, 1.0, clip_ratio_high=0.2, clip_ratio_low=0.9)[0] == pytest.approx(-1.2)
    # A < 0, ratio 0.78: inside low = 0.25 (loss 0.78), clipped by low = 0.2 (loss 0.8)
    assert one_token(0.78, -1.0, clip_ratio_low=0.25)[0] == pytest.approx(0.78)
    assert one_token(0.78, -1.0, clip_ratio_low=0.2)[0] == pytest.approx(0.8)
    assert one_token(0.78, -1.0, clip_ratio_low=0.2, clip_ratio_high=5.0)[0] == pytest.approx(0.8)


def test_dual_clip_bounds_negative_advantages_by_c_times_abs_a() -> None:
    # A = -1, ratio 100: PPO gives max(100, 1.5) = 100; dual-clip c = 3 bounds it to 3, no gradient
    assert one_token(100.0, -1.0)[0] == pytest.approx(100.0)
    loss, grad, metrics = one_token(100.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0)
    assert (grad, metrics["dual_clipfrac"]) == (0.0, 1.0)
    # A = -2, ratio 2: PPO gives 4 < c |A| = 6, untouched, gradient -A r = 4
    loss, grad, metrics = one_token(2.0, -2.0, dual_clip=3.0)
    assert (loss, grad) == pytest.approx((4.0, 4.0))
    assert metrics["dual_clipfrac"] == 0.0
    # A = -1, ratio exactly 3 = c: at the bound, not counted as dual-clipped
    loss, _, metrics = one_token(3.0, -1.0, dual_clip=3.0)
    assert loss == pytest.approx(3.0)
    assert metrics["dual_clipfrac"] == 0.0


def test_dual_clip_leaves_positive_advantages_alone() -> None:
    # A = +1, ratio 100: max(-100, -1.5) = -1.5 with or without dual-clip
    assert one_token(100.0, 1.0, dual_clip=3.0)[:2] == one_token(100.0, 1.0)[:2]
    assert one_token(100.0, 1.0, dual_clip=3.0)[0] == pytest.approx(-1.5)
    assert one_token(100.0, 1.0, dual_clip=3.0)[2]["dual_clipfrac"] == 0.0


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0])
def test_dual_clip_must_exceed_one(c: float) -> None:
    with pytest.raises(ValueError, match=f"must be greater than 1, got {c}"):
        one_token(1.0, 1.0, dual_clip=c)


def test_negative_clip_ratios_and_shape_mismatches_raise() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        one_token(1.0, 1.0, clip_ratio_low=-0.1)
    with pytest.raises(ValueError, match=r"advantages must have the shape of logprobs \(2, 3\)"):
        policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))


def test_policy_loss_batch_metrics_by_hand() -> None:
    # ratios [e, 1, 1/e] on the mask, advantages [1, 1, -1], a 4th token off the mask.
    # per-token losses with clip 0.2: A=1, r=e -> max(-e, -1.2) = -1.2 (clipped);
    # A=1, r=1 -> -1; A=-1, r=1/e=0.368 -> max(0.368, 0.8) = 0.8 (clipped).
    # token-mean: (-1.2 - 1 + 0.8) / 3 = -1.4/3; clipfrac 2/3;
    # approx_kl = mean(old - new) = mean(-1, 0, 1) = 0; ratio_mean = (e + 1 + 1/e) / 3
    logprobs = torch.tensor([[1.0, 0.0, -1.0, 50.0]])
    old = torch.tensor([[0.0, 0.0, 0.0, NAN]])
    advantages = torch.tensor([[1.0, 1.0, -1.0, NAN]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = policy_loss(logprobs, old, advantages, mask)
    assert_close(loss, scalar(-1.4 / 3))
    e = math.e
    expected = {
        "pg_loss": -1.4 / 3,
        "clipfrac": 2 / 3,
        "clipfrac_high": 1 / 3,
        "clipfrac_low": 1 / 3,
        "approx_kl": 0.0,
        "ratio_mean": (e + 1 + 1 / e) / 3,
        "ratio_min": 1 / e,
        "ratio_max": e,
    }
    assert {k: pytest.approx(v, abs=1e-6) for k, v in expected.items()} == {
        k: v.item() for k, v in metrics.items()
    }


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_no_gradient_reaches_positions_off_the_mask(mode: str) -> None:
    # Off the mask: NaN advantages, inf old logprobs; they must not reach loss or gradient.
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -4.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.1, INF, -0.4], [-0.3, -4.0, NAN]])
    advantages = torch.tensor([[1.0, NAN, -0.5], [2.0, 1.0, NAN]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    loss, _ = policy_loss(logprobs, old, advantages, mask, loss_agg_mode=mode, norm_length=NORM)
    loss.backward()
    assert torch.isfinite(loss)
    assert logprobs.grad is not None
    assert (logprobs.grad[mask == 0] == 0).all()
    assert (logprobs.grad[mask == 1] != 0).all()


# Importance sampling ----------------------------------------------------------------


def test_truncated_is_weights_cap_exactly_and_one_off_the_mask() -> None:
    # exp(trainer - engine) = [1, 2, 10, e^100]; cap 5 -> [1, 2, 5 (exactly), off-mask -> 1]
    trainer = torch.tensor([[0.0, math.log(2.0), math.log(10.0), 100.0]], requires_grad=True)
    engine = torch.zeros(1, 4, requires_grad=True)
    weights = truncated_is_weights(trainer, engine, torch.tensor([[1, 1, 1, 0]]), cap=5.0)
    assert_close(weights, torch.tensor([[1.0, 2.0, 5.0, 1.0]]))
    assert weights[0, 2].item() == 5.0
    assert not weights.requires_grad


def test_is_weights_scale_the_loss_without_gradient() -> None:
    # A = 1, ratio 1 on three tokens, weights [1, 2, 5]: token-mean loss -(1 + 2 + 5) / 3
    logprobs = torch.zeros(1, 3, requires_grad=True)
    weights = torch.tensor([[1.0, 2.0, 5.0]], requires_grad=True)
    loss, metrics = policy_loss(
        logprobs, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3), is_weights=weights
    )
    loss.backward()
    assert_close(loss, scalar(-8 / 3))
    assert metrics["is_weight_mean"].item() == pytest.approx(8 / 3)
    assert weights.grad is None
    assert logprobs.grad is not None
    assert_close(logprobs.grad, torch.tensor([[-1.0, -2.0, -5.0]]) / 3)


def test_is_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="cap must be positive"):
        truncated_is_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), cap=0.0)


def test_logprob_gap_metrics_by_hand() -> None:
    # diffs on the mask: -0.5, 0, -1 -> |.| mean 0.5, max 1, signed mean -0.5; the 9 is off the mask
    trainer = torch.tensor([[0.0, -1.0, -2.0, 9.0]])
    engine = torch.tensor([[0.5, -1.0, -1.0, 0.0]])
    metrics = logprob_gap_metrics(trainer, engine, torch.tensor([[1, 1, 1, 0]]))
    assert {k: v.item() for k, v in metrics.items()} == {
        "logprob_abs_diff_mean": pytest.approx(0.5),
        "logprob_abs_diff_max": 1.0,
        "logprob_diff_mean": pytest.approx(-0.5),
    }


# KL and entropy ---------------------------------------------------------------------

# d = logprobs - ref = [1, 0, -2, -5]
KL_LOGPROBS = torch.tensor([[0.0, -1.0, -2.0, -5.0]])
KL_REF = torch.tensor([[-1.0, -1.0, 0.0, 0.0]])
KL_EXPECTED = {
    "kl": [1.0, 0.0, -2.0, -5.0],
    "abs": [1.0, 0.0, 2.0, 5.0],
    "mse": [0.5, 0.0, 2.0, 12.5],
    # exp(-d) + d - 1: e^-1 = 0.367879, 0, e^2 - 3 = 4.389056, e^5 - 6 = 142.4 -> clamped to 10
    "low_var_kl": [math.exp(-1), 0.0, math.exp(2) - 3, 10.0],
}


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl"])
def test_kl_penalties_by_hand(kind: str) -> None:
    assert_close(kl_penalty(KL_LOGPROBS, KL_REF, kind), torch.tensor([KL_EXPECTED[kind]]))


@pytest.mark.parametrize(("alias", "kind"), [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")])
def test_kl_aliases(alias: str, kind: str) -> None:
    assert torch.equal(
        kl_penalty(KL_LOGPROBS, KL_REF, alias), kl_penalty(KL_LOGPROBS, KL_REF, kind)
    )


def test_full_kl_from_logits_by_hand() -> None:
    # p = softmax([0, 0]) = [1/2, 1/2], q = softmax([log 3, 0]) = [3/4, 1/4]:
    # KL(p || q) = 1/2 ln(2/3) + 1/2 ln(2) = 1/2 ln(4/3) = 0.143841; identical logits -> 0
    logits = torch.tensor([[[0.0, 0.0], [0.3, -1.0]]])
    ref_logits = torch.tensor([[[math.log(3.0), 0.0], [0.3, -1.0]]])
    out = kl_penalty(
        torch.zeros(1, 2), torch.zeros(1, 2), "full", logits=logits, ref_logits=ref_logits
    )
    assert_close(out, torch.tensor([[0.5 * math.log(4 / 3), 0.0]]))


def test_full_kl_needs_logits_and_kinds_are_checked() -> None:
    with pytest.raises(ValueError, match="'full' needs logits and ref_logits"):
        kl_penalty(KL_LOGPROBS, KL_REF, "full")
    with pytest.raises(ValueError, match="must both be"):
        kl_penalty(
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            "full",
            logits=torch.zeros(1, 3, 4),
            ref_logits=torch.zeros(1, 3, 4),
        )
    with pytest.raises(
        ValueError, match=r"kl_penalty='low-var-kl' is not valid\. Did you mean 'low_var_kl'"
    ):
        kl_penalty(KL_LOGPROBS, KL_REF, "low-var-kl")
    assert "full" in KL_PENALTIES


def test_entropy_from_logits_by_hand() -> None:
    # uniform over 4: ln 4 = 1.386294; softmax([log 3, 0]) = [3/4, 1/4]:
    # -(3/4 ln 3/4 + 1/4 ln 1/4) = 0.562335; a near one-hot: ~0
    assert_close(entropy_from_logits(torch.zeros(1, 1, 4)), torch.tensor([[math.log(4)]]))
    two = torch.tensor([[[math.log(3.0), 0.0]]])
    assert_close(
        entropy_from_logits(two), torch.tensor([[-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]])
    )
    assert entropy_from_logits(torch.tensor([[[100.0, 0.0, 0.0]]])).item() == pytest.approx(
        0.0, abs=1e-6
    )


# Sign test --------------------------------------------------------------------------


class BigramLM(nn.Module):
    """A tiny LM over 16 tokens: the next token depends on the current one only."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)
        with torch.no_grad():
            self.embed.weight.copy_(0.5 * torch.randn(16, 8, generator=generator))
            self.head.weight.copy_(0.5 * torch.randn(16, 8, generator=generator))
            self.head.bias.zero_()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))  # [B, T, V]

    def token_logprobs(self, ids: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` log p(ids[:, t] | ids[:, t-1]), 0 at t = 0 (as RolloutBatch.old_logprobs)."""
        logprobs = torch.log_softmax(self(ids[:, :-1]), dim=-1)  # [B, T-1, V]
        return nn.functional.pad(logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1), (1, 0))


def trajectory(prompt: list[int], response: list[int], reward: float) -> Trajectory:
    turn = Turn(prompt, response, [0.0] * len(response), "", "stop", reward=reward)
    return Trajectory("test", "tag", group_id=0, seed=0, turns=[turn], score=reward)


# One GRPO group of two. The winner answers 2 -> 3 -> 4 -> 5. The loser's *prompt*
# repeats those same transitions four times (off the mask), and it answers 6 7 8.
# A loss that leaked past the mask would push the winner's transitions down.
SIGN_BATCH = RolloutBatch.from_trajectories(
    [trajectory([1, 2], [3, 4, 5], 1.0), trajectory([2, 3, 4, 5] * 4 + [2], [6, 7, 8], 0.0)],
    pad_token_id=0,
)


def train(advantages: torch.Tensor, mask: torch.Tensor, steps: int = 20) -> list[float]:
    """PPO epochs on the fixed batch; the change of each response's total logprob."""
    model = BigramLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ids, loss_mask = SIGN_BATCH.input_ids, SIGN_BATCH.loss_mask
    with torch.no_grad():
        old = model.token_logprobs(ids)
    for _ in range(steps):
        loss, _ = policy_loss(model.token_logprobs(ids), old, advantages, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        new = model.token_logprobs(ids)
    return ((new - old) * loss_mask).sum(-1).tolist()


def normalized_scores() -> torch.Tensor:
    return normalize_rewards(
        SIGN_BATCH.scores, grouping="state", method="mean_std", group_ids=SIGN_BATCH.group_ids
    )  # scores [1, 0] -> [+0.707, -0.707]


def grpo_advantages() -> torch.Tensor:
    return compute_advantages(
        "grpo",
        normalized_scores=normalized_scores(),
        token_rewards=SIGN_BATCH.token_rewards,
        loss_mask=SIGN_BATCH.loss_mask,
    )


def test_updates_raise_positive_and_lower_negative_responses() -> None:
    winner, loser = train(grpo_advantages(), SIGN_BATCH.loss_mask)
    assert winner > 0.3
    assert loser < -0.3


def test_sign_test_fails_when_the_sign_is_wrong() -> None:
    winner, loser = train(-grpo_advantages(), SIGN_BATCH.loss_mask)
    assert winner < -0.3
    assert loser > 0.3


def test_masked_out_positions_do_not_drive_the_update() -> None:
    # Advantages on every token, prompts included: only the mask keeps the loser's
    # prompt (the winner's transitions, four times, with A < 0) out of the loss.
    everywhere = normalized_scores()[:, None].expand_as(SIGN_BATCH.loss_mask).float()  # [B, T]
    winner, loser = train(everywhere, SIGN_BATCH.loss_mask)
    assert winner > 0.3
    assert loser < -0.3
    # With a wrong mask (every real token), the same batch lowers the winner.
    winner, _ = train(everywhere, SIGN_BATCH.attention_mask)
    assert winner < -0.3
