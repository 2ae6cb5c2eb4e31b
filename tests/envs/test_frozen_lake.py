"""FrozenLake text env over Gymnasium's FrozenLake-v1."""

from __future__ import annotations

import numpy as np
import pytest

import agentgym
from agentgym.envs.frozen_lake import FrozenLakeEnv


def answer(action: str) -> str:
    return f"<answer>{action}</answer>"


def test_same_seed_same_map_and_different_seeds_differ() -> None:
    maps = [FrozenLakeEnv(size=5).reset(seed=11)[0] for _ in range(2)]
    assert maps[0] == maps[1]
    assert len({FrozenLakeEnv(size=5).reset(seed=s)[0] for s in range(20)}) > 10
    rows = maps[0].split("\n")
    assert len(rows) == 5 and all(len(r) == 5 for r in rows)
    assert rows[0][0] == "P" and rows[-1][-1] == "G"


@pytest.mark.parametrize("size", [3, 4, 6, 8])
def test_solver_reaches_the_goal(size: int) -> None:
    env = FrozenLakeEnv(size=size, p=0.7)
    for seed in range(30):
        env.reset(seed=seed)
        plan = env.solve()
        assert plan is not None and len(plan) >= 2 * (size - 1)
        total = 0.0
        for action in plan:
            obs, reward, terminated, truncated, info = env.step(answer(action))
            total += reward
        assert terminated and not truncated and info["success"]
        assert total == 1.0
        assert obs.split("\n")[-1][-1] == "√"


def test_falling_into_a_hole_ends_the_episode_without_success() -> None:
    env = FrozenLakeEnv(size=4)
    for seed in range(50):
        obs, _ = env.reset(seed=seed)
        if obs.split("\n")[0][1] == "O":
            break
    else:
        pytest.fail("no map with a hole right of the start")
    obs, reward, terminated, _, info = env.step(answer("Right"))
    assert terminated and reward == 0.0 and not info["success"]
    assert obs.split("\n")[0][:2] == "_X"
    assert env.solve() is None


def test_edge_moves_and_invalid_text() -> None:
    env = FrozenLakeEnv(size=4, format_penalty=-0.25, max_steps=3)
    start, _ = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(answer("Up"))
    assert obs == start and reward == 0.0 and info["action_is_valid"]
    obs, reward, *_, info = env.step("<answer>Fly</answer>")
    assert obs == start and reward == -0.25 and not info["action_is_valid"]
    *_, terminated, truncated, _ = env.step(answer("Left"))
    assert truncated and not terminated


def test_slippery_lake_is_seeded_and_has_no_plan() -> None:
    def trajectory(seed: int) -> list[str]:
        env = FrozenLakeEnv(size=4, is_slippery=True)
        env.reset(seed=seed)
        out = []
        for _ in range(10):
            obs, _, terminated, truncated, _ = env.step(answer("Right"))
            out.append(obs)
            if terminated or truncated:
                break
        return out

    assert trajectory(4) == trajectory(4)
    env = FrozenLakeEnv(is_slippery=True)
    env.reset(seed=0)
    assert "slippery" in env.instructions
    with pytest.raises(ValueError, match="is_slippery"):
        env.solve()


def test_rgb_rendering_and_instructions() -> None:
    env = agentgym.make("frozen_lake", size=5, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert isinstance(frame, np.ndarray) and frame.shape == (80, 80, 3)
    text = env.unwrapped.instructions  # type: ignore[attr-defined]
    assert "Left, Down, Right, Up" in text and "<answer>" in text


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="size"):
        FrozenLakeEnv(size=1)
    with pytest.raises(ValueError, match="p must"):
        FrozenLakeEnv(p=0.0)
