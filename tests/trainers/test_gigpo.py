"""GiGPO's step level: discounted returns per turn, anchor-state groups, and
their normalized advantages, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym.trainers.normalization import anchor_state_advantages
from agentgym.trajectory import RolloutBatch, Trajectory, Turn


def step_trajectory(group: int, turns: list[tuple[str, float]]) -> Trajectory:
    """A step-mode episode: one (observation, reward) per turn, one token each."""
    made = [
        Turn([1], [2], [0.0], "", "stop", reward=reward, observation=observation)
        for observation, reward in turns
    ]
    return Trajectory(
        "sokoban", "tag", group_id=group, seed=0, mode="step", turns=made,
        score=sum(reward for _, reward in turns),
    )  # fmt: skip


# Group 0: A solves in two turns, B wanders for three; C is another group that
# starts from an observation with the same text.
A = step_trajectory(0, [("s0", -0.1), ("s1", 10.0)])
B = step_trajectory(0, [("s0", -0.1), ("s2", -0.1), ("s2", -0.1)])
C = step_trajectory(1, [("s0", 1.0)])


def test_step_returns_are_discounted_returns_to_go() -> None:
    batch = RolloutBatch.from_trajectories([A, B, C], pad_token_id=0, step_gamma=0.5)
    assert batch.step_returns is not None
    expected = [
        -0.1 + 0.5 * 10.0, 10.0,  # A
        -0.1 + 0.5 * (-0.1 + 0.5 * -0.1), -0.1 + 0.5 * -0.1, -0.1,  # B
        1.0,  # C
    ]  # fmt: skip
    assert batch.step_returns.tolist() == pytest.approx(expected)
    # trajectory mode: one sample per episode, its return from the first turn
    whole = Trajectory("sokoban", "tag", group_id=0, seed=0, turns=A.turns, score=9.9)
    (sample,) = whole.samples(step_gamma=0.5)
    assert sample.step_return == pytest.approx(4.9) and sample.state == "s0"


def test_anchor_states_are_same_observation_within_a_group() -> None:
    batch = RolloutBatch.from_trajectories([A, B, C], pad_token_id=0)
    assert batch.state_ids is not None
    # A's and B's first turns share s0; B's two s2 turns share; C's s0 is another group's
    assert batch.state_ids.tolist() == [0, 1, 0, 2, 2, 3]
    kept = batch.rows(torch.tensor([2, 5]))
    assert kept.state_ids is not None and kept.state_ids.tolist() == [0, 3]


def test_anchor_state_advantages_compare_actions_from_the_same_state() -> None:
    batch = RolloutBatch.from_trajectories([A, B, C], pad_token_id=0, step_gamma=0.5)
    assert batch.step_returns is not None and batch.state_ids is not None
    advantages = anchor_state_advantages(batch.step_returns, batch.state_ids, "mean_std")
    # two samples: (x - mean) / (unbiased std + 1e-6) = ±(d / 2) / (d / √2 + 1e-6)
    s0 = (5.075 / 2) / (5.075 / math.sqrt(2) + 1e-6)
    s2 = (0.05 / 2) / (0.05 / math.sqrt(2) + 1e-6)
    # s0: A's move (return 4.9) beats B's (-0.175); s2: B's last move (-0.1) beats
    # its earlier one (-0.15); s1 and C's s0 are seen once: 0
    assert advantages.tolist() == pytest.approx([s0, 0.0, -s0, -s2, s2, 0.0], abs=1e-6)
    centred = anchor_state_advantages(batch.step_returns, batch.state_ids, "mean")
    assert centred.tolist() == pytest.approx([2.5375, 0.0, -2.5375, -0.025, 0.025, 0.0], abs=1e-6)
