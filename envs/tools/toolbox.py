"""Tool support for a :class:`~agentgym.envs.text_env.TextEnv`: one response is one turn
of tool calls or the answer.

A tool env (a :class:`~agentgym.envs.tools.tool_env.ToolEnv`) owns a
:class:`ToolBox` and hands it its turns: ``_parse`` is :meth:`ToolBox.parse`
and ``_play`` is :meth:`ToolBox.play` with the env's scoring function. Each
turn the model either calls tools (their results come back in
``info["tool_results"]``, one string per call, for the rollout to send as
``tool`` messages) or answers, which ends the episode with the task's score.
The episode is truncated after ``max_turns`` turns (the env's ``max_steps``),
or on the turn that tries to go past ``max_tool_calls`` calls in all.

A turn is invalid, and earns ``format_penalty``, when it breaks the protocol
(no call and no answer, calls and an answer together, ...) or when any of its
calls is malformed, names an unknown tool, has bad arguments, goes past the
per-turn or per-episode limits, or fails (e.g. Python code that raises). Each
such call still gets a result: the error message. The episode goes on.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentgym.envs.parsing import ParsedResponse
from agentgym.envs.text_env import MAX_TEXT_LENGTH, TurnResult
from agentgym.envs.tools.protocol import ParsedTurn, parse_turn, tool_instructions
from agentgym.envs.tools.text import sanitize
from agentgym.envs.tools.tools import Tool, ToolOutcome, check_call, error_outcome, run_call

MAX_CALLS_PER_TURN = 4
"""Default of the tool calls one response may make."""
MAX_RESULT_CHARS = 4000
"""Default of the longest tool result (longer ones are cut in the middle)."""

Scorer = Callable[[str], tuple[float, bool]]
"""Scores the content of ``<answer>``: ``(reward, success)``."""


@dataclass(frozen=True)
class ToolResponse(ParsedResponse):
    """A parsed tool-env response: the parser's view plus the calls or the answer.

    Attributes:
        turn: The tool calls (well-formed or not) or the answer.
    """

    turn: ParsedTurn = field(default_factory=ParsedTurn)


class ToolBox:
    """The tools of an env, their limits, and the tool state of the current episode.

    Args:
        tools: The tools the model may call.
        max_tool_calls: Tool calls per episode; a turn that tries to go past
            them truncates the episode.
        max_calls_per_turn: Tool calls one response may make.
        max_result_chars: Longest tool result (longer ones are cut).

    Raises:
        ValueError: If there is no tool or a limit is below 1.
    """

    def __init__(
        self,
        tools: Sequence[Tool],
        *,
        max_tool_calls: int,
        max_calls_per_turn: int = MAX_CALLS_PER_TURN,
        max_result_chars: int = MAX_RESULT_CHARS,
    ) -> None:
        if not tools:
            raise ValueError("a ToolBox needs at least one tool")
        limits = {
            "max_tool_calls": max_tool_calls,
            "max_calls_per_turn": max_calls_per_turn,
            "max_result_chars": max_result_chars,
        }
        for name, value in limits.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.tools = {tool.name: tool for tool in tools}
        self.max_tool_calls = max_tool_calls
        self.max_calls_per_turn = max_calls_per_turn
        self.max_result_chars = max_result_chars
        self.num_tool_calls = 0
        self.last_results: list[str] = []
        self.solved = False
        self._observation = ""

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools as OpenAI function schemas, for the chat template's ``tools=``."""
        return [tool.schema() for tool in self.tools.values()]

    def instructions(self, rules: str, answer_format: str, *, think: bool) -> str:
        """The system prompt: the env's rules, how to call tools, how to answer."""
        example = next(iter(self.tools.values()))
        arguments = {name: f"<{name}>" for name in example.parameters.get("required", [])}
        call = json.dumps({"name": example.name, "arguments": arguments})
        protocol = tool_instructions(
            example=f"<tool_call>{call}</tool_call>",
            max_calls_per_turn=self.max_calls_per_turn,
            max_tool_calls=self.max_tool_calls,
            think=think,
        )
        return f"{rules}\n{protocol}\nAnswer format: {answer_format}"

    @property
    def observation(self) -> str:
        """What the model sees after the turn (the question before the first one)."""
        return sanitize(self._observation)[:MAX_TEXT_LENGTH]

    def info(self) -> dict[str, Any]:
        """Tool state for every ``info``: ``num_tool_calls`` in the episode so far."""
        return {"num_tool_calls": self.num_tool_calls}

    def reset(self, question: str) -> dict[str, Any]:
        """Start an episode on ``question``; returns the reset info's tool part."""
        self.num_tool_calls = 0
        self.last_results = []
        self.solved = False
        self._observation = question
        return {"tool_results": []}

    def parse(self, text: str, *, require_think: bool) -> ToolResponse:
        """Split a response into tool calls or an answer; never raises."""
        turn = parse_turn(text, require_think=require_think)
        errors = [call.error for call in turn.calls if call.error is not None]
        error = turn.error or (errors[0] if errors else None)
        names = ("answer",) if turn.answer is not None else tuple(str(c.name) for c in turn.calls)
        return ToolResponse(
            actions=names if error is None else (), is_valid=error is None, error=error, turn=turn
        )

    def play(self, parsed: ParsedResponse, score: Scorer) -> TurnResult:
        """Run a response's tool calls, or score its answer; one env step either way.

        Args:
            parsed: What :meth:`parse` returned.
            score: Scores the answer.

        Returns:
            The turn; its info has ``tool_results`` (one string per call, empty
            when the turn had no calls) and ``invalid_tool_calls``.

        Raises:
            TypeError: If ``parsed`` did not come from :meth:`parse`.
        """
        if not isinstance(parsed, ToolResponse):
            raise TypeError(f"ToolBox.play needs ToolBox.parse's result, got {parsed!r}")
        turn = parsed.turn
        reward, terminated, over_budget = 0.0, False, False
        outcomes: list[ToolOutcome] = []
        played: list[str] = []
        if turn.answer is not None:
            reward, self.solved = score(turn.answer)
            terminated, played = True, ["answer"]
            verdict = "correct" if self.solved else "not correct"
            self._observation = f"Your answer was {verdict}. The episode is over."
        elif turn.calls:
            outcomes, played, over_budget = self._run_calls(turn)
            self._observation = "\n\n".join(
                f"<tool_response>\n{outcome.text}\n</tool_response>" for outcome in outcomes
            )
        else:
            self._observation = (
                f"Invalid response: {turn.error}. Call a tool with <tool_call>...</tool_call> "
                "or give your final answer with <answer>...</answer>."
            )
        self.last_results = [outcome.text for outcome in outcomes]
        return TurnResult(
            reward,
            terminated,
            valid=turn.error is None and all(outcome.ok for outcome in outcomes),
            error=turn.error,
            actions=tuple(played),
            truncated=over_budget,
            info={
                "tool_results": list(self.last_results),
                "invalid_tool_calls": sum(not outcome.ok for outcome in outcomes),
            },
        )

    def _run_calls(self, turn: ParsedTurn) -> tuple[list[ToolOutcome], list[str], bool]:
        """Check every call, run the valid ones, and return outcomes in call order."""
        outcomes: list[ToolOutcome | None] = []
        runnable: list[int] = []
        over_budget = False
        for index, call in enumerate(turn.calls):
            outcome = check_call(self.tools, call)
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
        concurrent = len(calls) > 1 and all(self.tools[str(call.name)].concurrent for call in calls)
        if concurrent:
            with ThreadPoolExecutor(len(calls)) as executor:
                results = list(executor.map(lambda call: run_call(self.tools, call), calls))
        else:
            results = [run_call(self.tools, call) for call in calls]
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
