"""Gymnasium's env checker and agentgym's env contract on every env: built-in, registered
and installed as a plugin (plain Gymnasium envs through the adapter)."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.envs.adapter import make_text_env
from agentgym.envs.text_env import REQUIRED_INFO, EnvContractError


def check_agentgym_env(name: str) -> None:
    """check_env in every render mode, then the info contract on reset, a valid-looking
    and an invalid step."""
    env = make_text_env(name)
    check_env(env)
    for mode in env.metadata["render_modes"]:
        check_env(make_text_env(name, render_mode=mode))
    observation, info = env.reset(seed=0)
    assert isinstance(observation, str) and observation
    assert set(REQUIRED_INFO) <= set(info)
    assert info["action_is_valid"] is True and info["success"] is False
    observation, reward, terminated, truncated, info = env.step("not an action")
    assert {"action_is_valid", "success", "actions"} <= set(info)


@pytest.mark.parametrize("name", agentgym.list_envs())
def test_check_env(name: str) -> None:
    check_agentgym_env(name)


@pytest.mark.parametrize("name", agentgym.list_envs())
def test_gymnasium_make_by_id(name: str) -> None:
    env = gymnasium.make(agentgym.spec(name).id)
    observation, info = env.reset(seed=0)
    assert isinstance(observation, str) and observation
    assert info["action_is_valid"] is True and info["success"] is False
    observation, reward, terminated, truncated, info = env.step("not an action")
    assert not info["action_is_valid"]
    assert {"action_is_valid", "success", "actions"} <= set(info)


def test_installed_plugins_are_checked_too(plugins: Path) -> None:
    installed = [name for name in agentgym.list_envs() if agentgym.spec(name).plugin]
    assert sorted(installed) == ["coin", "forgetful_walk", "line_walk", "mute_coin"]
    for name in ("coin", "line_walk"):
        check_agentgym_env(name)
    with pytest.warns(UserWarning, match="leaves"):
        check_agentgym_env("mute_coin")  # the adapter fills in what it leaves out
    with pytest.raises(EnvContractError, match=r"ForgetfulWalkEnv\.step"):
        check_agentgym_env("forgetful_walk")
