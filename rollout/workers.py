"""Where the rollout's envs live: in this process, or on env workers.

The multi-turn loop talks to every env through an :class:`EnvClient`
(``reset``, ``step``, ``render``; each answer carries what the loop reads
next), so it does not know where the env lives:

- :class:`LocalEnv` wraps a :class:`~agentgym.envs.text_env.TextEnv` of this
  process and runs its calls in the rollout's thread pool (the default);
- :class:`~agentgym.rollout.worker_client.WorkerEnv` is env ``index`` of an
  :class:`EnvWorker` behind a :class:`~agentgym.cluster.WorkerHandle`: an
  object in this process (``LocalCluster``) or a Ray actor with its own
  process and interpreter lock.

An :class:`EnvWorker` holds up to ``max_env_num_per_worker`` envs and plays
them in as many threads. The driver sends it requests over a socket of its
own (:mod:`agentgym.rollout.data_plane`), not as Ray calls: one Ray call
costs about as much driver time as a whole in-process env-turn.
A worker's process may die (killed, out of memory); Ray then restarts it,
which builds its envs anew. Every reset names the worker's *incarnation*, so
an episode that began before a restart is not continued on a fresh env: its
next call raises :class:`EnvLostError`, and the loop ends it as an ``env_error``.

Reset options (an env's ``task_index``, see :func:`uses_task_index`) travel with
the reset, to whichever process holds the env.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from agentgym import registry
from agentgym.envs.adapter import make_text_env
from agentgym.envs.scripted import Agent, make_agent
from agentgym.envs.text_env import TextEnv
from agentgym.rollout.data_plane import RequestServer

_T = TypeVar("_T")

WORKER_SWITCH_INTERVAL = 0.05
"""Seconds a thread of an env worker's process may hold the interpreter lock while
others wait (Python's default is 0.005). With the default, the CPU-bound steps of a
worker's envs are sliced finely and all finish together, so its envs move in step
and the worker idles while they all wait on the driver for their next turn; with
50 ms a step mostly runs to its end, the envs drift apart, and the worker stays busy
(2 workers on 2 cores, 10 ms tool steps: 1.53× the in-process rollout with 5 ms,
1.99× with 50 ms; ``benchmarks/README.md``). Envs that wait on I/O or a subprocess
release the lock at once, as before."""


TASK_INDEX_FLAG = "uses_task_index"
"""The class attribute by which an env asks the env manager for a task index
(``options={"task_index": n}`` at each reset; docs/tasksets.md)."""


def uses_task_index(env: TextEnv) -> bool:
    """Whether ``env`` asks to be reset with the reset option ``task_index``.

    An env asks by setting the class attribute ``uses_task_index = True``; a plain
    Gymnasium env behind :class:`~agentgym.envs.adapter.GymTextEnv` asks the same
    way (the adapter hands its public attributes on).
    """
    return getattr(env, TASK_INDEX_FLAG, False) is True


class EnvLostError(RuntimeError):
    """The env's worker died or restarted during the episode; the episode cannot go on."""


@dataclass(frozen=True)
class EnvBuild:
    """What one env is made from (sent to the worker that makes it).

    Attributes:
        name: A registered env name or Gymnasium id.
        kwargs: Constructor arguments.
        render_mode: Passed to envs that support it.
    """

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    render_mode: str | None = None

    def make(self) -> TextEnv:
        """Build the env (any Gymnasium text env, a plain one adapted)."""
        return make_text_env(self.name, self.kwargs, render_mode=self.render_mode)


@dataclass(frozen=True)
class EnvReset:
    """An episode's start: what the loop puts in the first prompt.

    Attributes:
        observation: The first observation.
        info: The reset's info.
        instructions: The env's instructions (the system prompt), read after the reset.
        tools: The env's tools (OpenAI function schemas), read before the reset.
        frame: The ``rgb_array`` frame after the reset, when one was asked for.
    """

    observation: str
    info: dict[str, Any]
    instructions: str
    tools: list[dict[str, Any]]
    frame: Any = None


@dataclass(frozen=True)
class EnvStep:
    """One step's outcome, as ``TextEnv.step`` returns it, and the frame after it."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    frame: Any = None


@dataclass(frozen=True)
class EnvRequest:
    """One call to an env worker, sent in a batch.

    Attributes:
        id: Names the request's answer.
        method: One of :data:`EnvWorker.SERVED`.
        args: Its arguments.
    """

    id: int
    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class EnvAnswer:
    """The outcome of an :class:`EnvRequest`: its result, or the exception it raised."""

    id: int
    ok: bool
    value: Any


def _reset(
    env: TextEnv, seed: int, frame: bool, options: Mapping[str, Any] | None = None
) -> EnvReset:
    tools = list(env.tools)
    if options is None:
        observation, info = env.reset(seed=seed)
    else:
        observation, info = env.reset(seed=seed, options=dict(options))
    picture = env.render() if frame and env.render_mode == "rgb_array" else None
    return EnvReset(observation, info, env.instructions, tools, picture)


def _step(env: TextEnv, text: str, frame: bool) -> EnvStep:
    observation, reward, terminated, truncated, info = env.step(text)
    picture = env.render() if frame and env.render_mode == "rgb_array" else None
    return EnvStep(observation, reward, terminated, truncated, info, picture)


class EnvClient(Protocol):
    """How the rollout loop drives one env, wherever it lives."""

    @property
    def render_mode(self) -> str | None:
        """The env's render mode (None when it renders text only)."""
        ...

    async def reset(
        self, seed: int, *, options: Mapping[str, Any] | None = None, frame: bool = False
    ) -> EnvReset:
        """Start an episode with ``seed`` and the reset ``options`` (None: none);
        ``frame`` also renders an ``rgb_array`` frame."""
        ...

    async def step(self, text: str, *, frame: bool = False) -> EnvStep:
        """Play the model's text."""
        ...

    async def render(self) -> Any:
        """Render the env's current state."""
        ...

    @property
    def backend_env(self) -> Any:
        """What a generation backend's ``env=`` receives: the :class:`TextEnv` for an
        env in this process, this client for an env on a worker (a scripted policy
        then acts where the env lives)."""
        ...


class LocalEnv:
    """An env of this process; its calls run in ``executor`` (the rollout's thread pool),
    or on the event loop itself for an env with ``inline_calls`` (short pure-Python
    work, for which a thread adds only its hand-off).

    Args:
        env: The env.
        executor: Runs ``reset``/``step`` so that a blocking env does not stall the loop.
    """

    def __init__(self, env: TextEnv, executor: Executor) -> None:
        self.env = env
        self.executor = executor
        self.inline = bool(getattr(env, "inline_calls", False))

    @property
    def render_mode(self) -> str | None:
        """The env's render mode."""
        return self.env.render_mode

    @property
    def backend_env(self) -> TextEnv:
        """The env itself."""
        return self.env

    async def _run(self, function: Callable[..., _T], *args: Any) -> _T:
        if self.inline:
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def reset(
        self, seed: int, *, options: Mapping[str, Any] | None = None, frame: bool = False
    ) -> EnvReset:
        """Reset in the thread pool."""
        return await self._run(_reset, self.env, seed, frame, options)

    async def step(self, text: str, *, frame: bool = False) -> EnvStep:
        """Step in the thread pool."""
        return await self._run(_step, self.env, text, frame)

    async def render(self) -> Any:
        """Render here."""
        return self.env.render()


class EnvWorker:
    """Holds envs and plays them (as a Ray actor, or an object behind a local handle).

    Args:
        builds: The envs to make, in order (their index on this worker).
        registrations: Envs registered in the driver's code (not by an entry
            point every process sees), registered here before the envs are made.
        serve_on: The address to listen on for the driver's requests and the key
            it proves (see :mod:`agentgym.rollout.data_plane`); None: no data plane
            (the worker is only called directly).
        switch_interval: The process's interpreter switch interval
            (``sys.setswitchinterval``), for a worker with a process of its own;
            None leaves it alone. See :data:`WORKER_SWITCH_INTERVAL`.
    """

    SERVED = frozenset({"reset", "step", "render", "act"})
    """Methods an :class:`EnvRequest` may name."""

    def __init__(
        self,
        builds: Sequence[EnvBuild],
        registrations: Sequence[registry.EnvSpec] = (),
        serve_on: tuple[str, bytes] | None = None,
        switch_interval: float | None = None,
    ) -> None:
        if switch_interval is not None:
            sys.setswitchinterval(switch_interval)
        for spec in registrations:
            if spec.name not in registry.list_envs():
                registry.register(spec.name, spec.entry_point, id=spec.id, kwargs=spec.kwargs)
        self.envs = [build.make() for build in builds]
        self.incarnation = uuid.uuid4().hex
        self._agents: dict[int, tuple[str, Agent]] = {}
        self._closed = False
        self._pool = ThreadPoolExecutor(max(1, len(self.envs)), thread_name_prefix="env")
        self._server = None if serve_on is None else RequestServer(*serve_on, self._start)

    def data_address(self) -> tuple[str, int]:
        """Where the worker listens for requests (host, port).

        Raises:
            RuntimeError: If the worker was made without ``serve_on``.
        """
        if self._server is None:
            raise RuntimeError("this env worker was made without a data plane (serve_on)")
        return self._server.address

    def serve(self, request: EnvRequest) -> EnvAnswer:
        """Run one request here and now: its result, or the exception it raised."""
        try:
            if request.method not in self.SERVED:
                raise ValueError(f"{request.method!r} is not one of {sorted(self.SERVED)}")
            return EnvAnswer(request.id, True, getattr(self, request.method)(*request.args))
        except Exception as error:
            return EnvAnswer(request.id, False, _portable(error))

    def _start(self, connection: int, requests: Sequence[EnvRequest]) -> None:
        for request in requests:
            self._pool.submit(self._answer, connection, request)

    def _answer(self, connection: int, request: EnvRequest) -> None:
        answer = self.serve(request)
        if self._server is not None:
            self._server.answer(connection, answer)

    def render_modes(self) -> list[str | None]:
        """Each env's render mode."""
        return [env.render_mode for env in self.envs]

    def task_index_flags(self) -> list[bool]:
        """Whether each env asks for the reset option ``task_index`` (:func:`uses_task_index`)."""
        return [uses_task_index(env) for env in self.envs]

    def pid(self) -> int:
        """The worker's process id."""
        return os.getpid()

    def _check(self, incarnation: str) -> None:
        if incarnation != self.incarnation:
            raise EnvLostError(
                f"the env worker (pid {os.getpid()}) restarted since this episode's reset; "
                "its envs were built anew"
            )

    def reset(
        self,
        index: int,
        seed: int,
        frame: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> tuple[str, EnvReset]:
        """Reset env ``index`` with ``seed`` and the reset ``options``; returns this
        worker's incarnation and the start."""
        return self.incarnation, _reset(self.envs[index], seed, frame, options)

    def step(self, index: int, incarnation: str, text: str, frame: bool = False) -> EnvStep:
        """Step env ``index`` with the model's text.

        Raises:
            EnvLostError: If the worker restarted since the episode's reset.
        """
        self._check(incarnation)
        return _step(self.envs[index], text, frame)

    def render(self, index: int) -> Any:
        """Render env ``index``."""
        return self.envs[index].render()

    def act(self, index: int, incarnation: str, agent: str, seed: int, owner: str) -> str:
        """A scripted agent's response to env ``index``'s state.

        Each env keeps one agent per ``owner`` (a scripted backend), made from
        ``agent`` and ``seed`` and reset at each episode's first turn, as the
        backend does for envs in its own process.

        Raises:
            EnvLostError: If the worker restarted since the episode's reset.
        """
        self._check(incarnation)
        env = self.envs[index]
        held = self._agents.get(index)
        if held is None or held[0] != owner:
            held = self._agents[index] = (owner, make_agent(agent, seed))
        if env.num_steps == 0:  # the first turn of an episode
            held[1].reset(env)
        return held[1].act(env)

    def close(self) -> None:
        """Close every env (once)."""
        if not self._closed:
            self._closed = True
            if self._server is not None:
                self._server.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
            for env in self.envs:
                env.close()


def _portable(error: Exception) -> Exception:
    """``error`` with its traceback on the worker as a note, and sure to pickle."""
    where = "".join(traceback.format_exception(error))
    try:
        pickle.dumps(error)
    except Exception:
        error = RuntimeError(f"{type(error).__name__}: {error}")
    error.add_note(f"raised on the env worker (pid {os.getpid()}):\n{where}")
    return error
