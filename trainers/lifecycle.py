"""The run's lifecycle: the phase it is in, and closing its parts at the end.

:func:`phase_of` names the phase from a stack (an interrupt's traceback, or the
main thread's frames when a watchdog looks at a run that does not end), by the
recipe's functions on it: no marker calls in the recipe, and one table of names.

:func:`shut_down` closes every part of a run (env managers, backend, event loop,
tracker, cluster), each attempted whatever happened to the others, each bounded
by ``timeout``, and every failure logged under its part's name and raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentgym.rollout.source import RolloutSource
    from agentgym.trainers.grpo import TrainParts

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT = 60.0
"""Seconds each part's close may take before shutdown leaves it behind (named in the log)."""

CANCEL_GRACE = 5.0
"""Seconds more that a close on the event loop's thread gets once its own timeout has
cancelled what it awaited; a close still running then blocks the loop's thread."""

PHASES: dict[tuple[str, str], str] = {
    ("agentgym.builders.train", "build_train"): "setup",
    ("agentgym.builders.strategies", "policy_strategy"): "model build",
    ("agentgym.builders.strategies", "critic_strategy"): "critic build",
    ("agentgym.builders.engines", "generation_backend"): "engine start",
    ("agentgym.builders.rollouts", "env_manager"): "env start",
    ("agentgym.trainers.grpo", "train"): "training",
    ("agentgym.trainers.run_state", "restore"): "checkpoint load",
    ("agentgym.rollout.source", "next_batch"): "rollout",
    ("agentgym.trainers.batch_prep", "prepare_batch"): "advantages",
    ("agentgym.trainers.updates", "update_policy"): "policy update",
    ("agentgym.trainers.updates", "update_critic"): "critic update",
    ("agentgym.trainers.grpo", "send_resumed_weights"): "weight sync",
    ("agentgym.trainers.grpo", "push_weights"): "weight sync",
    ("agentgym.trainers.grpo", "evaluate_step"): "validation",
    ("agentgym.trainers.run_state", "checkpoint"): "checkpoint",
    ("agentgym.trainers.lifecycle", "shut_down"): "shutdown",
}
"""Phase names by (module, function): the innermost of these on a stack names the phase."""


def frames_of(traceback: TracebackType | None) -> list[FrameType]:
    """The frames of ``traceback``, outermost first."""
    frames = []
    while traceback is not None:
        frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    return frames


def stack_of(frame: FrameType | None) -> list[FrameType]:
    """``frame`` and its callers, outermost first."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def _key(frame: FrameType) -> tuple[str, str]:
    module = str(frame.f_globals.get("__name__", ""))
    name = frame.f_code.co_name
    if name == "run_work" and callable(work := frame.f_locals.get("work")):
        # the source runs the trainer's work, in a thread when episodes generate meanwhile
        return str(getattr(work, "__module__", module)), str(getattr(work, "__name__", name))
    return module, name


def phase_of(frames: Iterable[FrameType]) -> str | None:
    """The phase of the innermost of ``frames`` (outermost first) that :data:`PHASES`
    names, or None when none is the recipe's."""
    found = None
    for frame in frames:
        found = PHASES.get(_key(frame), found)
    return found


def step_of(frames: Iterable[FrameType]) -> int | None:
    """The step of the recipe's loop on the stack (``train``'s ``step``), or None
    before :func:`~agentgym.trainers.grpo.train` started."""
    step = None
    for frame in frames:
        if _key(frame) == ("agentgym.trainers.grpo", "train") and isinstance(
            frame.f_locals.get("step"), int
        ):
            step = frame.f_locals["step"]
    return step


class ShutdownError(RuntimeError):
    """Parts that did not close; ``failures`` holds (part, error) in the order tried.

    Each one was logged with its traceback when it happened; the first is the
    ``__cause__``.
    """

    def __init__(self, failures: list[tuple[str, BaseException]]) -> None:
        listed = "; ".join(f"{part}: {type(error).__name__}: {error}" for part, error in failures)
        super().__init__(f"{len(failures)} part(s) did not close ({listed}); see the log")
        self.failures = failures


class _Closer:
    """Runs close steps one after the other, each in a daemon thread waited for at most
    ``timeout`` s (a close that hangs is left behind), and keeps every failure and
    the first interrupt (Ctrl-C, SIGTERM) that came meanwhile.

    A close on the event loop is also bounded inside it (``asyncio.wait_for``): an
    await that never completes is cancelled and frees the loop for the next close;
    only a close that blocks the loop's thread keeps it (``loop_held_by``).
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.failures: list[tuple[str, BaseException]] = []
        self.interrupt: KeyboardInterrupt | None = None
        self.loop_held_by: str | None = None

    def run(self, part: str, close: Callable[[], object], *, main_thread: bool = False) -> None:
        """Close ``part`` with ``close()``; with ``main_thread``, in this thread and not
        bounded (trackers such as SwanLab and W&B reset signal handlers as they finish,
        which only the main thread may do)."""
        if main_thread:
            try:
                close()
            except KeyboardInterrupt as interrupt:
                self.interrupt = self.interrupt or interrupt
            except Exception as error:
                self._fail(part, error)
            return
        if not self._in_thread(part, close, self.timeout):
            self._fail(part, TimeoutError(f"closing {part} took longer than {self.timeout} s"))

    def run_on_loop(
        self,
        part: str,
        loop: asyncio.AbstractEventLoop,
        close: Callable[[], Coroutine[Any, Any, object]],
    ) -> None:
        """Close ``part`` by running ``close()`` on ``loop`` (``close`` itself is called
        before the loop runs: what it does first sees the loop at rest)."""
        if self.loop_held_by is not None:
            self._fail(part, RuntimeError(f"not closed: {self.loop_held_by} holds the event loop"))
            return

        async def bounded(closing: Coroutine[Any, Any, object]) -> None:
            try:
                await asyncio.wait_for(closing, self.timeout)
            except TimeoutError:  # not the builtin on Python 3.10
                raise TimeoutError(f"closing {part} took longer than {self.timeout} s") from None

        def step() -> None:
            with contextlib.suppress(KeyboardInterrupt):  # a task Ctrl-C interrupted, again
                loop.run_until_complete(bounded(close()))

        if not self._in_thread(part, step, self.timeout + CANCEL_GRACE):
            self.loop_held_by = part
            self._fail(part, TimeoutError(f"closing {part} blocked the event loop's thread"))

    def _in_thread(self, part: str, close: Callable[[], object], limit: float) -> bool:
        """Run ``close`` in a thread for up to ``limit`` s; False when it is still running
        (a failure of its own is recorded)."""
        done = threading.Event()
        raised: list[BaseException] = []

        def target() -> None:
            try:
                close()
            except BaseException as error:  # handed over to the waiting thread
                raised.append(error)
            finally:
                done.set()

        threading.Thread(target=target, name=f"close {part}", daemon=True).start()
        deadline = time.monotonic() + limit
        while not done.is_set() and (left := deadline - time.monotonic()) > 0:
            try:
                done.wait(left)
            except KeyboardInterrupt as interrupt:  # stopping is what this does already
                self.interrupt = self.interrupt or interrupt
        if raised:
            self._fail(part, raised[0])
        return done.is_set()

    def _fail(self, part: str, error: BaseException) -> None:
        logger.error("shutdown: %s: %s: %s", part, type(error).__name__, error, exc_info=error)
        self.failures.append((part, error))


def shut_down(
    parts: TrainParts,
    loop: asyncio.AbstractEventLoop,
    source: RolloutSource | None = None,
    *,
    unwinding: bool = False,
    timeout: float = CLOSE_TIMEOUT,
) -> None:
    """Close the env managers, the backend (its engine process too), the event loop and
    the tracker, and stop the cluster's workers: each one whatever became of the
    others, each within ``timeout`` s.

    Episodes still running (a Ctrl-C mid-rollout, async generation ahead of the
    last step) are cancelled first, so that closing the backend does not resume them.

    Args:
        parts: The run's parts.
        loop: The recipe's event loop (closed here).
        source: The rollout source (its episodes in flight are cancelled first).
        unwinding: An exception is on its way out already: failures are logged
            but not raised, so that they do not replace it.
        timeout: Seconds each close may take; a close that takes longer is left
            running in its thread and counts as failed.

    Raises:
        ShutdownError: When a part did not close (not when ``unwinding``).
        KeyboardInterrupt: When Ctrl-C or SIGTERM came during shutdown (after
            every part was tried).
    """
    closer = _Closer(timeout)
    if source is not None:
        closer.run_on_loop("rollout source", loop, source.close)
    closer.run_on_loop("pending episodes", loop, lambda: _cancel_pending(loop))
    rollouts = [rollout for rollout in (parts.train, parts.val) if rollout is not None]
    if parts.train is not None:
        closer.run("train envs", parts.train.manager.close)
    if parts.val is not None:
        closer.run("validation envs", parts.val.manager.close)
    for backend in {id(r.backend): r.backend for r in rollouts}.values():  # shared: once
        closer.run_on_loop("generation backend", loop, backend.close)
    if closer.loop_held_by is None:
        closer.run("event loop", loop.close)
    else:  # a running loop cannot be closed; the failure of the close that holds it says so
        logger.error("shutdown: event loop: not closed, %s holds it", closer.loop_held_by)
    closer.run("tracker", parts.tracker.close, main_thread=True)
    if parts.cluster is not None:  # every worker it started (trainer ranks, engines, envs)
        closer.run("cluster", parts.cluster.shutdown)
    if closer.interrupt is not None:
        raise closer.interrupt
    if closer.failures and not unwinding:
        raise ShutdownError(closer.failures) from closer.failures[0][1]


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> Coroutine[Any, Any, None]:
    """Cancel the loop's tasks (episodes, generation); returns what waits for them."""
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    return _settle(pending)


async def _settle(tasks: set[asyncio.Task[Any]]) -> None:
    # gathered inside a coroutine: the loop need not be this thread's current loop
    await asyncio.gather(*tasks, return_exceptions=True)
