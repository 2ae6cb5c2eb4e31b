"""MathTool: arithmetic and word problems, with a sandboxed ``python`` tool."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from agentgym.envs.text_env import require_reset
from agentgym.envs.tools.math_tool.problems import GENERATORS, Problem
from agentgym.envs.tools.sandbox import PythonSandbox, SandboxLimits
from agentgym.envs.tools.tool_env import ToolEnv, task_kinds
from agentgym.envs.tools.tools import Tool, ToolError

PYTHON_PARAMETERS = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "A Python program; print what you need."}
    },
    "required": ["code"],
    "additionalProperties": False,
}
PYTHON_DESCRIPTION = (
    "Run a Python 3 program in a fresh sandboxed process and return what it prints "
    "(stdout and stderr). Standard library only, no network, no state between calls."
)


class MathToolEnv(ToolEnv):
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
        cpu_seconds: CPU limit of one program.
        wall_seconds: Wall-clock limit of one program.
        memory_mb: Address-space limit of one program, in MiB.
        max_output_bytes: Output kept from one program.
        isolation: Sandbox isolation: ``"auto"``, ``"namespaces"`` or ``"none"``.
        allow_no_network_isolation: Run programs without namespaces where the
            machine has none, instead of refusing to start.
        site_packages: Let programs import installed packages (numpy, sympy, ...).
        **kwargs: :class:`~agentgym.envs.tools.tool_env.ToolEnv`'s own options.

    Raises:
        ValueError: If a problem kind is unknown.
        SandboxUnavailableError: If the sandbox cannot isolate the network
            and that is not allowed.
    """

    generator_version: ClassVar[int | None] = 1
    answer_format: ClassVar[str] = (
        "the final number only, e.g. <answer>42</answer> or <answer>12.50</answer>."
    )

    def __init__(
        self,
        *,
        problems: Sequence[str] | None = None,
        max_turns: int = 4,
        max_tool_calls: int = 6,
        cpu_seconds: int = 5,
        wall_seconds: float = 10.0,
        memory_mb: int = 512,
        max_output_bytes: int = 8192,
        isolation: str = "auto",
        allow_no_network_isolation: bool = False,
        site_packages: bool = False,
        **kwargs: Any,
    ) -> None:
        python = Tool(
            "python", PYTHON_DESCRIPTION, PYTHON_PARAMETERS, self._run_python, concurrent=True
        )
        super().__init__([python], max_turns=max_turns, max_tool_calls=max_tool_calls, **kwargs)
        self.problem_kinds = task_kinds("problems", problems, GENERATORS)
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
        self.problem: Problem | None = None

    @property
    def _rules(self) -> str:
        return (
            "Solve the math problem in the user's message. You can run Python with the python "
            "tool: each call is a fresh process (nothing carries over between calls), so print "
            "the values you need."
        )

    def _run_python(self, code: str) -> str:
        """The ``python`` tool: run a program in the sandbox; what it printed comes back.

        A program that raises, is killed by a limit or exits non-zero is a
        failed call: its output and the reason come back as the error.
        """
        result = self.sandbox.run(code)
        if not result.ok:
            raise ToolError(result.to_text())
        return result.to_text()

    def _new_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        kind = self.problem_kinds[int(self.np_random.integers(len(self.problem_kinds)))]
        self.problem = GENERATORS[kind](self.np_random)
        info = {"problem_kind": kind, "sandbox_isolation": self.sandbox.isolation}
        return self.problem.question, info

    def _score(self, answer: str) -> tuple[float, bool]:
        correct = self.problem is not None and self.problem.is_correct(answer)
        return float(correct), correct

    def oracle_response(self) -> str:
        """What an expert writes now: the solving program first, then the number it printed."""
        problem = require_reset(self.problem, "oracle_response()")
        thought = "Compute it with Python."
        if not self.toolbox.last_results:
            return self._expert(thought, calls=[("python", {"code": problem.code})])
        printed = self.toolbox.last_results[-1].strip().splitlines()
        return self._expert(thought, answer=printed[-1] if printed else "")
