"""The run's lifecycle: shutdown tries every part whatever the others did, within a
time limit each, and reports every failure by the part's name; the phase of a stack
is the recipe's innermost function on it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agentgym.trainers import lifecycle
from agentgym.trainers.grpo import TrainParts, evaluate_step
from agentgym.trainers.lifecycle import ShutdownError, frames_of, phase_of, shut_down


class Part:
    """A part whose close is written down in ``closed``, then raises ``error`` or never
    returns (``hang``)."""

    def __init__(self, closed: list[str], name: str) -> None:
        self.closed, self.name = closed, name
        self.error: BaseException | None = None
        self.hang = False

    def close(self) -> None:
        self.closed.append(self.name)
        if self.hang:
            threading.Event().wait()
        if self.error is not None:
            raise self.error

    shutdown = close  # the cluster's close


class AsyncPart(Part):
    """A part closed on the event loop; ``hang``: it awaits what never comes."""

    async def close(self) -> None:  # type: ignore[override]
        self.closed.append(self.name)
        if self.hang:
            await asyncio.get_running_loop().create_future()
        if self.error is not None:
            raise self.error


def make_parts(closed: list[str]) -> SimpleNamespace:
    backend = AsyncPart(closed, "generation backend")  # one, shared: closed once
    return SimpleNamespace(
        train=SimpleNamespace(manager=Part(closed, "train envs"), backend=backend),
        val=SimpleNamespace(manager=Part(closed, "validation envs"), backend=backend),
        tracker=Part(closed, "tracker"),
        cluster=Part(closed, "cluster"),
    )


EVERY_PART = ["train envs", "validation envs", "generation backend", "tracker", "cluster"]


def test_a_close_that_fails_does_not_keep_the_others_open_and_is_raised_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed: list[str] = []
    parts = make_parts(closed)
    parts.train.manager.error = OSError("env worker gone")
    parts.tracker.error = ValueError("metrics file closed")
    loop = asyncio.new_event_loop()
    with pytest.raises(ShutdownError) as raised:
        shut_down(cast(TrainParts, parts), loop)
    assert closed == EVERY_PART
    assert loop.is_closed()
    assert str(raised.value) == (
        "2 part(s) did not close (train envs: OSError: env worker gone; tracker: ValueError: "
        "metrics file closed); see the log"
    )
    assert raised.value.__cause__ is parts.train.manager.error
    assert [part for part, _ in raised.value.failures] == ["train envs", "tracker"]
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert logged == [
        "shutdown: train envs: OSError: env worker gone",
        "shutdown: tracker: ValueError: metrics file closed",
    ]


def test_while_another_error_unwinds_failures_are_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the async rollout's close failed silently before (contextlib.suppress(BaseException))
    closed: list[str] = []
    parts = make_parts(closed)
    source = AsyncPart(closed, "rollout source")
    source.error = RuntimeError("episode queue broken")
    loop = asyncio.new_event_loop()
    shut_down(cast(TrainParts, parts), loop, cast(Any, source), unwinding=True)
    assert closed == ["rollout source", *EVERY_PART]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "shutdown: rollout source: RuntimeError: episode queue broken"
    ]


def test_a_close_that_hangs_is_left_behind_after_its_time_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the backend awaits forever (its await is cancelled: the loop can still be closed);
    # the validation envs block their thread (left behind)
    closed: list[str] = []
    parts = make_parts(closed)
    parts.train.backend.hang = True
    parts.val.manager.hang = True
    loop = asyncio.new_event_loop()
    started = time.monotonic()
    with pytest.raises(ShutdownError) as raised:
        shut_down(cast(TrainParts, parts), loop, timeout=0.2)
    assert time.monotonic() - started < 30  # not forever: each close waited 0.2 s
    assert closed == EVERY_PART
    assert loop.is_closed()
    assert [(part, str(error)) for part, error in raised.value.failures] == [
        ("validation envs", "closing validation envs took longer than 0.2 s"),
        ("generation backend", "closing generation backend took longer than 0.2 s"),
    ]
    assert all(isinstance(error, TimeoutError) for _, error in raised.value.failures)


def test_a_close_that_blocks_the_loops_thread_keeps_the_loop_and_the_others_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lifecycle, "CANCEL_GRACE", 0.2)
    closed: list[str] = []
    parts = make_parts(closed)

    async def blocking_close() -> None:
        closed.append("generation backend")
        threading.Event().wait()  # an engine shutdown that never returns, on the loop

    parts.train.backend.close = blocking_close
    loop = asyncio.new_event_loop()
    with pytest.raises(ShutdownError) as raised:
        shut_down(cast(TrainParts, parts), loop, timeout=0.2)
    assert closed == EVERY_PART
    assert [(part, str(error)) for part, error in raised.value.failures] == [
        ("generation backend", "closing generation backend blocked the event loop's thread")
    ]
    assert loop.is_running() and not loop.is_closed()  # held by the thread left behind


def test_the_phase_is_the_recipes_innermost_function_on_the_stack(tmp_path: Path) -> None:
    def interrupt(mode: bool) -> None:
        raise KeyboardInterrupt

    parts = SimpleNamespace(
        strategy=SimpleNamespace(set_training=interrupt), val=object(), source=None
    )
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(KeyboardInterrupt) as raised:
            evaluate_step(cast(Any, None), cast(TrainParts, parts), loop, step=3)
    finally:
        loop.close()
    assert phase_of(frames_of(raised.value.__traceback__)) == "validation"
    assert phase_of(frames_of(None)) is None
