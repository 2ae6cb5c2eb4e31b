"""Trinity-RFT's OPMD (``adv_estimator: opmd``, ``pg_variant: opmd``) and TOPR's
per-token advantage split (``topr_advantage_threshold``): hand-computed advantages,
loss and gradient, the trainer's wiring, the config checks, and a 2-step run of the
tiny model (docs/training.md has the agreement with Trinity's own functions)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from torch.testing import assert_close

from agentgym.builders.recipe import default_grpo_config
from agentgym.errors import ConfigError
from agentgym.schema import TrainConfig, validate
from agentgym.trainers.advantages import compute_advantages
from agentgym.trainers.batch_prep import prepare_batch
from agentgym.trainers.grpo import TrainParts
from agentgym.trainers.normalization import opmd_advantages
from agentgym.trainers.pg_variants import PG_VARIANTS
from agentgym.trajectory import Trajectory, Turn

# Two groups: [1, 0, 0, 1] and [3, 1] (ids 7 and 2), and a group of one (id 5) scoring 2.
SCORES = torch.tensor([1.0, 0.0, 3.0, 0.0, 1.0, 1.0, 2.0])
GROUPS = torch.tensor([7, 7, 2, 7, 2, 7, 5])


def test_mean_baseline_by_hand() -> None:
    # group 7: mean 0.5; group 2: mean 2; a group of one: baseline 0 (Trinity's rule)
    out = opmd_advantages(SCORES, baseline="mean", tau=1.0, group_ids=GROUPS)
    assert_close(out, torch.tensor([0.5, -0.5, 1.0, -0.5, -1.0, 0.5, 2.0]))


def test_logavgexp_baseline_by_hand() -> None:
    # tau = 0.5: group 7: 0.5 * log((2 e^2 + 2) / 4) = 0.5 * log((e^2 + 1) / 2)
    #            group 2: 0.5 * log((e^6 + e^2) / 2)
    tau = 0.5
    b7 = 0.5 * math.log((math.e**2 + 1) / 2)  # 0.7169
    b2 = 0.5 * math.log((math.e**6 + math.e**2) / 2)  # 2.6619
    out = opmd_advantages(SCORES, baseline="logavgexp", tau=tau, group_ids=GROUPS)
    expected = [1 - b7, -b7, 3 - b2, -b7, 1 - b2, 1 - b7, 2.0]
    assert_close(out, torch.tensor(expected))
    assert b7 > 0.5 and b2 > 2.0  # a soft maximum: above the group mean
    # large tau tends to the mean, small tau to the group's maximum
    scores = SCORES.double()  # float64: tau * log(...) at tau = 1e4 scales float32's rounding
    wide = opmd_advantages(scores, baseline="logavgexp", tau=1e4, group_ids=GROUPS)
    mean = opmd_advantages(scores, baseline="mean", tau=1.0, group_ids=GROUPS)
    assert_close(wide, mean, atol=1e-4, rtol=0)  # baseline = mean + var / (2 tau) + ...
    sharp = opmd_advantages(scores, baseline="logavgexp", tau=1e-3, group_ids=GROUPS)
    # baseline -> max + tau * log(share of the max): group 7 has 2 of 4 at the max 1
    assert_close(sharp[0].item(), 1e-3 * math.log(2), atol=1e-9, rtol=0)


def test_logavgexp_does_not_overflow_and_other_groupings() -> None:
    big = torch.tensor([1000.0, 1002.0])
    out = opmd_advantages(big, baseline="logavgexp", tau=0.01, group_ids=torch.zeros(2))
    assert torch.isfinite(out).all()
    assert_close(out[1], torch.tensor(-0.01 * math.log(0.5)), atol=1e-4, rtol=0)
    batch = opmd_advantages(SCORES, baseline="mean", tau=1.0, grouping="batch")
    assert_close(batch, SCORES - SCORES.mean())
    tags = ["a", "b", "a", "b", "a", "b", "a"]  # a: 1, 3, 1, 2 (mean 1.75); b: 0, 0, 1
    by_tag = opmd_advantages(SCORES, baseline="mean", tau=1.0, grouping="inductive", tags=tags)
    assert_close(by_tag, torch.tensor([-0.75, -1 / 3, 1.25, -1 / 3, -0.75, 2 / 3, 0.25]))


def test_bad_opmd_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=re.escape("opmd_baseline_tau must be > 0, got 0.0")):
        opmd_advantages(SCORES, baseline="logavgexp", tau=0.0, group_ids=GROUPS)
    with pytest.raises(ValueError, match="logavgexp"):
        opmd_advantages(SCORES, baseline="logavg", tau=1.0, group_ids=GROUPS)
    with pytest.raises(ValueError, match="needs group_ids"):
        opmd_advantages(SCORES, baseline="mean", tau=1.0)


def test_opmd_estimator_spreads_the_advantage_on_generated_tokens() -> None:
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]])
    out = compute_advantages(
        "opmd",
        normalized_scores=torch.tensor([0.5, -2.0]),
        token_rewards=torch.zeros(2, 3),
        loss_mask=mask,
    )
    assert_close(out, torch.tensor([[0.0, 0.5, 0.5], [-2.0, 0.0, 0.0]]))


def test_opmd_loss_and_gradient_by_hand() -> None:
    # two rows: tokens (lp, A) = (-1, 2), (-2, 2) | (-0.5, -1), off-mask NaN; tau = 3
    # token-mean: -(2 * -1 + 2 * -2 + -1 * -0.5) / 3 / (1 + 3) = 5.5 / 12
    # d/d lp = -A / 3 / 4: [-1/6, -1/6, 1/12], 0 off the mask
    nan = float("nan")
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, nan]], requires_grad=True)
    old = torch.tensor([[-3.0, 0.0], [-0.5, nan]])  # far from logprobs: no ratio is used
    advantages = torch.tensor([[2.0, 2.0], [-1.0, nan]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, metrics = PG_VARIANTS["opmd"](logprobs, old, advantages, mask, opmd_tau=3.0)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert_close(loss, torch.tensor(5.5 / 12))
    assert_close(grad, torch.tensor([[-1 / 6, -1 / 6], [1 / 12, 0.0]]))
    assert_close(metrics["pg_loss"], torch.tensor(5.5 / 12))
    # seq-mean-token-mean: rows (-(-2 - 4) / 2 = 3, -0.5) -> mean 1.25, / 4
    loss, _ = PG_VARIANTS["opmd"](
        logprobs, old, advantages, mask, opmd_tau=3.0, loss_agg_mode="seq-mean-token-mean"
    )
    assert_close(loss, torch.tensor(1.25 / 4))
    with pytest.raises(ValueError, match=re.escape("opmd_tau must be >= 0, got -1.0")):
        PG_VARIANTS["opmd"](logprobs, old, advantages, mask, opmd_tau=-1.0)


def test_topr_split_by_advantage_as_trinity() -> None:
    # ratios r = e^(lp - old): 2, 0.5, 2; advantages 0.3, -1, 0.1; threshold 0.2:
    # token 0 (A > 0.2): weight 1; tokens 1 and 2 (A <= 0.2): clip(r, 0, 1) = 0.5, 1
    ln2 = math.log(2)
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = logprobs.detach() - torch.tensor([[ln2, -ln2, ln2]])
    advantages = torch.tensor([[0.3, -1.0, 0.1]])
    mask = torch.ones(1, 3)
    loss, metrics = PG_VARIANTS["topr"](
        logprobs, old, advantages, mask, topr_positive_weight=1.0, topr_negative_weight=1.0,
        topr_advantage_threshold=0.2,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert_close(grad, torch.tensor([[-0.3, 0.5, -0.1]]) / 3)
    assert_close(loss, torch.tensor(-(0.3 * -1.0 + 0.5 * -1.0 * -2.0 + 0.1 * -0.5) / 3))
    assert_close(metrics["topr_positive_frac"], torch.tensor(1 / 3))
    # ROLL's split by score (None) on the same tokens with a positive score: no taper at all
    loss, _ = PG_VARIANTS["topr"](
        logprobs, old, advantages, mask, topr_positive_weight=1.0, topr_negative_weight=1.0,
        topr_advantage_threshold=None, scores=torch.tensor([1.0]),
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert_close(grad, -advantages / 3)


def trajectory(group: int, score: float, tokens: list[int]) -> Trajectory:
    turn = Turn([5, 6], tokens, [-1.0] * len(tokens), "", "stop", reward=score)
    return Trajectory(
        "frozen_lake", "tag", group_id=group, seed=group, policy_version=0, turns=[turn],
        score=score,
    )  # fmt: skip


def test_prepare_batch_gives_opmd_advantages_by_hand() -> None:
    # group 0: scores 1, 0, 0 (mean 1/3); group 1: one sample scoring 2 (baseline 0)
    settings = default_grpo_config(
        adv_estimator="opmd", opmd_baseline="mean", normalization="identity",
        drop_zero_variance_groups=False, step_advantage_weight=0.0, micro_batch_size=2,
    )  # fmt: skip
    played = [
        trajectory(0, 1.0, [7, 8]), trajectory(0, 0.0, [9]), trajectory(0, 0.0, [7]),
        trajectory(1, 2.0, [8, 9]),
    ]  # fmt: skip
    parts = cast(
        TrainParts,
        SimpleNamespace(
            strategy=None, pad_token_id=0, critic=None, kl_controller=None, reward_moments=None
        ),
    )
    batch = prepare_batch(settings, parts, played, {})
    assert batch is not None and batch.advantages is not None
    rows = [row[mask.bool()] for row, mask in zip(batch.advantages, batch.loss_mask, strict=True)]
    third = 1 / 3
    expected = [[2 * third] * 2, [-third], [-third], [2.0, 2.0]]
    for row, values in zip(rows, expected, strict=True):
        assert_close(row, torch.tensor(values))


def checked(**values: Any) -> TrainConfig:
    return validate({**TrainConfig().model_dump(), **values})


def test_config_checks_name_the_fix() -> None:
    with pytest.raises(ConfigError, match=re.escape("set reward_normalization.method=identity")):
        checked(adv_estimator="opmd")
    with pytest.raises(
        ConfigError, match=re.escape("opmd_baseline=logavgexp is read by adv_estimator=opmd")
    ):
        checked(opmd_baseline="logavgexp")
    with pytest.raises(
        ConfigError, match=re.escape("opmd_tau=0.5 is read by pg_variant=opmd only")
    ):
        checked(opmd_tau=0.5)
    with pytest.raises(
        ConfigError, match=re.escape("topr_advantage_threshold=0.0 is read by pg_variant")
    ):
        checked(topr_advantage_threshold=0.0)
    config = checked(
        adv_estimator="opmd", opmd_baseline="logavgexp", opmd_baseline_tau=0.5,
        reward_normalization={"grouping": "state", "method": "identity"}, pg_variant="opmd",
        opmd_tau=2.0,
    )  # fmt: skip
    assert (config.adv_estimator, config.opmd_baseline, config.opmd_tau) == (
        "opmd", "logavgexp", 2.0,
    )  # fmt: skip


# The 2-step tiny-model run from a Trinity file with algorithm_type: opmd is in
# tests/test_trinity_config.py (test_opmd_from_a_trinity_file_trains_two_steps).
