"""ROLL's ``step_reinforce``: each step's discounted return, normalized with ROLL's
``norm_mean_type``/``norm_std_type``, on every generated token of the step (hand-computed
values), and the checks that keep its keys together."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym.errors import ConfigError
from agentgym.schema import validate
from agentgym.trainers.advantages import compute_advantages
from agentgym.trainers.normalization import norm_scopes, normalize_rewards
from agentgym.trajectory import RolloutBatch, Trajectory, Turn


def episode(group: int, rewards: list[float], responses: int = 2) -> Trajectory:
    turns = [
        Turn([1, 2, 3], [7] * responses, [0.0] * responses, "", "stop", reward=r) for r in rewards
    ]
    return Trajectory("e", "t", group, 0, mode="step", turns=turns, score=sum(rewards), messages=[])


EPISODES = [
    episode(0, [1.0, 0.0, 2.0]),
    episode(0, [0.0, 1.0]),
    episode(1, [3.0]),
    episode(1, [-1.0]),
]
# step_gamma 0.5: [1, 0, 2] → [1 + 0.5 × 1, 0 + 0.5 × 2, 2] = [1.5, 1, 2]; [0, 1] → [0.5, 1]
RETURNS = [1.5, 1.0, 2.0, 0.5, 1.0, 3.0, -1.0]
# group 0's mean 6/5, group 1's 1; the batch's unbiased variance:
# (Σx² - 7 × mean²) / 6 = (18.5 - 64/7) / 6 = 131/84
BATCH_STD = math.sqrt(131 / 84)


def test_a_step_sample_is_judged_by_its_discounted_return() -> None:
    batch = RolloutBatch.from_trajectories(
        EPISODES, pad_token_id=0, step_score="return", step_gamma=0.5
    )
    assert batch.scores.tolist() == RETURNS
    assert batch.step_returns is not None and batch.step_returns.tolist() == RETURNS
    turn = RolloutBatch.from_trajectories(EPISODES, pad_token_id=0, step_score="turn")
    assert turn.scores.tolist() == [1.0, 0.0, 2.0, 0.0, 1.0, 3.0, -1.0]


def test_group_mean_and_batch_std_as_rolls_native_file_sets_them() -> None:
    scores = torch.tensor(RETURNS)
    groups = torch.tensor([0, 0, 0, 0, 0, 1, 1])
    normalized = normalize_rewards(
        scores,
        grouping="state",
        method="identity",
        group_ids=groups,
        norm_mean_type="group",
        norm_std_type="batch",
    )
    means = [1.2] * 5 + [1.0] * 2
    expected = [(x - m) / (BATCH_STD + 1e-6) for x, m in zip(RETURNS, means, strict=True)]
    assert normalized.tolist() == pytest.approx(expected, abs=1e-6)
    # each step's tokens get it (gamma 1, ROLL's default)
    batch = RolloutBatch.from_trajectories(
        EPISODES, pad_token_id=0, step_score="return", step_gamma=0.5
    )
    advantages = compute_advantages(
        "step_reinforce",
        normalized_scores=normalized,
        token_rewards=batch.token_rewards,
        loss_mask=batch.loss_mask,
    )
    assert torch.allclose(advantages[:, 3:], torch.tensor([[v, v] for v in expected]), atol=1e-6)
    assert advantages[:, :3].abs().sum() == 0  # the prompt: no advantage


def test_gamma_discounts_per_generated_token_from_the_steps_last() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0]])
    advantages = compute_advantages(
        "step_reinforce",
        normalized_scores=torch.tensor([2.0]),
        token_rewards=torch.zeros(1, 6),
        loss_mask=mask,
        gamma=0.5,
    )
    assert advantages.tolist() == [[0.0, 0.0, 0.5, 1.0, 2.0, 0.0]]  # 2 × 0.5², 2 × 0.5, 2


def test_scopes_unset_come_from_the_method_as_roll_derives_them() -> None:
    assert norm_scopes("identity", "state", None, None) == (None, None)
    assert norm_scopes("mean", "batch", None, None) == ("batch", None)
    assert norm_scopes("mean_std", "state", None, "batch") == ("group", "batch")
    assert norm_scopes("identity", "state", "group", None) == ("group", None)
    # a group of one sample gets 0 when a std divides, its centred score otherwise
    scores, groups = torch.tensor([4.0, 1.0, 3.0]), torch.tensor([0, 1, 1])
    divided = normalize_rewards(
        scores, grouping="state", method="identity", group_ids=groups, norm_std_type="group"
    )
    assert divided.tolist() == pytest.approx(
        [0.0, 1 / (math.sqrt(2) + 1e-6), 3 / (math.sqrt(2) + 1e-6)]
    )
    centred = normalize_rewards(
        scores, grouping="state", method="identity", group_ids=groups, norm_mean_type="batch"
    )
    assert centred.tolist() == pytest.approx([4 - 8 / 3, 1 - 8 / 3, 3 - 8 / 3])
    with pytest.raises(ValueError, match=r"norm_mean_type='grup' is not valid"):
        normalize_rewards(
            scores, grouping="state", method="identity", group_ids=groups, norm_mean_type="grup"
        )


def test_step_reinforce_asks_for_its_keys_by_name() -> None:
    with pytest.raises(ConfigError) as error:
        validate({"adv_estimator": "step_reinforce"})
    assert str(error.value).endswith(
        "adv_estimator=step_reinforce trains one sample per step, judged by its discounted "
        "return (step_gamma), with no GiGPO step term; step_score='episode', "
        "step_advantage_weight=1.0: set step_score=return step_advantage_weight=0.0"
    )
    config = validate(
        {"adv_estimator": "step_reinforce", "step_score": "return", "step_advantage_weight": 0}
    )
    assert config.reward_normalization.norm_mean_type is None
