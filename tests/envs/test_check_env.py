"""Gymnasium's own env checker on every registered env, in every render mode."""

from __future__ import annotations

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym


@pytest.mark.parametrize("name", agentgym.list_envs())
def test_check_env(name: str) -> None:
    env = agentgym.make(name)
    check_env(env.unwrapped)
    for mode in env.unwrapped.metadata["render_modes"]:
        check_env(agentgym.make(name, render_mode=mode).unwrapped)


@pytest.mark.parametrize("name", agentgym.list_envs())
def test_gymnasium_make_by_id(name: str) -> None:
    env = gymnasium.make(agentgym.spec(name).id)
    observation, info = env.reset(seed=0)
    assert isinstance(observation, str) and observation
    assert info["action_is_valid"] is True and info["success"] is False
    observation, reward, terminated, truncated, info = env.step("not an action")
    assert not info["action_is_valid"]
    assert {"action_is_valid", "success", "actions"} <= set(info)
