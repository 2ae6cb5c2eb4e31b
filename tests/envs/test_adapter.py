"""Plain Gymnasium text envs through the adapter, and the env contract on TextEnvs."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import gymnasium
import pytest
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

import agentgym
from agentgym.envs.adapter import GymTextEnv, make_text_env
from agentgym.envs.text_env import EnvContractError, TextEnv
from tests.envs.test_text_env import CounterEnv


def coin_of(env: Any) -> str:
    return str(env.env.coin)


def wrapped(env: GymTextEnv) -> Any:
    """The plugin's own env (its attributes are not typed here)."""
    return env.env


def adapted(name: str, kwargs: dict[str, Any] | None = None, **options: Any) -> GymTextEnv:
    env = make_text_env(name, kwargs, **options)
    assert isinstance(env, GymTextEnv)
    return env


def test_plain_env_is_adapted_with_its_docstring_and_its_flags(plugins: Path) -> None:
    env = make_text_env("coin", {"length": 2, "format_penalty": -0.5})
    assert isinstance(env, GymTextEnv) and type(env.env).__name__ == "CoinEnv"
    assert env.instructions.startswith("Guess the side of a hidden coin: answer heads or tails.")
    observation, info = env.reset(seed=4)
    assert observation == "flip 0 of 2"
    assert (info["action_is_valid"], info["success"], info["unreported_info"]) == (True, False, [])
    wrong = "tails" if coin_of(env) == "heads" else "heads"
    # The raw text is the action: the env strips and lowercases it itself.
    observation, reward, terminated, truncated, info = env.step(f"  {wrong.upper()} ")
    assert (observation, reward, terminated, truncated) == ("flip 1 of 2", 0.0, False, False)
    assert info["action_is_valid"] and info["actions"] == [f"  {wrong.upper()} "]
    _, reward, terminated, _, info = env.step(env.solve()[0])  # solve() is the wrapped env's
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_an_action_the_env_calls_invalid_earns_the_format_penalty(plugins: Path) -> None:
    env = make_text_env("coin", {"format_penalty": -0.5})
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("edge")
    assert (reward, terminated, info["action_is_valid"]) == (-0.5, False, False)
    default = make_text_env("coin")
    default.reset(seed=0)
    assert default.step("edge")[1] == 0.0  # the adapter adds nothing by default


def test_flags_the_env_does_not_report_are_defaulted_and_marked(plugins: Path) -> None:
    env = make_text_env("mute_coin")
    assert env.instructions == "Say heads or tails."  # the attribute (no docstring)
    with pytest.warns(UserWarning, match=r"MuteCoinEnv leaves \['action_is_valid', 'success'\]"):
        _, info = env.reset(seed=1)
    assert info["unreported_info"] == ["action_is_valid", "success"]
    _, reward, terminated, _, info = env.step(coin_of(env))
    assert (reward, terminated) == (1.0, True)
    assert (info["action_is_valid"], info["success"], info["guesses"]) == (True, False, 1)


def test_answer_format_only_when_asked(plugins: Path) -> None:
    env = adapted("coin", {"response_format": "answer"})
    assert env.instructions.endswith("Example: <answer>your action</answer>")
    env.reset(seed=2)
    _, _, _, _, info = env.step(coin_of(env))
    assert not info["action_is_valid"] and "'answer' format" in info["parse_error"]
    assert wrapped(env).guesses == 0  # the wrapped env never saw it
    _, reward, terminated, _, info = env.step(f"<answer>{coin_of(env)}</answer>")
    assert (reward, terminated, wrapped(env).guesses) == (1.0, True, 1)


def test_instructions_from_the_config_come_first(plugins: Path) -> None:
    assert make_text_env("coin", {"instructions": "Pick a side."}).instructions == "Pick a side."


def test_seeds_reach_the_wrapped_env_unchanged(plugins: Path) -> None:
    from agentgym_test_plugins.coin import CoinEnv  # type: ignore[import-not-found]

    env = make_text_env("coin")
    raw = CoinEnv()
    for seed in range(12):
        env.reset(seed=seed)
        raw.reset(seed=seed)
        assert coin_of(env) == raw.coin
    assert {coin_of(env) for _ in range(12) if env.reset(seed=None)} == {"heads", "tails"}


def test_render_mode_goes_to_the_constructor(plugins: Path) -> None:
    env = adapted("coin", render_mode="ansi")
    assert wrapped(env).made_with_render_mode == "ansi" and env.render_mode == "ansi"
    env.reset(seed=3)
    assert env.render() == f"the coin shows {coin_of(env)}"
    assert wrapped(adapted("coin", render_mode="rgb_array")).made_with_render_mode is None


class SpyEnv(CounterEnv):
    """Count up to three, remembering the render mode it was built with."""

    metadata = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.built_with = kwargs.get("render_mode")


def test_render_mode_goes_to_a_text_envs_constructor() -> None:
    agentgym.register("spy_counter", SpyEnv)
    try:
        env = make_text_env("spy_counter", render_mode="rgb_array")
        assert isinstance(env, SpyEnv) and env.built_with == "rgb_array"
        assert make_text_env("spy_counter", render_mode="human").built_with is None  # type: ignore[attr-defined]
    finally:
        agentgym.unregister("spy_counter")


def test_a_gymnasium_id_outside_agentgym_is_made_and_adapted(
    plugins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "coin_registering.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('coin_ns/Coin-v0', 'agentgym_test_plugins.coin:CoinEnv')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        env = make_text_env("coin_registering:coin_ns/Coin-v0", {"length": 5})
        assert isinstance(env, GymTextEnv) and env.reset(seed=0)[0] == "flip 0 of 5"
        assert agentgym.spec("coin_ns/Coin-v0").id == "coin_ns/Coin-v0"
    finally:
        gymnasium.registry.pop("coin_ns/Coin-v0", None)
        sys.modules.pop("coin_registering", None)


def test_check_env_passes_on_the_adapter(plugins: Path) -> None:
    check_env(make_text_env("coin"))
    check_env(make_text_env("coin", {"response_format": "think_answer"}))


def test_envs_without_text_spaces_or_instructions_are_refused() -> None:
    with pytest.raises(TypeError, match=r"CartPoleEnv is not a text env: its observation space"):
        make_text_env("CartPole-v1")

    class Nameless(gymnasium.Env[str, str]):
        observation_space = spaces.Text(8)
        action_space = spaces.Text(8)

    Nameless.__doc__ = None
    with pytest.raises(TypeError, match="Nameless has no instructions"):
        GymTextEnv(Nameless())


def test_unknown_name_suggests_a_close_one() -> None:
    with pytest.raises(agentgym.UnknownEnvError, match="Did you mean 'sokoban'"):
        make_text_env("sokobna")


# -- the contract on TextEnvs ---------------------------------------------------


def test_a_text_env_whose_step_drops_a_flag_is_an_error_naming_it(plugins: Path) -> None:
    env = make_text_env("forgetful_walk")
    env.reset(seed=0)
    message = (
        "agentgym_test_plugins.walk.ForgetfulWalkEnv.step() returned an info without "
        "['action_is_valid']"
    )
    with pytest.raises(EnvContractError, match=re.escape(message)):
        env.step("<answer>Right</answer>")


def test_a_text_env_whose_reset_drops_success_is_an_error() -> None:
    class Amnesic(CounterEnv):
        def reset(self, **kwargs: Any) -> tuple[str, dict[str, Any]]:
            observation, info = super().reset(**kwargs)
            return observation, {k: v for k, v in info.items() if k != "success"}

    with pytest.raises(EnvContractError, match=r"Amnesic\.reset\(\) returned an info without"):
        Amnesic().reset(seed=0)


def test_the_base_step_and_reset_are_not_wrapped() -> None:
    assert "step" not in vars(CounterEnv) and TextEnv.step.__name__ == "step"
    assert not hasattr(TextEnv.step, "__wrapped__")
