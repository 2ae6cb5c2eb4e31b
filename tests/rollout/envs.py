"""Small envs for rollout tests: a counter, a slow one, a crashing one, a tool-calling one."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import agentgym
from agentgym.envs.parsing import ParsedResponse
from agentgym.envs.text_env import TextEnv


class CountEnv(TextEnv):
    """Reach the target number with Inc and Dec."""

    action_names: ClassVar[tuple[str, ...]] = ("Inc", "Dec")

    def __init__(self, delay: float = 0.0, crash_at: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay = delay
        self.crash_at = crash_at

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.value = 0
        self.target = int(self.np_random.integers(2, 6))
        return {}

    def _apply(self, action: str) -> tuple[float, bool]:
        if self.delay:
            time.sleep(self.delay)
        if self.crash_at is not None and self.num_steps >= self.crash_at:
            raise RuntimeError("the env crashed")
        self.value += 1 if action == "Inc" else -1
        return float(self.value == self.target), self.value == self.target

    def _observation(self) -> str:
        return f"value {self.value}, target {self.target}"

    def _success(self) -> bool:
        return self.value == self.target

    def solve(self) -> list[str]:
        return ["Inc"] * (self.target - self.value)


_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class AddToolEnv(TextEnv):
    """Add two numbers with the add tool, then answer."""

    action_names: ClassVar[tuple[str, ...]] = ()

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two integers.",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "required": ["a", "b"],
                    },
                },
            }
        ]

    @property
    def instructions(self) -> str:
        return "Use the add tool, then give the sum as <answer>N</answer>."

    def _parse(self, text: str) -> ParsedResponse:
        calls = _CALL.findall(text)
        answer = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
        if calls:
            return ParsedResponse(actions=tuple("call:" + c for c in calls), is_valid=True)
        if answer:
            return ParsedResponse(actions=("answer:" + answer.group(1).strip(),), is_valid=True)
        return ParsedResponse(actions=(), is_valid=False, error="no tool call or answer")

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.a, self.b = (int(x) for x in self.np_random.integers(0, 50, size=2))
        self.results: list[str] = []
        self.answered: str | None = None
        return {}

    def _apply(self, action: str) -> tuple[float, bool]:
        kind, _, payload = action.partition(":")
        if kind == "answer":
            self.answered = payload
            return float(payload == str(self.a + self.b)), True
        try:
            arguments = json.loads(payload)["arguments"]
            self.results.append(str(int(arguments["a"]) + int(arguments["b"])))
        except (ValueError, KeyError, TypeError) as error:
            self.results.append(f"error: {error}")
        return 0.0, False

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.results = []
        observation, reward, terminated, truncated, info = super().step(action)
        if self.results:
            info["tool_results"] = list(self.results)
        return observation, reward, terminated, truncated, info

    def _observation(self) -> str:
        return " ".join(self.results) or f"What is {self.a} + {self.b}?"

    def _success(self) -> bool:
        return self.answered == str(self.a + self.b)

    def oracle_response(self) -> str:
        if self.num_steps == 0:
            call = {"name": "add", "arguments": {"a": self.a, "b": self.b}}
            return f"<tool_call>{json.dumps(call)}</tool_call>"
        return f"<answer>{self.a + self.b}</answer>"


@contextmanager
def registered(name: str, entry_point: Any) -> Iterator[str]:
    """Register an env for the duration of a test."""
    agentgym.register(name, entry_point)
    try:
        yield name
    finally:
        agentgym.unregister(name)
