"""The driver's side of env workers: a channel per worker, a client per env.

The envs of one worker share a :class:`WorkerChannel`: a connection to the
worker's data plane (:mod:`agentgym.rollout.data_plane`), opened on first
use in each event loop. Requests made in one turn of the loop go in one
message; a reader task hands each answer to the request that waits for it.
Ray is used to find the worker (``data_address``) and, when its process
dies, to restart it; the requests themselves never go through Ray, whose
calls cost the driver about a millisecond each.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from agentgym.cluster import RpcTimeoutError, WorkerDiedError, WorkerHandle
from agentgym.rollout.data_plane import connect, read_frame, write_frame
from agentgym.rollout.workers import EnvAnswer, EnvLostError, EnvRequest, EnvReset, EnvStep

HEARTBEAT = 1.0
"""Seconds without a message, while requests wait, after which the channel asks the
worker whether it is alive (an empty message, answered at once)."""

SILENCE_LIMIT = 60.0
"""Seconds beyond :data:`HEARTBEAT` of silence after which a worker counts as lost."""

RESTART_WAIT = 300.0
"""Seconds an episode's reset waits for its restarting env worker (which rebuilds its envs)."""


class WorkerChannel:
    """Carries the requests of one worker's envs over its data-plane connection.

    The channel belongs to the event loop that uses it; a new loop (the next
    rollout's ``asyncio.run``) opens a new connection, which makes the worker
    drop what the old one left.

    Args:
        handle: The worker's handle (Ray finds the worker's address through it).
        key: The key the worker was given (``serve_on``).
        heartbeat: See :data:`HEARTBEAT`.
        silence_limit: See :data:`SILENCE_LIMIT`.
    """

    def __init__(
        self,
        handle: WorkerHandle,
        key: bytes,
        *,
        heartbeat: float = HEARTBEAT,
        silence_limit: float = SILENCE_LIMIT,
    ) -> None:
        self.handle = handle
        self.key = key
        self.heartbeat = heartbeat
        self.silence_limit = silence_limit
        self.messages = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        self._queue: list[EnvRequest] = []
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._writer: Any = None
        self._flush_due = False

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._queue, self._futures = loop, [], {}
            self._reader, self._writer, self._flush_due = None, None, False
        return loop

    async def request(self, method: str, *args: Any) -> Any:
        """Call ``method`` of the worker with ``args`` (sent with this turn's other requests).

        Raises:
            WorkerDiedError: If the worker died (or is restarting).
            RpcTimeoutError: If the worker went silent.
            Exception: Whatever the method raised on the worker.
        """
        loop = self._bind()
        future: asyncio.Future[Any] = loop.create_future()
        request = EnvRequest(next(self._ids), method, args)
        self._futures[request.id] = future
        self._queue.append(request)
        if self._reader is None:
            self._reader = loop.create_task(self._serve())
        elif self._writer is not None and not self._flush_due:
            self._flush_due = True
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._flush_due = False
        if self._queue and self._writer is not None:
            self.messages += 1
            write_frame(self._writer, self._queue)
            self._queue = []

    async def _serve(self) -> None:
        """Connect, send what queued meanwhile, then read answers until the loop ends
        or the connection fails (which fails every request waiting on it)."""
        writer = None
        try:
            host, port = await self.handle.call("data_address")
            reader, writer = await connect(host, port, self.key)
            self._writer = writer
            self._flush()
            silent = 0.0
            while True:
                try:
                    answers: list[EnvAnswer] = await read_frame(reader, self.heartbeat)
                except TimeoutError:
                    for key in [k for k, f in self._futures.items() if f.cancelled()]:
                        del self._futures[key]  # their answers are dropped when they come
                    if not self._futures:  # nothing is waiting: no need to hear from it
                        silent = 0.0
                        continue
                    silent += self.heartbeat
                    if silent > self.silence_limit:
                        raise RpcTimeoutError(
                            f"{self.handle.name}: no answer in {silent:.0f} s "
                            f"({len(self._futures)} requests waiting)"
                        ) from None
                    write_frame(writer, [])
                    continue
                silent = 0.0
                for answer in answers:
                    future = self._futures.pop(answer.id, None)
                    if future is None or future.done():  # cancelled by its episode
                        continue
                    if answer.ok:
                        future.set_result(answer.value)
                    else:
                        future.set_exception(answer.value)
        except Exception as error:  # the worker is gone: so are its requests
            lost = (OSError, EOFError, asyncio.IncompleteReadError)
            if isinstance(error, lost) and not isinstance(error, RpcTimeoutError):
                error = WorkerDiedError(f"{self.handle.name}: its connection failed ({error!r})")
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(error)
            self._futures, self._queue = {}, []
        finally:
            if writer is not None:
                writer.close()
            self._reader = self._writer = None


@dataclass(eq=False)
class WorkerEnv:
    """Env ``index`` of an :class:`~agentgym.rollout.workers.EnvWorker`, through its channel.

    Attributes:
        channel: The worker's channel.
        index: The env's index on the worker.
        render_mode: The env's render mode.
        restart_wait: Seconds a reset waits for a restarting worker to come back.
    """

    channel: WorkerChannel
    index: int
    render_mode: str | None
    _: KW_ONLY
    restart_wait: float = RESTART_WAIT
    _incarnation: str = field(default="", init=False, repr=False)

    @property
    def handle(self) -> WorkerHandle:
        """The worker's handle."""
        return self.channel.handle

    @property
    def backend_env(self) -> WorkerEnv:
        """This client: a scripted policy calls :meth:`act`."""
        return self

    def _lost(self, error: Exception) -> EnvLostError:
        return EnvLostError(f"env {self.index} of {self.handle.name}: {error}")

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await self.channel.request(method, self.index, *args)
        except (WorkerDiedError, RpcTimeoutError) as error:
            raise self._lost(error) from error

    async def reset(
        self, seed: int, *, options: Mapping[str, Any] | None = None, frame: bool = False
    ) -> EnvReset:
        """Reset on the worker with ``seed`` and the reset ``options``, waiting for it
        while it restarts (nothing is lost yet).

        Raises:
            EnvLostError: If the worker is not back within ``restart_wait`` seconds.
        """
        deadline = time.monotonic() + self.restart_wait
        pause = 0.05
        while True:
            try:
                self._incarnation, start = await self.channel.request(
                    "reset", self.index, seed, frame, options
                )
                return start
            except WorkerDiedError as error:  # Ray refuses calls while the actor restarts
                if time.monotonic() + pause > deadline:
                    raise self._lost(error) from error
            except RpcTimeoutError as error:
                raise self._lost(error) from error
            await asyncio.sleep(pause)
            pause = min(2 * pause, 1.0)

    async def step(self, text: str, *, frame: bool = False) -> EnvStep:
        """Step on the worker.

        Raises:
            EnvLostError: If the worker died or restarted during the episode.
        """
        return await self._call("step", self._incarnation, text, frame)

    async def render(self) -> Any:
        """Render on the worker."""
        return await self._call("render")

    async def act(self, agent: str, seed: int, owner: str) -> str:
        """A scripted agent's response, computed on the worker (see ``EnvWorker.act``)."""
        return await self._call("act", self._incarnation, agent, seed, owner)
