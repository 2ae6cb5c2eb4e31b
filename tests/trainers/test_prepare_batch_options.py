"""ROLL's KL, reward and GAE keys through the recipe's prepare_batch and update_policy,
against hand-computed values: the adaptive KL coefficient (used, then updated),
reward_norm / reward_clip / use_reward_scaling / whiten_rewards, GAE with a
critic (its values, returns and one value update), and critic_warmup."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from torch.testing import assert_close

from agentgym.builders.recipe import default_grpo_config, kl_controller
from agentgym.trainers.batch_prep import prepare_batch
from agentgym.trainers.grpo import GRPOConfig, TrainParts
from agentgym.trainers.rewards import RunningMoments
from agentgym.trainers.strategies import Critic, Metric, ValueLossFunction
from agentgym.trainers.updates import update_critic, update_policy
from agentgym.trajectory import RolloutBatch, Trajectory, Turn


def config(**overrides: Any) -> GRPOConfig:
    base: dict[str, Any] = {
        "micro_batch_size": 2, "gradient_accumulation_steps": 1, "normalization": "identity",
        "drop_zero_variance_groups": False, "step_advantage_weight": 0.0, "step_score": "turn",
    }  # fmt: skip
    return default_grpo_config(**{**base, **overrides})


class ReferenceStrategy:
    """The frozen reference gives -2.5 on every token."""

    def reference_logprobs(self, batch: RolloutBatch, budget: object = None) -> torch.Tensor:
        return torch.full(batch.input_ids.shape, -2.5)


def trajectories(version: int = 0) -> list[Trajectory]:
    """One group: tokens [5, 6 | 7, 8] (score 1) and [5, 6 | 9] (score 0); the engine's
    logprobs on the generated tokens are -0.25, -1.5 and -2.0."""
    return [
        Trajectory(
            "frozen_lake", "tag", group_id=0, seed=0, policy_version=version,
            turns=[Turn([5, 6], [7, 8], [-0.25, -1.5], "", "stop", reward=1.0)], score=1.0,
        ),
        Trajectory(
            "frozen_lake", "tag", group_id=0, seed=0, policy_version=version,
            turns=[Turn([5, 6], [9], [-2.0], "", "stop", reward=0.0)], score=0.0,
        ),
    ]  # fmt: skip


def parts(**fields: Any) -> TrainParts:
    defaults: dict[str, Any] = {
        "strategy": ReferenceStrategy(), "pad_token_id": 0, "critic": None,
        "kl_controller": None, "reward_moments": None,
    }  # fmt: skip
    return cast(TrainParts, SimpleNamespace(**{**defaults, **fields}))


def prepared(
    settings: GRPOConfig, recipe_parts: TrainParts, version: int = 0
) -> tuple[RolloutBatch, dict[str, float]]:
    metrics: dict[str, float] = {}
    batch = prepare_batch(settings, recipe_parts, trajectories(version), metrics)
    assert batch is not None and batch.advantages is not None
    return batch, metrics


def test_adaptive_kl_coefficient_is_used_then_updated_by_hand() -> None:
    # KL = old - ref: row 0: 2.25, 1.0; row 1: 0.5. beta = 0.1 this step.
    # reinforce (gamma 1) over token rewards r - beta * KL:
    #   row 0: [-0.225, 1 - 0.1] -> returns 0.675, 0.9; row 1: [-0.05] -> -0.05
    # the controller then sees mean(row means) = mean(1.625, 0.5) = 1.0625 over 2 samples:
    #   error = clip(1.0625 / 0.5 - 1, ±0.2) = 0.2; beta = 0.1 * (1 + 0.2 * 2 / 10) = 0.104
    settings = config(
        adv_estimator="reinforce", add_token_level_kl=True, kl_penalty="kl",
        init_kl_coef=0.1, target_kl=0.5, kl_horizon=10,
    )  # fmt: skip
    recipe_parts = parts(kl_controller=kl_controller(settings))
    batch, metrics = prepared(settings, recipe_parts)
    assert batch.advantages is not None
    mask = batch.loss_mask.bool()
    assert batch.advantages[mask].tolist() == pytest.approx([0.675, 0.9, -0.05])
    assert metrics["actor/kl_coef"] == pytest.approx(0.1)
    assert metrics["actor/token_level_kl"] == pytest.approx(3.75 / 3)
    assert recipe_parts.kl_controller is not None
    assert recipe_parts.kl_controller.value == pytest.approx(0.104)
    # the next step subtracts 0.104 * KL
    again, again_metrics = prepared(settings, recipe_parts)
    assert again.advantages is not None
    assert again.advantages[mask][2].item() == pytest.approx(-0.052)
    assert again_metrics["actor/kl_coef"] == pytest.approx(0.104)


def test_fixed_kl_coefficient_folds_into_grpo_scores_by_hand() -> None:
    # grpo: the score minus beta * sum(KL): 1 - 0.1 * 3.25 = 0.675 and 0 - 0.1 * 0.5 = -0.05,
    # identity normalization, on every generated token; a fixed beta never moves
    settings = config(add_token_level_kl=True, kl_penalty="kl", init_kl_coef=0.1)
    recipe_parts = parts(kl_controller=kl_controller(settings))
    batch, _ = prepared(settings, recipe_parts)
    assert batch.advantages is not None
    assert batch.advantages[batch.loss_mask.bool()].tolist() == pytest.approx([0.675, 0.675, -0.05])
    assert recipe_parts.kl_controller is not None
    assert recipe_parts.kl_controller.value == 0.1


def test_reward_norm_batch_then_reward_clip_by_hand() -> None:
    # scores 1, 0: batch mean 0.5, unbiased std sqrt(0.5) -> ±0.5 / (0.70711 + 1e-6) = ±0.70711,
    # then reward_clip 0.6 clamps both (reward_clip_frac 1)
    settings = config(reward_norm="batch")
    batch, _ = prepared(settings, parts())
    assert batch.advantages is not None
    half = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert batch.advantages[batch.loss_mask.bool()].tolist() == pytest.approx([half, half, -half])
    clipped, clipped_metrics = prepared(config(reward_norm="batch", reward_clip=0.6), parts())
    assert clipped.advantages is not None
    assert clipped.advantages[clipped.loss_mask.bool()].tolist() == pytest.approx([0.6, 0.6, -0.6])
    assert clipped_metrics["train/reward_clip_frac"] == 1.0


def test_use_reward_scaling_divides_by_the_running_std_by_hand() -> None:
    # the running moments see [1, 0]: unbiased std sqrt(0.25 * 2 / 1) = 0.70711 -> 1.41421, 0
    moments = RunningMoments()
    batch, _ = prepared(config(use_reward_scaling=True), parts(reward_moments=moments))
    assert batch.advantages is not None
    expected = 1.0 / (math.sqrt(0.5) + torch.finfo(torch.float32).eps)
    assert batch.advantages[batch.loss_mask.bool()].tolist() == pytest.approx(
        [expected, expected, 0]
    )
    assert [moments.count, moments.mean] == pytest.approx([2.0, 0.5])


def test_whiten_rewards_before_reinforce_by_hand() -> None:
    # token rewards 0, 1 | 0 on the generated tokens: mean 1/3, unbiased var 1/3
    # whitened: -0.57735, 1.15470 | -0.57735; reinforce returns: 0.57735, 1.15470 | -0.57735
    batch, _ = prepared(config(adv_estimator="reinforce", whiten_rewards=True), parts())
    assert batch.advantages is not None
    root = math.sqrt(1 / 3)
    expected = [root, 2 * root, -root]
    assert batch.advantages[batch.loss_mask.bool()].tolist() == pytest.approx(expected, rel=1e-6)


class ConstantCritic:
    """Values 0.5 everywhere; train_step runs the loss on values 0.5 and records it."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float, dict[str, Metric]]] = []

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        return torch.full(batch.input_ids.shape, 0.5)

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: ValueLossFunction
    ) -> dict[str, Metric]:
        total = 0.0
        metrics: dict[str, Metric] = {}
        for part in micro_batches:
            loss, metrics = loss_fn(torch.full(part.input_ids.shape, 0.5), part)
            total += float(loss)
        self.calls.append((sum(len(p) for p in micro_batches), total, metrics))
        return metrics | {"grad_norm": Metric(0.0), "lr": Metric(1e-3)}


def test_gae_with_a_critic_by_hand() -> None:
    # gamma = lambd = 1: A_t = (reward-to-go) - V_t with V = 0.5 on generated tokens
    #   row 0: rewards 0, 1 -> A = 0.5, 0.5, returns 1, 1; row 1: reward 0 -> A = -0.5, return 0
    # the critic's loss at values 0.5: 0.5 * mean over rows of row means of (V - R)^2
    #   = 0.5 * mean(0.25, 0.25) = 0.125
    critic = ConstantCritic()
    settings = config(adv_estimator="gae", gamma=1.0, lambd=1.0)
    batch, _ = prepared(settings, parts(critic=critic), version=4)
    metrics = update_critic(settings, cast(Critic, critic), batch, step=5)  # the recipe's next
    mask = batch.loss_mask.bool()
    assert batch.advantages is not None and batch.values is not None and batch.returns is not None
    assert batch.advantages[mask].tolist() == [0.5, 0.5, -0.5]
    assert batch.returns[mask].tolist() == [1.0, 1.0, 0.0]
    assert batch.values[~mask].abs().sum() == 0  # prompt and padding carry no value
    ((rows, loss, value_metrics),) = critic.calls  # one mini-batch of both rows
    assert rows == 2
    assert loss == pytest.approx(0.125)
    assert value_metrics["vf_loss"].value == pytest.approx(0.125)
    assert metrics["critic/vf_loss"] == pytest.approx(0.125)
    assert metrics["critic/updates"] == 1.0


def test_gae_discounts_with_gamma_and_lambd_by_hand() -> None:
    # row 0, gamma 0.5, lambd 0.5, V = 0.5: delta_3 = 1 - 0.5 = 0.5;
    # delta_2 = 0 + 0.5 * 0.5 - 0.5 = -0.25; A_2 = -0.25 + 0.25 * 0.5 = -0.125
    settings = config(adv_estimator="gae", gamma=0.5, lambd=0.5)
    batch, _ = prepared(settings, parts(critic=ConstantCritic()))
    assert batch.advantages is not None
    assert batch.advantages[batch.loss_mask.bool()].tolist() == [-0.125, 0.5, -0.5]


class CountingStrategy:
    def __init__(self) -> None:
        self.steps = 0

    def train_step(self, micro_batches: Sequence[RolloutBatch], loss_fn: Any) -> dict[str, Metric]:
        self.steps += 1
        return {"loss": Metric(0.0, "sum")}


def test_critic_warmup_steps_leave_the_actor_alone() -> None:
    settings = config(adv_estimator="gae", critic_warmup=2)
    batch, _ = prepared(settings, parts(critic=ConstantCritic()))
    strategy = CountingStrategy()
    assert update_policy(settings, strategy, batch, step=1) == {"actor/updates": 0.0}  # type: ignore[arg-type]
    assert update_policy(settings, strategy, batch, step=2) == {"actor/updates": 0.0}  # type: ignore[arg-type]
    assert strategy.steps == 0
    assert update_policy(settings, strategy, batch, step=3)["actor/updates"] == 1.0  # type: ignore[arg-type]
    assert strategy.steps == 1


def test_gae_without_a_critic_says_what_is_missing() -> None:
    with pytest.raises(ValueError, match=r"adv_estimator=gae needs parts\.critic"):
        prepared(config(adv_estimator="gae"), parts())


def test_a_fixed_coefficient_gives_the_init_kl_coef_penalty_per_token() -> None:
    # the fixed controller reproduces the former init_kl_coef path exactly (reinforce)
    settings = config(adv_estimator="reinforce", add_token_level_kl=True, kl_penalty="kl")
    batch, _ = prepared(settings, parts(kl_controller=kl_controller(settings)))
    assert batch.advantages is not None
    kl = torch.tensor([[0, 0, 2.25, 1.0], [0, 0, 0.5, 0]])
    rewards = torch.tensor([[0, 0, 0, 1.0], [0, 0, 0, 0]]) - settings.advantage.init_kl_coef * kl
    expected = rewards.flip(-1).cumsum(-1).flip(-1) * batch.loss_mask
    assert_close(batch.advantages, expected)
