"""The tool-use env base: one response is one turn of tool calls or the answer.

Each turn the model either calls tools (their results come back in
``info["tool_results"]``, one string per call, for the rollout to send as
``tool`` messages) or answers, which ends the episode with the task's score.
The episode is truncated after ``max_turns`` turns, or on the turn that tries
to go past ``max_tool_calls`` calls in all.

A turn is invalid, and earns ``format_penalty``, when it breaks the protocol
(no call and no answer, calls and an answer together, ...) or when any of its
calls is malformed, names an unknown tool, has bad arguments, goes past the
per-turn or per-episode limits, or fails (e.g. Python code that raises). Each
such call still gets a result: the error message. The episode goes on.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentgym.envs.parsing import ParsedResponse
from agentgym.envs.text_env import MAX_TEXT_LENGTH, TextEnv
from agentgym.envs.tools.protocol import ParsedTurn, parse_turn, tool_instructions
from agentgym.envs.tools.text import sanitize
from agentgym.envs.tools.tools import Tool, ToolOutcome, check_call, error_outcome, run_call


class ToolEnv(TextEnv):
    """Base class of the tool-use envs (math with Python, SQL, search QA).

    Subclasses build their tools in ``__init__`` (:attr:`_tools`) and
    implement :meth:`_new_task` (a new question from ``self.np_random``),
    :meth:`_score`, :attr:`_rules`, :attr:`_answer_format` and
    ``oracle_response``.

    Args:
        max_turns: Responses per episode; the episode is truncated after the last.
        max_tool_calls: Tool calls per episode; a turn that tries to go past
            them truncates the episode.
        max_calls_per_turn: Tool calls one response may make.
        max_result_chars: Longest tool result (longer ones are cut).
        **kwargs: :class:`TextEnv` options (``response_format``,
            ``format_penalty``, ``render_mode``).

    Raises:
        ValueError: If a limit is below 1.
    """

    def __init__(
        self,
        *,
        max_turns: int = 6,
        max_tool_calls: int = 8,
        max_calls_per_turn: int = 4,
        max_result_chars: int = 4000,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps=max_turns, **kwargs)
        limits = {
            "max_tool_calls": max_tool_calls,
            "max_calls_per_turn": max_calls_per_turn,
            "max_result_chars": max_result_chars,
        }
        for name, value in limits.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.max_turns = max_turns
        self.max_tool_calls = max_tool_calls
        self.max_calls_per_turn = max_calls_per_turn
        self.max_result_chars = max_result_chars
        self._tools: dict[str, Tool] = {}
        self.question = ""
        self.num_tool_calls = 0
        self.last_results: list[str] = []
        self._last_observation = ""
        self._solved = False

    # -- public API -------------------------------------------------------------

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The env's tools as OpenAI function schemas."""
        return [tool.schema() for tool in self._tools.values()]

    @property
    def instructions(self) -> str:
        """The rules, how to call tools and how to answer, for a system prompt."""
        example = next(iter(self._tools.values()))
        protocol = tool_instructions(
            example=self._example_call(example),
            max_calls_per_turn=self.max_calls_per_turn,
            max_tool_calls=self.max_tool_calls,
            think=self.response_format == "think_answer",
        )
        return f"{self._rules}\n{protocol}\nAnswer format: {self._answer_format}"

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one response: run its tool calls, or score its answer.

        Args:
            action: The model's raw response text.

        Returns:
            ``(observation, reward, terminated, truncated, info)``. ``info`` has
            ``action_is_valid``, ``success``, ``actions`` (the tools called, or
            ``["answer"]``), ``parse_error``, ``tool_results`` (one string per
            call, empty when the turn had no calls), ``invalid_tool_calls``
            and ``num_tool_calls`` (in the episode so far).
        """
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self.num_steps += 1
        turn = parse_turn(action, require_think=self.response_format == "think_answer")
        reward, terminated, over_budget = 0.0, False, False
        outcomes: list[ToolOutcome] = []
        played: list[str] = []
        if turn.answer is not None:
            reward, self._solved = self._score(turn.answer)
            terminated, played = True, ["answer"]
            verdict = "correct" if self._solved else "not correct"
            self._last_observation = f"Your answer was {verdict}. The episode is over."
        elif turn.calls:
            outcomes, played, over_budget = self._run_calls(turn)
            self._last_observation = "\n\n".join(
                f"<tool_response>\n{outcome.text}\n</tool_response>" for outcome in outcomes
            )
        else:
            self._last_observation = (
                f"Invalid response: {turn.error}. Call a tool with <tool_call>...</tool_call> "
                "or give your final answer with <answer>...</answer>."
            )
        valid = turn.error is None and all(outcome.ok for outcome in outcomes)
        if not valid:
            reward += self.format_penalty
        truncated = not terminated and (self.num_steps >= self.max_turns or over_budget)
        self._done = terminated or truncated
        self.last_results = [outcome.text for outcome in outcomes]
        info: dict[str, Any] = {
            "parse_error": turn.error,
            "tool_results": list(self.last_results),
            "invalid_tool_calls": sum(not outcome.ok for outcome in outcomes),
        }
        info.update(self._info(), action_is_valid=valid, actions=played, success=self._solved)
        return self._observation(), float(reward), terminated, truncated, info

    # -- the turn ---------------------------------------------------------------

    def _run_calls(self, turn: ParsedTurn) -> tuple[list[ToolOutcome], list[str], bool]:
        """Check every call, run the valid ones, and return outcomes in call order."""
        outcomes: list[ToolOutcome | None] = []
        runnable: list[int] = []
        over_budget = False
        for index, call in enumerate(turn.calls):
            outcome = check_call(self._tools, call)
            if turn.error is not None:
                outcome = error_outcome(f"{turn.error}; this call was not run")
            elif outcome is None and index >= self.max_calls_per_turn:
                outcome = error_outcome(
                    f"at most {self.max_calls_per_turn} tool calls per response; "
                    "this call was not run"
                )
            elif outcome is None and self.num_tool_calls >= self.max_tool_calls:
                outcome = error_outcome(
                    f"the budget of {self.max_tool_calls} tool calls is used up; "
                    "this call was not run"
                )
                over_budget = True
            if outcome is None:
                self.num_tool_calls += 1
                runnable.append(index)
            outcomes.append(outcome)
        calls = [turn.calls[index] for index in runnable]
        concurrent = len(calls) > 1 and all(
            self._tools[str(call.name)].concurrent for call in calls
        )
        if concurrent:
            with ThreadPoolExecutor(len(calls)) as executor:
                results = list(executor.map(lambda call: run_call(self._tools, call), calls))
        else:
            results = [run_call(self._tools, call) for call in calls]
        for index, result in zip(runnable, results, strict=True):
            outcomes[index] = result
        final = [self._clean(outcome) for outcome in outcomes if outcome is not None]
        played = [str(turn.calls[index].name) for index in runnable]
        return final, played, over_budget

    def _clean(self, outcome: ToolOutcome) -> ToolOutcome:
        """Sanitize, and cut a long result in the middle: its end often says what went wrong."""
        text = sanitize(outcome.text)
        if len(text) > self.max_result_chars:
            tail = min(500, self.max_result_chars // 4)
            cut = len(text) - self.max_result_chars
            head = text[: self.max_result_chars - tail]
            text = f"{head}\n[... {cut} characters cut ...]\n{text[-tail:]}"
        return ToolOutcome(text, outcome.ok)

    @staticmethod
    def _example_call(tool: Tool) -> str:
        arguments = {name: f"<{name}>" for name in tool.parameters.get("required", [])}
        return f"<tool_call>{json.dumps({'name': tool.name, 'arguments': arguments})}</tool_call>"

    # -- TextEnv hooks ----------------------------------------------------------

    def _parse(self, text: str) -> ParsedResponse:
        """The turn as a :class:`ParsedResponse` (``step`` parses turns itself)."""
        turn = parse_turn(text, require_think=self.response_format == "think_answer")
        errors = [call.error for call in turn.calls if call.error is not None]
        error = turn.error or (errors[0] if errors else None)
        names = ("answer",) if turn.answer is not None else tuple(str(c.name) for c in turn.calls)
        return ParsedResponse(
            actions=names if error is None else (), is_valid=error is None, error=error
        )

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.num_tool_calls = 0
        self.last_results = []
        self._solved = False
        self.question, info = self._new_task(options)
        self._last_observation = self.question
        return {**info, "tool_results": []}

    def _apply(self, action: str) -> tuple[float, bool]:
        raise RuntimeError("tool envs play whole turns in step(); _apply is not used")

    def _observation(self) -> str:
        return sanitize(self._last_observation)[:MAX_TEXT_LENGTH]

    def _success(self) -> bool:
        return self._solved

    def _info(self) -> dict[str, Any]:
        return {"num_tool_calls": self.num_tool_calls}

    # -- subclass hooks ---------------------------------------------------------

    @abstractmethod
    def _new_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A new task from ``self.np_random``: the question text and episode info."""

    @abstractmethod
    def _score(self, answer: str) -> tuple[float, bool]:
        """Score the content of ``<answer>``: ``(reward, success)``; a wrong answer scores 0."""

    @property
    @abstractmethod
    def _answer_format(self) -> str:
        """How to write the answer, with an example, for the system prompt."""
