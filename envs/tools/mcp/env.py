"""``mcp_tools``: questions answered with the tools of an MCP server.

The tools are the server's own (its names, descriptions and JSON schemas reach the
chat template as they are), called through the official ``mcp`` SDK over stdio (a
command the env starts) or streamable HTTP (a URL); the questions and their answers
come from a task set file (:mod:`agentgym.tasksets`: JSONL, JSON, Parquet or a
``datasets`` folder). A call that takes longer than ``call_timeout`` answers the model
with an error; a result longer than ``max_result_chars`` is cut. A server that dies
mid-episode fails that episode, naming the server, and is started again at the next
reset. Each env holds its own connection (a stdio server per env; a URL is shared).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any, ClassVar

import numpy as np

from agentgym.envs.tools.mcp.connection import MCPConnection
from agentgym.envs.tools.tool_env import ToolEnv
from agentgym.envs.tools.tools import Tool
from agentgym.tasksets import TaskSet, TaskSetConfig, load_taskset

DEFAULT_SERVER = "python -m agentgym.envs.tools.mcp.calculator"
"""The calculator this package ships (add, subtract, multiply), served over stdio."""


class MCPToolEnv(ToolEnv):
    """Answer the question. You may call the tools (an MCP server's) as often as you need
    before you answer.

    Args:
        server: The MCP server: a command (``python calculator.py``; ``python`` is
            this interpreter) started over stdio, or a streamable HTTP URL
            (``http://127.0.0.1:8000/mcp``); default: the calculator this package
            ships (:data:`DEFAULT_SERVER`).
        tasks: The task set: a file or folder path, or a mapping of
            :class:`~agentgym.tasksets.TaskSetConfig`'s keys (``path``, ``split``,
            ``format: {prompt_key, response_key}``); each row a question and its
            answer. None: arithmetic questions for the calculator, drawn per seed.
        call_timeout: Seconds a tool call may take.
        connect_timeout: Seconds to start and reach the server.
        max_turns: Responses per episode.
        max_tool_calls: Tool calls per episode.
        **kwargs: :class:`~agentgym.envs.tools.tool_env.ToolEnv`'s own options.

    Raises:
        ToolServerDiedError: If the server cannot be reached.
        TaskSetError: If the task set cannot be read.
    """

    answer_format: ClassVar[str] = "the final answer only, e.g. <answer>42</answer>."

    def __init__(
        self,
        *,
        server: str | Sequence[str] = DEFAULT_SERVER,
        tasks: str | dict[str, Any] | None = None,
        call_timeout: float = 10.0,
        connect_timeout: float = 30.0,
        max_turns: int = 4,
        max_tool_calls: int = 6,
        **kwargs: Any,
    ) -> None:
        self.taskset: TaskSet | None = None
        if tasks is not None:
            mapping = tasks if isinstance(tasks, dict) else {"path": tasks}
            self.taskset = load_taskset(TaskSetConfig.from_mapping(mapping))
        self.connection = MCPConnection(server, timeout=connect_timeout)
        self.call_timeout = call_timeout
        tools = [
            Tool(
                tool.name,
                tool.description,
                _plain(tool.input_schema),
                partial(self._call, tool.name),
            )
            for tool in self.connection.tools
        ]
        try:
            super().__init__(tools, max_turns=max_turns, max_tool_calls=max_tool_calls, **kwargs)
        except BaseException:
            self.connection.close()
            raise
        self._answer: str | None = None

    def _call(self, name: str, **arguments: Any) -> str:
        return self.connection.call(name, arguments, timeout=self.call_timeout)

    def _new_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.connection.ensure()  # a server that died last episode starts again
        if self.taskset is None:  # the calculator's own questions, drawn per seed
            question, self._answer = arithmetic_question(self.np_random)
            return question, {"server_restarts": self.connection.restarts}
        index = options.get("task_index")
        if index is None:
            index = int(self.np_random.integers(len(self.taskset)))
        task = self.taskset.task(int(index) % len(self.taskset))
        self._answer = task.response
        return task.prompt, {"task_index": int(index), "server_restarts": self.connection.restarts}

    def _score(self, answer: str) -> tuple[float, bool]:
        solved = self._answer is not None and same_answer(answer, self._answer)
        return (1.0 if solved else 0.0), solved

    def close(self) -> None:
        """Close the server connection (a stdio server ends with it)."""
        self.connection.close()
        super().close()


def arithmetic_question(rng: np.random.Generator) -> tuple[str, str]:
    """A question for the calculator, and its answer: ``a op b`` then ``op c``."""
    a, b, c = (int(n) for n in rng.integers(2, 100, size=3))
    first, second = rng.choice(["plus", "minus", "times"], size=2)
    value = {"plus": a + b, "minus": a - b, "times": a * b}[str(first)]
    value = {"plus": value + c, "minus": value - c, "times": value * c}[str(second)]
    return f"What is ({a} {first} {b}) {second} {c}?", str(value)


def same_answer(given: str, expected: str) -> bool:
    """Whether ``given`` is ``expected``: as numbers when both are (to 1e-6 relative),
    else as text, ignoring case and surrounding space."""
    try:
        a, b = float(given.strip().replace(",", "")), float(expected.strip().replace(",", ""))
    except ValueError:
        return given.strip().lower() == expected.strip().lower()
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    """The server's JSON schema without pydantic's ``title`` entries (tokens the model
    need not read)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title":
            continue
        if key == "properties" and isinstance(value, dict):
            value = {name: _plain(spec) for name, spec in value.items()}
        out[key] = value
    return out
