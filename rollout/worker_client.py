"""The driver's side of env workers: a channel per worker, a client per env.

A Ray call costs the driver about a millisecond, as much as a whole
in-process env-turn, so the envs of one worker share a
:class:`WorkerChannel` that keeps one :meth:`EnvWorker.exchange
<agentgym.rollout.workers.EnvWorker.exchange>` call in flight: it carries
every request queued since the last one and brings back every answer
finished meanwhile. The worker answers soon after a first request finishes
(:data:`LINGER`), so a slow env holds back no other env; requests that queue
while an exchange waits go to the worker on their own after
:data:`SUBMIT_AFTER` (``submit``), so the worker does not run dry waiting
for the exchange to come back.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

from agentgym.cluster import RpcTimeoutError, WorkerDiedError, WorkerHandle
from agentgym.rollout.workers import EnvAnswer, EnvLostError, EnvRequest, EnvReset, EnvStep

LONG_POLL = 1.0
"""Seconds an exchange waits on the worker for a first answer."""

LINGER = 0.002
"""Seconds an exchange that has an answer waits for more while the worker's other
requests are still running (fewer calls, each about a millisecond of the driver's CPU)."""

SUBMIT_AFTER = 0.001
"""Seconds after which requests queued while an exchange waits are sent on their own
(:meth:`EnvWorker.submit <agentgym.rollout.workers.EnvWorker.submit>`)."""

EXCHANGE_GRACE = 60.0
"""Seconds beyond :data:`LONG_POLL` after which an unanswered exchange means a lost worker."""

RESTART_WAIT = 300.0
"""Seconds an episode's reset waits for its restarting env worker (which rebuilds its envs)."""


class WorkerChannel:
    """Carries the requests of one worker's envs, in batches, one exchange in flight.

    The channel belongs to the event loop that uses it; a new loop (the next
    rollout's ``asyncio.run``) starts a new session and forgets the old one.

    Args:
        handle: The worker's handle.
        wait: Seconds an exchange waits on the worker for a first answer.
        linger: Seconds an exchange with an answer waits for more (see :data:`LINGER`).
        submit_after: Seconds after which queued requests go to the worker on their own.
    """

    def __init__(
        self,
        handle: WorkerHandle,
        *,
        wait: float = LONG_POLL,
        linger: float = LINGER,
        submit_after: float = SUBMIT_AFTER,
    ) -> None:
        self.handle = handle
        self.wait = wait
        self.linger = linger
        self.submit_after = submit_after
        self.exchanges = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count()
        self._session = ""
        self._queue: list[EnvRequest] = []
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._pump: asyncio.Task[None] | None = None
        self._in_flight = False
        self._submit_due = False
        self._background: set[asyncio.Task[Any]] = set()

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._session = loop, uuid.uuid4().hex
            self._queue, self._futures, self._pump = [], {}, None
            self._in_flight = self._submit_due = False
            self._background = set()
        return loop

    async def request(self, method: str, *args: Any) -> Any:
        """Call ``method`` of the worker with ``args`` in the next exchange.

        Raises:
            WorkerDiedError: If the worker died (or is restarting).
            RpcTimeoutError: If an exchange went unanswered.
            Exception: Whatever the method raised on the worker.
        """
        loop = self._bind()
        future: asyncio.Future[Any] = loop.create_future()
        request = EnvRequest(next(self._ids), method, args)
        self._futures[request.id] = future
        self._queue.append(request)
        if self._pump is None:
            self._pump = loop.create_task(self._run())
        elif self._in_flight and not self._submit_due:
            self._submit_due = True
            loop.call_later(self.submit_after, self._submit_queued)
        return await future

    async def _run(self) -> None:
        try:
            while self._futures:
                batch, self._queue = self._queue, []
                self.exchanges += 1
                self._in_flight = True
                try:
                    answers: list[EnvAnswer] = await self.handle.call(
                        "exchange",
                        self._session,
                        batch,
                        self.wait,
                        self.linger,
                        timeout=self.wait + self.linger + EXCHANGE_GRACE,
                    )
                except Exception as error:  # the worker is gone: so are its requests
                    for future in self._futures.values():
                        if not future.done():
                            future.set_exception(error)
                    self._futures.clear()
                    self._queue = []
                    return
                finally:
                    self._in_flight = False
                for answer in answers:
                    if answer.id not in self._futures:
                        continue
                    future = self._futures.pop(answer.id)
                    if future.done():  # cancelled by its episode
                        continue
                    if answer.ok:
                        future.set_result(answer.value)
                    else:
                        future.set_exception(answer.value)
                for key in [k for k, f in self._futures.items() if f.cancelled()]:
                    del self._futures[key]  # their answers are dropped when they come
        finally:
            self._pump = None

    def _submit_queued(self) -> None:
        self._submit_due = False
        if self._in_flight and self._queue and self._loop:  # else the next exchange takes them
            batch, self._queue = self._queue, []
            task = self._loop.create_task(self._submit(batch))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _submit(self, batch: list[EnvRequest]) -> None:
        try:
            await self.handle.call("submit", self._session, batch)
        except Exception as error:  # the worker never got them
            for request in batch:
                future = self._futures.pop(request.id, None)
                if future is not None and not future.done():
                    future.set_exception(error)


class WorkerEnv:
    """Env ``index`` of an :class:`~agentgym.rollout.workers.EnvWorker`, through its channel.

    Args:
        channel: The worker's channel.
        index: The env's index on the worker.
        render_mode: The env's render mode.
        restart_wait: Seconds a reset waits for a restarting worker to come back.
    """

    def __init__(
        self,
        channel: WorkerChannel,
        index: int,
        render_mode: str | None,
        *,
        restart_wait: float = RESTART_WAIT,
    ) -> None:
        self.channel = channel
        self.index = index
        self.render_mode = render_mode
        self.restart_wait = restart_wait
        self._incarnation = ""

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

    async def reset(self, seed: int, *, frame: bool = False) -> EnvReset:
        """Reset on the worker, waiting for it while it restarts (nothing is lost yet).

        Raises:
            EnvLostError: If the worker is not back within ``restart_wait`` seconds.
        """
        deadline = time.monotonic() + self.restart_wait
        pause = 0.05
        while True:
            try:
                self._incarnation, start = await self.channel.request(
                    "reset", self.index, seed, frame
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
