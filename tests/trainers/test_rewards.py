"""ROLL's reward processing, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from agentgym.trainers.rewards import (
    RunningMoments,
    apply_reward_norm,
    process_rewards,
    running_reward_scaling,
)

EPS32 = torch.finfo(torch.float32).eps


def test_running_moments_merge_batches_by_hand() -> None:
    running = RunningMoments()
    # [1, 3]: mean 2, unbiased std sqrt(2)
    assert running.update(torch.tensor([1.0, 3.0])) == pytest.approx((2.0, math.sqrt(2)))
    assert (running.mean, running.std) == pytest.approx((2.0, math.sqrt(2)))
    # then [5]: all of 1, 3, 5 -> mean 3, unbiased variance (4 + 0 + 4) / 2 = 4
    assert running.update(torch.tensor([5.0])) == pytest.approx((5.0, 0.0))
    assert (running.mean, running.var, running.std, running.count) == pytest.approx(
        (3.0, 8 / 3, 2.0, 3.0)
    )


def test_running_moments_state_dict_round_trip() -> None:
    running = RunningMoments()
    running.update(torch.tensor([1.0, 3.0]))
    restored = RunningMoments()
    restored.load_state_dict(running.state_dict())
    restored.update(torch.tensor([5.0]))
    assert (restored.mean, restored.std) == pytest.approx((3.0, 2.0))


def test_running_moments_keep_std_one_until_two_values() -> None:
    running = RunningMoments()
    running.update(torch.tensor([7.0]))
    assert (running.mean, running.std) == pytest.approx((7.0, 1.0))
    with pytest.raises(ValueError, match="at least one value"):
        running.update(torch.tensor([]))


# reward_norm ---------------------------------------------------------------------------

# Groups: {1, 3} (mean 2, std sqrt 2), {2, 2} (no spread), {5} (one sample).
GROUPED = torch.tensor([1.0, 3.0, 2.0, 2.0, 5.0])
GROUP_IDS = torch.tensor([0, 0, 1, 1, 2])
SQRT2 = math.sqrt(2) + 1e-6


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, [-1 / SQRT2, 1 / SQRT2, 0.0, 0.0, 0.0]),
        ({"shift": True}, [-1.0, 1.0, 0.0, 0.0, 0.0]),
        # no spread: the rewards stay as they are
        ({"scale": True}, [1 / SQRT2, 3 / SQRT2, 2.0, 2.0, 5.0]),
    ],
)
def test_group_reward_norm_by_hand(flags: dict, expected: list[float]) -> None:
    out = apply_reward_norm(GROUPED, "group", group_ids=GROUP_IDS, **flags)
    assert_close(out, torch.tensor(expected))


# [2, 4, 6]: mean 4, unbiased std 2
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, [-2 / 2.000001, 0.0, 2 / 2.000001]),
        ({"shift": True}, [-2.0, 0.0, 2.0]),
        ({"scale": True}, [2 / 2.000001, 4 / 2.000001, 6 / 2.000001]),
    ],
)
@pytest.mark.parametrize("norm", ["batch", "running"])
def test_batch_and_first_running_reward_norm_by_hand(
    norm: str, flags: dict, expected: list[float]
) -> None:
    out = apply_reward_norm(torch.tensor([2.0, 4.0, 6.0]), norm, running=RunningMoments(), **flags)
    assert_close(out, torch.tensor(expected))


def test_running_reward_norm_carries_across_steps() -> None:
    running = RunningMoments()
    apply_reward_norm(torch.tensor([2.0, 4.0, 6.0]), "running", running=running)
    # 2, 4, 6, 4: mean 4, unbiased variance 8/3
    out = apply_reward_norm(torch.tensor([4.0]), "running", running=running, scale=True)
    assert_close(out, torch.tensor([4 / (math.sqrt(8 / 3) + 1e-6)]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"norm": "group"}, "needs group_ids"),
        ({"norm": "running"}, "needs a RunningMoments"),
        ({"norm": "batch", "shift": True, "scale": True}, "exclude each other"),
        ({"norm": "groups"}, "Did you mean 'group'"),
    ],
)
def test_reward_norm_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        apply_reward_norm(GROUPED, **kwargs)


# use_reward_scaling --------------------------------------------------------------------


def test_running_reward_scaling_by_hand() -> None:
    # running mean 4 and std 2 after [2, 4, 6]; eps is float32's machine epsilon
    scaled = running_reward_scaling(
        torch.tensor([2.0, 4.0, 6.0]), RunningMoments(), subtract_mean=False
    )
    assert_close(scaled, torch.tensor([1.0, 2.0, 3.0]) * 2 / (2 + EPS32))
    normed = running_reward_scaling(
        torch.tensor([2.0, 4.0, 6.0]), RunningMoments(), subtract_mean=True
    )
    assert_close(normed, torch.tensor([-1.0, 0.0, 1.0]))


# process_rewards -----------------------------------------------------------------------

# Row 0 generates t=1, 2; row 1 t=1..3; row 2 only t=0.
MASK = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [1, 0, 0, 0]])


def test_process_rewards_in_rolls_order_by_hand() -> None:
    # 2. batch shift: [2, 4, 6] - 4 = [-2, 0, 2]
    # 3. clip at 1.5: [-1.5, 0, 1.5] (2 of 3 clipped)
    # 4. last generated tokens: row 0 t=2, row 1 t=3, row 2 t=0
    # 5. minus 0.5 on every generated token (the 0.5 off the mask is ignored)
    # 6. clip again: row 0's -2.0 at t=2 becomes -1.5 (1 of 6 generated tokens)
    out = process_rewards(
        torch.tensor([2.0, 4.0, 6.0]),
        MASK,
        reward_norm="batch",
        reward_shift=True,
        reward_clip=1.5,
        token_penalty=torch.full((3, 4), 0.5),
    )
    assert_close(out.scores, torch.tensor([-1.5, 0.0, 1.5]))
    expected = torch.tensor([[0.0, -0.5, -1.5, 0.0], [0.0, -0.5, -0.5, -0.5], [1.0, 0.0, 0.0, 0.0]])
    assert_close(out.token_rewards, expected)
    assert out.metrics == pytest.approx(
        {"reward_clip_frac": 2 / 3, "token_reward_clip_frac": 1 / 6}
    )


def test_whiten_rewards_after_the_clip_by_hand() -> None:
    # The token rewards above are -0.5, -1.5, -0.5, -0.5, -0.5, 1.0 on the mask:
    # mean -5/12; sum of squares 4.25 - 6 * (5/12)**2 = 77/24; unbiased variance 77/120
    out = process_rewards(
        torch.tensor([2.0, 4.0, 6.0]),
        MASK,
        reward_norm="batch",
        reward_shift=True,
        reward_clip=1.5,
        token_penalty=torch.full((3, 4), 0.5),
        whiten_rewards=True,
    )
    raw = torch.tensor([[0.0, -0.5, -1.5, 0.0], [0.0, -0.5, -0.5, -0.5], [1.0, 0.0, 0.0, 0.0]])
    expected = (raw + 5 / 12) / math.sqrt(77 / 120 + 1e-8) * MASK
    assert_close(out.token_rewards, expected)
    assert_close(out.token_rewards[MASK.bool()].mean(), torch.tensor(0.0))


def test_reward_scaling_runs_before_reward_norm() -> None:
    # 1. running std 2 -> [1, 2, 3] (up to eps); 2. group shift within {0, 1} and {2}
    running = RunningMoments()
    out = process_rewards(
        torch.tensor([2.0, 4.0, 6.0]),
        MASK,
        group_ids=torch.tensor([7, 7, 9]),
        running=running,
        use_reward_scaling=True,
        reward_norm="group",
        reward_shift=True,
    )
    assert_close(out.scores, torch.tensor([-0.5, 0.5, 0.0]), atol=1e-6, rtol=0)
    assert running.count == pytest.approx(3.0)


def test_no_options_places_the_raw_scores_on_the_last_tokens() -> None:
    out = process_rewards(torch.tensor([2, 4, 6]), MASK)
    assert_close(
        out.token_rewards,
        torch.tensor([[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 4.0], [6.0, 0.0, 0.0, 0.0]]),
    )
    assert out.metrics == {}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"use_reward_norm": True}, "only applies with use_reward_scaling"),
        ({"reward_shift": True}, "set reward_norm"),
        ({"use_reward_scaling": True}, "needs a RunningMoments"),
        (
            {"use_reward_scaling": True, "reward_norm": "running", "running": RunningMoments()},
            "set one of them",
        ),
        ({"reward_clip": 0.0}, "reward_clip must be positive"),
        ({"token_penalty": torch.zeros(3, 5)}, "token_penalty must have the shape"),
    ],
)
def test_process_rewards_rejects_inconsistent_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        process_rewards(torch.tensor([2.0, 4.0, 6.0]), MASK, **kwargs)
