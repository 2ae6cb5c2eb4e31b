"""Agent runners: who plays an episode through the proxy (ROLL's ``AgentRunner``).

A runner gets its episode's :class:`AgentTask`, a ``base_url`` and an ``api_key``,
plays with any OpenAI client, and returns an :class:`AgentResult` (or posts the
reward to the session's ``/feedback`` and returns None). Its ``run`` may be a
coroutine function (run on the rollout's event loop) or a plain function (run in a
thread, so a synchronous agent framework works unchanged).

Built in:

* :class:`EnvRunner` (``agent.runner: env``; ROLL's ``GEMRunner``): plays the
  episode's registered agentgym env, its observations as user messages, the model's
  replies as actions: the env manager's own loop, over HTTP.
* :class:`ToolCallRunner` (``agent.runner: tool_call``; ROLL's ``ToolCallRunner``): a
  tool env played as an OpenAI tool-calling agent (``tools`` and ``tool_calls``).

Any other runner is named by import path (``agent.runner: my_pkg.agents:MyRunner``,
ROLL's ``agent_runner_cls``) and built with no arguments.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import weakref
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentgym.errors import ConfigError, did_you_mean
from agentgym.rollout.turns import observation_messages, step_window, strip_think
from agentgym.rollout.workers import EnvClient


@dataclass(frozen=True)
class AgentTask:
    """One episode for a runner to play.

    Attributes:
        seed: The reset seed (shared by the group).
        env_name: The registered env's name.
        tag: The env's tag.
        group_id: The episode's group.
        env_index: The env's index in its manager.
        reset_options: The reset's options (``{"task_index": n}`` for a task set).
        max_turns: The most model turns (the proxy refuses more).
        max_actions: The most env actions (None: no limit).
        mode: ``trajectory`` or ``step`` (what the run trains).
        history_length: ``step`` mode: the past turns each prompt keeps.
        strip_think_history: ``step`` mode: drop ``<think>`` blocks of past turns.
        env: The episode's env, for runners that play it here (:class:`EnvRunner`);
            an outside agent ignores it.
    """

    seed: int
    env_name: str
    tag: str
    group_id: int
    env_index: int
    reset_options: Mapping[str, Any] | None = None
    max_turns: int = 10
    max_actions: int | None = None
    mode: str = "trajectory"
    history_length: int = 0
    strip_think_history: bool = False
    env: EnvClient | None = None


@dataclass(frozen=True)
class TurnReport:
    """What the env made of one model turn (the runner's n-th model call)."""

    reward: float = 0.0
    action_is_valid: bool = True
    actions: tuple[str, ...] = ()


@dataclass
class AgentResult:
    """How an episode went, as its runner reports it.

    Attributes:
        reward: The episode's reward; None: the sum of ``turns``' rewards, else the
            session's ``/feedback``, else 0.
        success: Whether the agent succeeded.
        termination_reason: Why the episode ended (``terminated``, ``truncated``,
            ``max_turns``, ``max_actions``, ``max_length``); None: ``terminated``.
        turns: One report per model call, in order (None: the reward goes on the last).
        info: Anything else, kept with the trajectory.
    """

    reward: float | None = None
    success: bool = False
    termination_reason: str | None = None
    turns: list[TurnReport] | None = None
    info: dict[str, Any] = field(default_factory=dict)


class AgentRunner(Protocol):
    """Plays one episode through the proxy."""

    def run(
        self, task: AgentTask, base_url: str, api_key: str
    ) -> AgentResult | Awaitable[AgentResult | None] | None:
        """Play ``task`` with an OpenAI client at ``base_url`` / ``api_key``."""
        ...


class EnvRunner:
    """Plays the episode's agentgym env through the OpenAI client, as the env manager's
    own loop would: the env's instructions as the system message, each observation as
    a user message (tool results as tool messages), each reply as the action. In
    ``trajectory`` mode it sends the whole conversation; in ``step`` mode the window
    the env manager's step prompts keep (``history_length``)."""

    async def run(self, task: AgentTask, base_url: str, api_key: str) -> AgentResult:
        """Play ``task.env`` to its end, ``max_turns`` or ``max_actions``."""
        import openai
        from openai.types.chat import ChatCompletion

        if task.env is None:
            raise ValueError("EnvRunner plays the episode's env: the task has none")
        env = task.env
        client = _clients.session(base_url, api_key)
        start = await env.reset(task.seed, options=task.reset_options)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": start.instructions},
            {"role": "user", "content": start.observation},
        ]
        reports: list[TurnReport] = []
        actions, success = 0, False
        for turn in range(task.max_turns):
            try:
                # the client's documented raw post: the messages go as they are, without
                # the typed transform of chat.completions.create (1-3 ms a request here)
                reply = await client.post(
                    "/chat/completions",
                    body={
                        "model": "policy",
                        "messages": self._window(task, messages),
                        **self._tools(start.tools),
                    },
                    cast_to=ChatCompletion,
                )
            except openai.BadRequestError as error:
                if error.code == "context_length_exceeded":
                    return _result(reports, "max_length", success)
                raise
            message = reply.choices[0].message
            text = self._action(message)
            messages.append(self._assistant(message))
            outcome = await env.step(text)
            info = outcome.info
            report = TurnReport(
                float(outcome.reward),
                bool(info["action_is_valid"]),
                tuple(info.get("actions", ())),
            )
            reports.append(report)
            success = bool(info.get("success", False))
            actions += len(report.actions)
            if outcome.terminated or outcome.truncated:
                reason = "terminated" if outcome.terminated else "truncated"
                return _result(reports, reason, success)
            if task.max_actions is not None and actions >= task.max_actions:
                return _result(reports, "max_actions", success)
            if turn + 1 < task.max_turns:
                messages.extend(self._observations(message, outcome.observation, info))
        return _result(reports, "max_turns", success)

    # -- what differs between the env runner and the tool-call runner ------------------

    def _tools(self, tools: list[dict[str, Any]]) -> dict[str, Any]:
        """The request's tool keys: the env's tools reach the chat template, and the reply
        is the text as the model wrote it (the env parses it, as in process)."""
        return {"tools": tools, "tool_choice": "none"} if tools else {}

    def _action(self, message: Any) -> str:
        """The text the env steps with."""
        return str(message.content or "")

    def _assistant(self, message: Any) -> dict[str, Any]:
        """The reply as the conversation keeps it."""
        return {"role": "assistant", "content": message.content or ""}

    def _observations(
        self, message: Any, observation: str, info: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The messages after a step: tool results as tool messages, else the observation."""
        return observation_messages(observation, info)

    @staticmethod
    def _window(task: AgentTask, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if task.mode == "trajectory":
            return messages
        start = step_window(messages, task.history_length)
        window = [messages[0], *messages[start:]]
        if task.strip_think_history:
            window = [
                {**m, "content": strip_think(m["content"])} if m["role"] == "assistant" else m
                for m in window
            ]
        return window


class _Clients:
    """A few ``AsyncOpenAI`` clients per event loop, each copied per session with its base
    URL and key: a new client builds a TLS context (about 30 ms on these CPUs), a copy
    shares its client's connection pool; sessions spread over :data:`SHARDS` pools, as a
    pool's bookkeeping grows with the square of its connections (a third of a request's
    client time at 128 connections in one pool)."""

    SHARDS = 8

    def __init__(self) -> None:
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._next = 0

    def session(self, base_url: str, api_key: str) -> Any:
        import openai

        loop = asyncio.get_running_loop()
        clients = self._clients.setdefault(loop, [])
        if len(clients) < self.SHARDS:
            clients.append(openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0))
            client = clients[-1]
        else:
            self._next = (self._next + 1) % self.SHARDS
            client = clients[self._next]
        return client.with_options(base_url=base_url, api_key=api_key)


_clients = _Clients()


class ToolCallRunner(EnvRunner):
    """Plays a tool env as an OpenAI tool-calling agent (ROLL's ``ToolCallRunner``): the
    env's tools go as ``tools``, the replies come back as ``tool_calls`` (parsed by the
    proxy from the model's Hermes blocks), the runner executes them through the env and
    answers each with a ``tool`` message bearing its ``tool_call_id``. The proxy splices
    the replies back as the engine's ids, so the samples are the env runner's."""

    def _tools(self, tools: list[dict[str, Any]]) -> dict[str, Any]:
        return {"tools": tools} if tools else {}

    def _action(self, message: Any) -> str:
        calls = "".join(
            f'<tool_call>{{"name": {json.dumps(c.function.name)}, '
            f'"arguments": {c.function.arguments}}}</tool_call>'
            for c in message.tool_calls or ()
        )
        return f"{message.content or ''}{calls}"

    def _assistant(self, message: Any) -> dict[str, Any]:
        return dict(message.model_dump(exclude_none=True))

    def _observations(
        self, message: Any, observation: str, info: dict[str, Any]
    ) -> list[dict[str, Any]]:
        results = info.get("tool_results")
        calls = message.tool_calls or ()
        if not results or len(results) != len(calls):
            return observation_messages(observation, info)
        return [
            {"role": "tool", "tool_call_id": call.id, "content": str(result)}
            for call, result in zip(calls, results, strict=True)
        ]


def _result(reports: list[TurnReport], reason: str, success: bool) -> AgentResult:
    return AgentResult(None, success=success, termination_reason=reason, turns=reports)


BUILT_IN: dict[str, type] = {"env": EnvRunner, "tool_call": ToolCallRunner}
"""``agent.runner`` names of the built-in runners."""

ROLL_RUNNERS = {"GEMRunner": "env", "ToolCallRunner": "tool_call"}
"""ROLL's ``agent_runner_cls`` class names and the built-in runner each maps to."""


def load_runner(name: str) -> AgentRunner:
    """The runner ``name`` names: a built-in one (:data:`BUILT_IN`), a ROLL class
    (:data:`ROLL_RUNNERS`), or ``package.module:Class`` / ``package.module.Class``.

    Raises:
        ConfigError: When the name is none of these, or the class has no ``run``.
    """
    if name in BUILT_IN:
        return BUILT_IN[name]()
    short = name.rsplit(".", 1)[-1].rsplit(":", 1)[-1]
    if short in ROLL_RUNNERS:
        return BUILT_IN[ROLL_RUNNERS[short]]()
    module_name, _, attribute = name.replace(":", ".").rpartition(".")
    if not module_name:
        raise ConfigError(
            f"agent.runner={name!r} is neither a built-in runner ({', '.join(BUILT_IN)}) nor "
            f"an import path 'package.module:Class'.{did_you_mean(name, list(BUILT_IN))}"
        )
    try:
        runner_cls = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"agent.runner={name!r} cannot be imported: {error}") from error
    runner = runner_cls()
    if not callable(getattr(runner, "run", None)):
        raise ConfigError(f"agent.runner={name!r}: {runner_cls.__name__} has no run method")
    return runner
