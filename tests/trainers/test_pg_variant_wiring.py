"""``pg_variant`` from the config to the loss: the schema's keys reach ``LossConfig`` by
name, ``PolicyLoss`` calls the chosen variant with its knobs and the batch's scores
(hand-computed), and the config check refuses knobs no chosen variant reads."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agentgym.builders.recipe import default_grpo_config, grpo_config
from agentgym.choices import PG_VARIANT_KNOBS, PG_VARIANTS
from agentgym.errors import ConfigError
from agentgym.schema import TrainConfig, validate
from agentgym.trainers.objectives import PolicyLoss
from agentgym.trainers.strategies import ModelOutputs
from agentgym.trajectory import RolloutBatch

# a value away from the schema's default for each knob of the new keys
AWAY = {
    "topr_positive_weight": 0.5,
    "topr_negative_weight": 2.0,
    "tis_lower_bound": 0.25,
    "tis_upper_bound": 2.0,
    "cispo_epsilon_low": 0.3,
    "cispo_epsilon_high": 0.4,
    "cispo_use_unified_mask": True,
    "kimi15_tau": 0.7,
    "topr_advantage_threshold": 0.5,
    "opmd_tau": 0.5,
    "clip_ratio_low": 0.1,
    "clip_ratio_high": 0.3,
    "dual_clip_ratio_c": 3.0,
}


@pytest.mark.parametrize("variant", PG_VARIANTS)
def test_each_variants_knobs_reach_the_loss_config_by_name(variant: str) -> None:
    knobs = {key: AWAY[key] for key in PG_VARIANT_KNOBS[variant]}
    config = validate({**TrainConfig().model_dump(), "pg_variant": variant, **knobs})
    loss = grpo_config(config).loss
    assert loss.pg_variant == variant
    assert {key: getattr(loss, key) for key in knobs} == knobs


def one_row_batch(old: list[float], scores: list[float]) -> RolloutBatch:
    """Rows of three tokens (a prompt, two generated), advantage 1 on the generated ones."""
    rows = len(old) // 2
    mask = torch.tensor([[0, 1, 1]] * rows)
    batch = RolloutBatch(
        input_ids=torch.ones(rows, 3, dtype=torch.long),
        attention_mask=torch.ones(rows, 3, dtype=torch.long),
        position_ids=torch.arange(3).expand(rows, 3),
        loss_mask=mask,
        engine_logprobs=torch.zeros(rows, 3),
        token_rewards=torch.zeros(rows, 3),
        scores=torch.tensor(scores),
        group_ids=torch.zeros(rows, dtype=torch.long),
        tags=["t"] * rows,
    )
    batch.old_logprobs = torch.cat([torch.zeros(rows, 1), torch.tensor(old).view(rows, 2)], 1)
    batch.advantages = mask.float()
    return batch


def loss_and_grad(
    batch: RolloutBatch, logprobs: list[float], **values: Any
) -> tuple[float, torch.Tensor, dict[str, float]]:
    rows = len(logprobs) // 2
    current = torch.cat([torch.zeros(rows, 1), torch.tensor(logprobs).view(rows, 2)], 1)
    current.requires_grad_(True)
    mask = batch.loss_mask
    config = default_grpo_config(**values)
    policy = PolicyLoss(config.loss, num_tokens=mask.sum(), num_seqs=(mask.sum(1) > 0).sum())
    loss, metrics = policy(ModelOutputs(current), batch)
    loss.backward()
    assert current.grad is not None
    return loss.item(), current.grad[:, 1:], {k: m.value for k, m in metrics.items()}


def test_tis_through_policy_loss_weighs_by_the_configured_bounds_by_hand() -> None:
    # log-ratios 0.5 and 0: ratios e^0.5 = 1.649 (clipped to 1.2) and 1, A = 1
    # loss = -(1.2 * -1 + 1 * -2) / 2 = 1.6; d/dlogp = -w * A / 2 = -0.6, -0.5
    batch = one_row_batch(old=[-1.5, -2.0], scores=[0.0])
    loss, grad, metrics = loss_and_grad(
        batch, [-1.0, -2.0], pg_variant="tis", tis_lower_bound=0.0, tis_upper_bound=1.2
    )
    assert loss == pytest.approx(1.6)
    torch.testing.assert_close(grad, torch.tensor([[-0.6, -0.5]]))
    assert metrics["tis_upper_clipfrac"] == pytest.approx(0.5)
    assert metrics["tis_weight_mean"] == pytest.approx(1.1)
    # the default path (ppo) is PPO-clip: at ratio e^0.5 with A > 0 the first token's
    # clipped term 1.2 * A has no gradient, the second token's -1 / 2
    _, ppo_grad, ppo_metrics = loss_and_grad(batch, [-1.0, -2.0])
    torch.testing.assert_close(ppo_grad, torch.tensor([[0.0, -0.5]]))
    assert ppo_metrics["clipfrac"] == pytest.approx(0.5)


def test_topr_splits_by_the_batchs_scores_by_hand() -> None:
    # both rows: log-ratio -0.5 on each token (ratio e^-0.5 = 0.607), A = 1.
    # row 0 scored 1 (positive): weight topr_positive_weight = 2, no ratio;
    # row 1 scored 0 (negative): weight topr_negative_weight * clip(r, 0, 1) = 0.5 * 0.607
    batch = one_row_batch(old=[-0.5, -0.5, -0.5, -0.5], scores=[1.0, 0.0])
    _, grad, metrics = loss_and_grad(
        batch,
        [-1.0, -1.0, -1.0, -1.0],
        pg_variant="topr",
        topr_positive_weight=2.0,
        topr_negative_weight=0.5,
    )
    negative = 0.5 * math.exp(-0.5)
    expected = -torch.tensor([[2.0, 2.0], [negative, negative]]) / 4  # token-mean over 4
    torch.testing.assert_close(grad, expected)
    assert metrics["topr_positive_frac"] == pytest.approx(0.5)


def test_kimi15_adds_its_regularizer_with_the_configured_tau_by_hand() -> None:
    # log-ratio 0.5 on token one, 0 on token two; tau 0.4: reg = 0.2 * 0.25 / 2 tokens
    batch = one_row_batch(old=[-1.5, -2.0], scores=[0.0])
    loss, grad, metrics = loss_and_grad(batch, [-1.0, -2.0], pg_variant="kimi15", kimi15_tau=0.4)
    assert metrics["kimi15_reg"] == pytest.approx(0.025)
    assert loss == pytest.approx((1.0 + 2.0) / 2 + 0.025)
    # d/dlogp: -A / 2 + tau * log-ratio / 2
    torch.testing.assert_close(grad, torch.tensor([[-0.5 + 0.1, -0.5]]))


def checked(**values: Any) -> TrainConfig:
    return validate({**TrainConfig().model_dump(), **values})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"pg_variant": "tis", "tis_lower_bound": 0.5, "tis_upper_bound": 0.2},
            "tis_lower_bound=0.5 > tis_upper_bound=0.2: tis weighs each token by its ratio "
            "clipped to [tis_lower_bound, tis_upper_bound]; swap them",
        ),
        (
            {"pg_variant": "topr", "tis_upper_bound": 2.0},
            "tis_upper_bound=2.0 is read by pg_variant=tis only, but pg_variant=topr: drop "
            "tis_upper_bound, or set pg_variant=tis",
        ),
        (
            {"pg_variant": "cispo", "clip_ratio_low": 0.1, "clip_ratio_high": 0.1},
            "clip_ratio_low=0.1 is read by pg_variant=ppo only, but pg_variant=cispo: drop "
            "clip_ratio_low, or set pg_variant=ppo",
        ),
        (
            {"pg_variant": "vanilla", "dual_clip_loss": True},
            "dual_clip_loss=True is read by pg_variant=ppo only, but pg_variant=vanilla",
        ),
        (
            {"kimi15_tau": 0.5},
            "kimi15_tau=0.5 is read by pg_variant=kimi15 only, but pg_variant=ppo",
        ),
        (
            {"pg_variant": "topr", "use_topr_loss": True, "sft_loss_coef": 0.1},
            "pg_variant=topr makes TOPR the policy loss, and use_topr_loss adds TOPR's tapered "
            "term to the sft_loss_coef term of another policy loss",
        ),
        (
            {"pg_variant": "topr", "rollout_mode": "step", "step_score": "turn"},
            "with rollout_mode=step and step_score=turn a sample's score is its turn's "
            "reward: set step_score=episode",
        ),
    ],
)
def test_knobs_no_chosen_variant_reads_are_refused_naming_both(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        checked(**values)
    assert message in str(error.value)


def test_each_variant_with_its_own_knobs_and_topr_on_episode_scores_pass() -> None:
    for variant in PG_VARIANTS:
        checked(pg_variant=variant, **{key: AWAY[key] for key in PG_VARIANT_KNOBS[variant]})
    checked(pg_variant="topr", rollout_mode="step", step_score="episode")
    actor_train = TrainConfig().actor_train.model_dump()
    actor_train["training_args"]["gradient_accumulation_steps"] = 1  # trajectory mode divides
    trajectories = {"rollout_mode": "trajectory", "step_advantage_weight": 0.0}
    checked(pg_variant="topr", step_score="turn", actor_train=actor_train, **trajectories)
