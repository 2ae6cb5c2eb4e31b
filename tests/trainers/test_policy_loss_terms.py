"""ROLL's extra policy-loss keys through the recipe's PolicyLoss and update_policy,
against hand-computed values: sft_loss_coef with rl_loss_coef, use_topr_loss,
length_loss_weight and difficulty_loss_weight (over the mini-batch, difficulty
from the group) and dual_clip_loss (c = 1 + 2 × pg_clip)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from agentgym.builders.recipe import default_grpo_config, grpo_config
from agentgym.schema import validate
from agentgym.trainers.grpo import GRPOConfig
from agentgym.trainers.objectives import PolicyLoss
from agentgym.trainers.strategies import LossFunction, Metric, MetricReducer, ModelOutputs
from agentgym.trainers.updates import update_policy
from agentgym.trajectory import RolloutBatch


def batch_of(
    logprobs: list[list[float]],
    advantages: list[list[float]],
    mask: list[list[int]],
    scores: list[float],
    old: list[list[float]] | None = None,
) -> RolloutBatch:
    """Rows whose first position is the prompt; ``old`` defaults to ``logprobs`` (ratio 1)."""
    shape = torch.tensor(mask).shape
    batch = RolloutBatch(
        input_ids=torch.ones(shape, dtype=torch.long),
        attention_mask=torch.ones(shape, dtype=torch.long),
        position_ids=torch.arange(shape[1]).expand(shape),
        loss_mask=torch.tensor(mask),
        engine_logprobs=torch.zeros(shape),
        token_rewards=torch.zeros(shape),
        scores=torch.tensor(scores),
        group_ids=torch.zeros(shape[0], dtype=torch.long),
        tags=["t"] * shape[0],
    )
    batch.old_logprobs = torch.tensor(old if old is not None else logprobs)
    batch.advantages = torch.tensor(advantages)
    return batch


def run(
    config: GRPOConfig, batch: RolloutBatch, logprobs: list[list[float]]
) -> tuple[torch.Tensor, dict[str, Metric], torch.Tensor]:
    """The loss, metrics and d loss / d logprobs of the whole batch as one micro-batch."""
    mask = batch.loss_mask
    current = torch.tensor(logprobs, requires_grad=True)
    loss_fn = PolicyLoss(config.loss, num_tokens=mask.sum(), num_seqs=(mask.sum(1) > 0).sum())
    loss, metrics = loss_fn(ModelOutputs(current), batch)
    loss.backward()
    assert current.grad is not None
    return loss.detach(), metrics, current.grad


# Row 0: score 1 (positive), A = 2; row 1: score 0 (negative), A = -1; ratio 1 everywhere.
LOGPROBS = [[0.0, -1.0, -2.0], [0.0, -1.0, -1.0]]
ADVANTAGES = [[0.0, 2.0, 2.0], [0.0, -1.0, -1.0]]
MASK = [[0, 1, 1], [0, 1, 1]]
SCORES = [1.0, 0.0]


def test_sft_term_mixes_with_rl_loss_coef_by_hand() -> None:
    # pg = -A * r: -2, -2, 1, 1 -> token mean -0.5
    # sft = -A * logp on the positive row: 2, 4 -> 6 / 4 tokens = 1.5
    # loss = 0.5 * -0.5 + 0.2 * 1.5 = 0.05
    config = default_grpo_config(sft_loss_coef=0.2, rl_loss_coef=0.5)
    loss, metrics, grad = run(config, batch_of(LOGPROBS, ADVANTAGES, MASK, SCORES), LOGPROBS)
    assert loss.item() == pytest.approx(0.05)
    assert metrics["pg_loss"].value == pytest.approx(-0.5)
    assert metrics["sft_loss"].value == pytest.approx(1.5)
    # d/dlogp: rl 0.5 * (-A / 4) plus sft 0.2 * (-A / 4) on the positive row
    expected = torch.tensor([[0.0, -0.35, -0.35], [0.0, 0.125, 0.125]])
    torch.testing.assert_close(grad, expected)


def test_use_topr_loss_adds_the_tapered_negative_term_by_hand() -> None:
    # Row 1 now has ratios 2 and 0.5 (old = logp - ln 2, logp + ln 2): tapers 1 and 0.5.
    # topr on row 1: -taper * A * logp = -(1)(-1)(-1) = -1 and -(0.5)(-1)(-1) = -0.5
    # sft = (2 + 4 - 1 - 0.5) / 4 = 1.125
    # pg: row 0: -2, -2; row 1: -A * r = 2 and 0.5 -> (-4 + 2.5) / 4 = -0.375
    # loss = 0 * pg + 1 * sft = 1.125 (ROLL's pure TOPR: rl_loss_coef 0)
    ln2 = math.log(2.0)
    old = [[0.0, -1.0, -2.0], [0.0, -1.0 - ln2, -1.0 + ln2]]
    config = default_grpo_config(
        sft_loss_coef=1.0, use_topr_loss=True, rl_loss_coef=0.0, clip_ratio_high=10.0,
        clip_ratio_low=0.9,
    )  # fmt: skip
    batch = batch_of(LOGPROBS, ADVANTAGES, MASK, SCORES, old=old)
    loss, metrics, grad = run(config, batch, LOGPROBS)
    assert metrics["sft_loss"].value == pytest.approx(1.125)
    assert metrics["pg_loss"].value == pytest.approx(-0.375)
    assert loss.item() == pytest.approx(1.125)
    # no gradient through the taper: d/dlogp = -taper * A / 4
    expected = torch.tensor([[0.0, -0.5, -0.5], [0.0, 0.25, 0.125]])
    torch.testing.assert_close(grad, expected)


def test_without_use_topr_loss_negative_samples_give_no_sft_term() -> None:
    ln2 = math.log(2.0)
    old = [[0.0, -1.0, -2.0], [0.0, -1.0 - ln2, -1.0 + ln2]]
    config = default_grpo_config(sft_loss_coef=1.0, rl_loss_coef=0.0)
    _, metrics, grad = run(config, batch_of(LOGPROBS, ADVANTAGES, MASK, SCORES, old=old), LOGPROBS)
    assert metrics["sft_loss"].value == pytest.approx(1.5)  # (2 + 4) / 4
    assert grad[1].abs().sum() == 0


def test_sample_weights_weigh_the_policy_loss_rows_by_hand() -> None:
    # lengths 1 and 3 -> weights 1.5 and 0.5 (sum 2 = B); A = 1, r = 1: pg = -1 per token
    # weighted: (-1.5 - 3 * 0.5) / 4 tokens = -0.75 (unweighted: -1)
    logprobs = [[0.0, -1.0, 0.0, 0.0], [0.0, -1.0, -1.0, -1.0]]
    batch = batch_of(logprobs, [[0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]],
                     [[0, 1, 0, 0], [0, 1, 1, 1]], [1.0, 1.0])  # fmt: skip
    batch.sample_weights = torch.tensor([1.5, 0.5])
    loss, metrics, _ = run(default_grpo_config(length_loss_weight=True), batch, logprobs)
    assert loss.item() == pytest.approx(-0.75)
    assert metrics["pg_loss"].value == pytest.approx(-0.75)


class OnPolicyStrategy:
    """Runs the loss on each micro-batch with the current logprobs = old (ratio 1)."""

    def __init__(self) -> None:
        self.steps: list[list[RolloutBatch]] = []

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> dict[str, Metric]:
        self.steps.append(list(micro_batches))
        reducer = MetricReducer()
        for part in micro_batches:
            assert part.old_logprobs is not None
            _, metrics = loss_fn(ModelOutputs(part.old_logprobs.clone()), part)
            reducer.add(metrics)
        return reducer.metrics()


def test_update_policy_weighs_lengths_over_the_mini_batch_not_the_micro_batch() -> None:
    # one mini-batch of the two rows above, cut into two micro-batches of one row:
    # weights over the mini-batch are 1.5 and 0.5 (loss -0.75); per micro-batch they
    # would be 1 and 1 (loss -1)
    logprobs = [[0.0, -1.0, 0.0, 0.0], [0.0, -1.0, -1.0, -1.0]]
    batch = batch_of(logprobs, [[0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]],
                     [[0, 1, 0, 0], [0, 1, 1, 1]], [1.0, 1.0])  # fmt: skip
    config = default_grpo_config(
        length_loss_weight=True, micro_batch_size=1, gradient_accumulation_steps=2
    )
    strategy = OnPolicyStrategy()
    logged = update_policy(config, strategy, batch, step=1)  # type: ignore[arg-type]
    assert logged["actor/loss"] == pytest.approx(-0.75)
    (micro,) = strategy.steps
    weights = sorted(float(part.sample_weights[0]) for part in micro)  # type: ignore[index]
    assert weights == pytest.approx([0.5, 1.5])


def test_update_policy_weighs_difficulty_by_the_whole_groups_failure_rate() -> None:
    # group 7: scores 1, 0, 0 (2 of 3 failed: difficulty 2/3, weight 0.5 + 1.5 * 2/3 = 1.5);
    # group 9: scores 2, 3 (none failed: weight 0.5). One row per mini-batch, so each
    # weight is renormalized to 1 there, unless the mini-batch holds several rows:
    # mini-batches of 5 rows: weights 1.5, 1.5, 1.5, 0.5, 0.5 (sum 5.5) times 5 / 5.5
    logprobs = [[0.0, -1.0]] * 5
    batch = batch_of(logprobs, [[0.0, 1.0]] * 5, [[0, 1]] * 5, [1.0, 0.0, 0.0, 2.0, 3.0])
    batch.group_ids = torch.tensor([7, 7, 7, 9, 9])
    config = default_grpo_config(
        difficulty_loss_weight=True, micro_batch_size=5, gradient_accumulation_steps=1
    )
    strategy = OnPolicyStrategy()
    update_policy(config, strategy, batch, step=1)  # type: ignore[arg-type]
    ((part,),) = strategy.steps
    assert part.sample_weights is not None
    pairs = zip(part.group_ids.tolist(), part.sample_weights.tolist(), strict=True)
    by_group = dict(pairs)
    assert by_group == pytest.approx({7: 1.5 * 5 / 5.5, 9: 0.5 * 5 / 5.5})
    # a mini-batch of two rows of group 7 and one of group 9 still reads group 7's
    # failure rate over all three of its rows: weights 1.5, 1.5, 0.5 times 3 / 3.5
    config = default_grpo_config(
        difficulty_loss_weight=True, micro_batch_size=3, gradient_accumulation_steps=1
    )
    strategy = OnPolicyStrategy()
    update_policy(config, strategy, batch, step=1)  # type: ignore[arg-type]
    for (part,) in strategy.steps:
        weights = part.sample_weights
        assert weights is not None
        raw = torch.where(part.group_ids == 7, 1.5, 0.5)
        torch.testing.assert_close(weights, raw * len(raw) / raw.sum())


def test_difficulty_loss_weight_is_accepted_by_the_schema() -> None:
    assert grpo_config(validate({"difficulty_loss_weight": True})).loss.difficulty_loss_weight


def test_dual_clip_loss_is_rolls_bound_one_plus_two_pg_clip() -> None:
    settings = grpo_config(validate({"dual_clip_loss": True}))
    assert settings.loss.dual_clip_ratio_c == pytest.approx(1.4)  # 1 + 2 × 0.2, not verl's 3
    # A = -1, r = e^2: PPO's loss max(r, clip(r)) = e^2 is bounded at c |A| = 1.4
    logprobs = [[0.0, 0.0]]
    batch = batch_of(logprobs, [[0.0, -1.0]], [[0, 1]], [0.0], old=[[0.0, -2.0]])
    loss, metrics, grad = run(settings, batch, logprobs)
    assert loss.item() == pytest.approx(1.4)
    assert metrics["dual_clipfrac"].value == 1.0
    assert grad.abs().sum() == 0
    plain, _, _ = run(default_grpo_config(), batch, logprobs)
    assert plain.item() == pytest.approx(math.exp(2.0))
