"""MathTool: arithmetic and word problems, with a sandboxed ``python`` tool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from agentgym.envs.parsing import ParsedResponse
from agentgym.envs.text_env import TextEnv, TurnResult
from agentgym.envs.tools.math_tool.problems import GENERATORS, Problem
from agentgym.envs.tools.protocol import format_call
from agentgym.envs.tools.sandbox import PythonSandbox, SandboxLimits
from agentgym.envs.tools.toolbox import MAX_CALLS_PER_TURN, MAX_RESULT_CHARS, ToolBox
from agentgym.envs.tools.tools import Tool, ToolError
from agentgym.errors import did_you_mean

PYTHON_PARAMETERS = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "A Python program; print what you need."}
    },
    "required": ["code"],
    "additionalProperties": False,
}


def python_tool(sandbox: PythonSandbox) -> Tool:
    """The ``python`` tool: runs a program in ``sandbox``, returns its stdout and stderr.

    A program that raises, is killed by a limit or exits non-zero is a failed
    call: its output and the reason come back as the error.
    """

    def run(code: str) -> str:
        result = sandbox.run(code)
        if not result.ok:
            raise ToolError(result.to_text())
        return result.to_text()

    description = (
        "Run a Python 3 program in a fresh sandboxed process and return what it prints "
        "(stdout and stderr). Standard library only, no network, no state between calls."
    )
    return Tool("python", description, PYTHON_PARAMETERS, run, concurrent=True)


ANSWER_FORMAT = "the final number only, e.g. <answer>42</answer> or <answer>12.50</answer>."


class MathToolEnv(TextEnv):
    """MathTool: solve a math problem; a sandboxed ``python`` tool runs your code.

    Problems are generated per seed (see
    :mod:`agentgym.envs.tools.math_tool.problems`): arithmetic, GSM8K-like word
    problems and number puzzles that call for a program. Reward 1 for a
    numerically correct answer (the last number in ``<answer>``), 0 otherwise.

    Args:
        problems: Problem kinds to draw from (keys of
            :data:`~agentgym.envs.tools.math_tool.problems.GENERATORS`); default all.
        max_turns: Responses per episode.
        max_tool_calls: Tool calls per episode.
        max_calls_per_turn: Tool calls one response may make.
        max_result_chars: Longest tool result (longer ones are cut in the middle).
        cpu_seconds: CPU limit of one program.
        wall_seconds: Wall-clock limit of one program.
        memory_mb: Address-space limit of one program, in MiB.
        max_output_bytes: Output kept from one program.
        isolation: Sandbox isolation: ``"auto"``, ``"namespaces"`` or ``"none"``.
        allow_no_network_isolation: Run programs without namespaces where the
            machine has none, instead of refusing to start.
        site_packages: Let programs import installed packages (numpy, sympy, ...).
        **kwargs: :class:`TextEnv` options (``response_format``, ``format_penalty``,
            ``render_mode``).

    Raises:
        ValueError: If a problem kind is unknown.
        SandboxUnavailableError: If the sandbox cannot isolate the network
            and that is not allowed.
    """

    generator_version: ClassVar[int | None] = 1
    """Raised whenever the same seed would give a different task."""

    def __init__(
        self,
        *,
        problems: Sequence[str] | None = None,
        max_turns: int = 4,
        max_tool_calls: int = 6,
        max_calls_per_turn: int = MAX_CALLS_PER_TURN,
        max_result_chars: int = MAX_RESULT_CHARS,
        cpu_seconds: int = 5,
        wall_seconds: float = 10.0,
        memory_mb: int = 512,
        max_output_bytes: int = 8192,
        isolation: str = "auto",
        allow_no_network_isolation: bool = False,
        site_packages: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps=max_turns, **kwargs)
        kinds = list(problems) if problems is not None else list(GENERATORS)
        for kind in kinds:
            if kind not in GENERATORS:
                hint = did_you_mean(kind, GENERATORS)
                raise ValueError(
                    f"Unknown problem kind {kind!r}.{hint} Valid kinds: {list(GENERATORS)}"
                )
        if not kinds:
            raise ValueError(f"problems must name at least one of {list(GENERATORS)}")
        self.problem_kinds = kinds
        limits = SandboxLimits(
            cpu_seconds=cpu_seconds,
            wall_seconds=wall_seconds,
            memory_mb=memory_mb,
            max_output_bytes=max_output_bytes,
        )
        self.sandbox = PythonSandbox(
            limits=limits,
            isolation=isolation,
            allow_no_network_isolation=allow_no_network_isolation,
            site_packages=site_packages,
        )
        self.toolbox = ToolBox(
            [python_tool(self.sandbox)],
            max_tool_calls=max_tool_calls,
            max_calls_per_turn=max_calls_per_turn,
            max_result_chars=max_result_chars,
        )
        self.problem: Problem | None = None

    @property
    def _rules(self) -> str:
        return (
            "Solve the math problem in the user's message. You can run Python with the python "
            "tool: each call is a fresh process (nothing carries over between calls), so print "
            "the values you need."
        )

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        kind = self.problem_kinds[int(self.np_random.integers(len(self.problem_kinds)))]
        self.problem = GENERATORS[kind](self.np_random)
        info = {"problem_kind": kind, "sandbox_isolation": self.sandbox.isolation}
        return {**info, **self.toolbox.reset(self.problem.question)}

    # -- tool turns: the ToolBox parses and plays them --------------------------

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The env's tools as OpenAI function schemas."""
        return self.toolbox.schemas

    @property
    def instructions(self) -> str:
        """The rules, how to call tools and how to answer, for a system prompt."""
        return self.toolbox.instructions(self._rules, ANSWER_FORMAT, think=self._think)

    @property
    def _think(self) -> bool:
        return self.response_format == "think_answer"

    def _parse(self, text: str) -> ParsedResponse:
        return self.toolbox.parse(text, require_think=self._think)

    def _play(self, parsed: ParsedResponse) -> TurnResult:
        return self.toolbox.play(parsed, self._score)

    def _observation(self) -> str:
        return self.toolbox.observation

    def _success(self) -> bool:
        return self.toolbox.solved

    def _info(self) -> dict[str, Any]:
        return self.toolbox.info()

    def _score(self, answer: str) -> tuple[float, bool]:
        correct = self.problem is not None and self.problem.is_correct(answer)
        return float(correct), correct

    def oracle_response(self) -> str:
        """What an expert writes now: the solving program first, then the number it printed."""
        if self.problem is None:
            raise RuntimeError("call reset() before oracle_response()")
        think = (
            "<think>Compute it with Python.</think>"
            if self.response_format == "think_answer"
            else ""
        )
        if not self.toolbox.last_results:
            return think + format_call("python", {"code": self.problem.code})
        printed = self.toolbox.last_results[-1].strip().splitlines()
        return f"{think}<answer>{printed[-1] if printed else ''}</answer>"
