"""Handles: how the driver calls a worker, wherever the worker lives.

A :class:`WorkerHandle` calls a method of a worker object by name and awaits
its result. :class:`LocalHandle` holds the object in this process (the local
mode, and debugging); the Ray handle (:mod:`agentgym.cluster.ray_cluster`)
holds an actor. Code that drives workers never knows which one it has.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, runtime_checkable


class WorkerError(RuntimeError):
    """A call to a worker failed; the message names the worker and the method."""


class WorkerDiedError(WorkerError):
    """The worker's process died (killed, out of memory, crashed) during or before the call."""


class RpcTimeoutError(WorkerError, TimeoutError):
    """A call did not answer within ``rpc_timeout``."""


@runtime_checkable
class WorkerHandle(Protocol):
    """Calls methods of one worker (an object in this process or a Ray actor).

    Attributes:
        name: The worker's name in messages, e.g. ``actor_train[1]`` or ``env_worker[3]``.
        node: The node (rank) it runs on.
    """

    name: str
    node: int

    async def call(
        self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Call ``method`` on the worker and return its result.

        Raises:
            RpcTimeoutError: After ``timeout`` seconds (the handle's default when None).
            WorkerDiedError: If the worker's process died.
            Exception: The method's own exception, re-raised with its type.
        """
        ...

    def call_sync(
        self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """:meth:`call` from synchronous code (not from inside a running event loop)."""
        ...

    def kill(self) -> None:
        """Stop the worker now (its process, for an actor)."""
        ...


class LocalHandle:
    """A worker object in this process, called through a thread pool.

    Methods run in threads (``concurrency`` at once) so that a blocking call
    (an env step) does not stall the event loop; coroutine methods are awaited
    on the caller's loop.

    Args:
        worker: The worker object.
        name: Its name in messages.
        rpc_timeout: Default seconds a call may take (None: no limit).
        concurrency: Calls that may run at once.
    """

    def __init__(
        self,
        worker: Any,
        *,
        name: str,
        rpc_timeout: float | None = None,
        concurrency: int = 1,
    ) -> None:
        self.worker = worker
        self.name = name
        self.node = 0
        self.rpc_timeout = rpc_timeout
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=name)

    async def call(
        self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Run ``method`` (in a thread, or on this loop for a coroutine method)."""
        function = getattr(self.worker, method)
        limit = timeout if timeout is not None else self.rpc_timeout
        if asyncio.iscoroutinefunction(function):
            work = function(*args, **kwargs)
        else:
            loop = asyncio.get_running_loop()
            work = loop.run_in_executor(self._pool, functools.partial(function, *args, **kwargs))
        try:
            return await asyncio.wait_for(work, limit)
        except TimeoutError as error:
            raise RpcTimeoutError(
                f"{self.name}.{method} did not answer within rpc_timeout={limit} s"
            ) from error

    def call_sync(
        self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Run ``method`` now, in this thread (a coroutine method on a fresh loop)."""
        function = getattr(self.worker, method)
        if asyncio.iscoroutinefunction(function):
            return asyncio.run(self.call(method, *args, timeout=timeout, **kwargs))
        return function(*args, **kwargs)

    def kill(self) -> None:
        """Close the worker (its ``close`` method, if any) and the thread pool."""
        close = getattr(self.worker, "close", None)
        if callable(close) and not asyncio.iscoroutinefunction(close):
            with contextlib.suppress(Exception):
                close()
        self._pool.shutdown(wait=False, cancel_futures=True)


async def call_all(
    handles: Sequence[WorkerHandle],
    method: str,
    *args: Any,
    timeout: float | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Call ``method`` with the same arguments on every handle; results in handle order."""
    return list(
        await asyncio.gather(*(h.call(method, *args, timeout=timeout, **kwargs) for h in handles))
    )
