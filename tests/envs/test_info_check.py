"""The info check on overridden reset/step: the wrapper with the base's own parameters
checks as the general one does and is called the same ways; a class that sets both
flags itself can go unwrapped (``checked_info=False``)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agentgym.envs.text_env import EnvContractError
from tests.envs.test_text_env import CounterEnv


class Forgetful(CounterEnv):
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        observation, info = super().reset(seed=seed, options=options)
        if options and options.get("forget"):
            del info["success"]
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        *result, info = super().step(action)
        if "forget" in action:
            del info["action_is_valid"]
        return (*result, info)  # type: ignore[return-value]


def test_the_base_parameters_get_a_wrapper_of_the_same_parameters_that_checks() -> None:
    assert Forgetful.step.__code__.co_varnames[:2] == ("self", "action")
    assert Forgetful.reset.__kwdefaults__ == {"seed": None, "options": None}
    env = Forgetful()
    observation, info = env.reset(seed=0, options={})
    assert (observation, info["success"]) == ("0", False)
    assert env.step(action="<answer>Inc</answer>")[1] == 1.0  # by keyword too
    message = "Forgetful.step() returned an info without ['action_is_valid']"
    with pytest.raises(EnvContractError, match=re.escape(message)):
        env.step("<answer>Inc</answer> forget")
    with pytest.raises(EnvContractError, match=r"Forgetful\.reset\(\) returned an info without"):
        env.reset(options={"forget": True})
    with pytest.raises(TypeError):
        env.reset(0)  # type: ignore[call-arg]  # keyword-only, as the base's


def test_a_class_that_says_it_sets_the_flags_is_not_wrapped() -> None:
    class Trusted(Forgetful, checked_info=False):
        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            return super().step(action)

    assert not hasattr(Trusted.step, "__wrapped__") and hasattr(Forgetful.step, "__wrapped__")
    env = Trusted()
    env.reset(seed=0)
    with pytest.raises(EnvContractError):  # the parent's own step is still checked
        env.step("<answer>Inc</answer> forget")
