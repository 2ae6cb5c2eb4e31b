"""The TextEnv base class contract, on a minimal counter env."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import pytest

from agentgym.envs.parsing import ParsedResponse
from agentgym.envs.text_env import TextEnv, TurnResult


class CounterEnv(TextEnv):
    """Count up to three.

    Args:
        whatever: this paragraph must not reach the prompt.
    """

    action_names: ClassVar[tuple[str, ...]] = ("Inc", "Dec")

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.value = 0
        return {"start": 0}

    def _apply(self, action: str) -> tuple[float, bool]:
        self.value += 1 if action == "Inc" else -1
        return float(action == "Inc"), self.value >= 3

    def _info(self) -> dict[str, Any]:
        return {"value": self.value}

    def _observation(self) -> str:
        return str(self.value)

    def _success(self) -> bool:
        return self.value >= 3


def test_info_keys_are_the_same_after_valid_and_invalid_turns() -> None:
    env = CounterEnv()
    _, info = env.reset(seed=0)
    assert info == {
        "start": 0,
        "value": 0,
        "action_is_valid": True,
        "actions": [],
        "success": False,
    }
    _, _, _, _, valid = env.step("<answer>inc</answer>")
    _, reward, _, _, invalid = env.step("inc")
    assert (
        set(valid)
        == set(invalid)
        == {"parse_error", "value", "action_is_valid", "action_is_effective", "actions", "success"}
    )
    assert invalid["value"] == 1 and reward == pytest.approx(-0.1)
    # effective: the state changed (valid and moved), not merely parsed
    assert valid["action_is_effective"] and not invalid["action_is_effective"]


def test_multi_action_turn_sums_rewards_and_stops_at_the_end() -> None:
    env = CounterEnv(max_actions_per_turn=5)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("<answer>Inc||Inc||Inc||Dec</answer>")
    assert terminated and reward == 3.0 and info["actions"] == ["Inc", "Inc", "Inc"]


def test_default_rules_are_the_docstring_summary() -> None:
    text = CounterEnv().instructions
    assert text.startswith("Count up to three.\nValid actions: Inc, Dec.")
    assert "whatever" not in text


def test_missing_action_names_and_bad_options_raise() -> None:
    class Nameless(CounterEnv):
        action_names = ()

    with pytest.raises(TypeError, match="action_names"):
        Nameless()
    with pytest.raises(ValueError, match="max_actions_per_turn"):
        CounterEnv(max_actions_per_turn=0)
    with pytest.raises(ValueError, match="max_steps"):
        CounterEnv(max_steps=0)
    with pytest.raises(TypeError, match="abstract"):
        TextEnv()  # type: ignore[abstract]


class JumpEnv(CounterEnv):
    """Jump to a number with set[N]."""

    action_names: ClassVar[tuple[str, ...]] = ()

    def _parse(self, text: str) -> ParsedResponse:
        match = re.fullmatch(r"\s*<answer>set\[(\d)\]</answer>\s*", text)
        if match is None:
            return ParsedResponse(actions=(), is_valid=False, error="expected set[N]")
        return ParsedResponse(actions=(match.group(1),), is_valid=True)

    def _apply(self, action: str) -> tuple[float, bool]:
        self.value = int(action)
        return 0.0, self.value >= 3


def test_a_custom_parser_replaces_the_vocabulary() -> None:
    env = JumpEnv()
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("<answer>set[x]</answer>")
    assert not info["action_is_valid"] and info["parse_error"] == "expected set[N]"
    assert reward == pytest.approx(-0.1) and not terminated and env.value == 0
    _, _, terminated, _, info = env.step("<answer>set[4]</answer>")
    assert info["action_is_valid"] and info["actions"] == ["4"] and terminated
    assert env.tools == []


def test_max_steps_stops_a_multi_action_turn_midway() -> None:
    env = CounterEnv(max_actions_per_turn=5, max_steps=2)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("<answer>Dec||Dec||Dec</answer>")
    assert info["actions"] == ["Dec", "Dec"] and env.value == -2
    assert (terminated, truncated, reward, env.num_steps) == (False, True, 0.0, 2)


class DiceEnv(TextEnv):
    """Say a number; a turn that says 6 takes two steps and ends the episode early."""

    def _parse(self, text: str) -> ParsedResponse:
        ok = text.strip().isdigit()
        return ParsedResponse((text.strip(),) if ok else (), ok, None if ok else "not a number")

    def _play(self, parsed: ParsedResponse) -> TurnResult:
        if not parsed.is_valid:
            return TurnResult.invalid(parsed.error, reward=-1.0)
        said = int(parsed.actions[0])
        self.total += said
        return TurnResult(
            float(said), False, actions=parsed.actions, steps=2 if said == 6 else 1,
            truncated=said == 6, info={"total": self.total},
        )  # fmt: skip

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.total = 0
        return {}

    def _observation(self) -> str:
        return str(self.total)

    def _success(self) -> bool:
        return self.total >= 10


def test_a_play_hook_replaces_apply_and_the_base_does_the_bookkeeping() -> None:
    env = DiceEnv(format_penalty=-0.5, max_steps=5)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("five")
    assert (reward, info["action_is_valid"], info["parse_error"]) == (-1.5, False, "not a number")
    assert env.num_steps == 1
    observation, reward, terminated, truncated, info = env.step("6")
    assert (observation, reward, terminated, truncated) == ("6", 6.0, False, True)
    assert info["total"] == 6 and info["actions"] == ["6"] and env.num_steps == 3
    assert info["action_is_valid"] and info["parse_error"] is None and not info["success"]


def test_an_env_without_apply_or_play_is_refused() -> None:
    class Silent(CounterEnv):
        _apply = TextEnv._apply

    with pytest.raises(TypeError, match="Silent must implement _apply"):
        Silent()
