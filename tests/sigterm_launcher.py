"""Test-only launcher: ``python -m tests.sigterm_launcher <phase> [--hang-engine-close]
[key=value ...]`` runs ``agentgym.train`` and sends itself SIGTERM while ``<phase>``
runs (tests/test_sigterm.py).

Each phase has an entry (the recipe's function that starts it) and a hold (a call
made inside it). When the entry is called for the ``occurrence``-th time, a timer
thread sends SIGTERM after :data:`SIGNAL_DELAY` s, and the hold waits meanwhile:
the signal lands inside the phase however fast the tiny model makes the phase.
An async hold waits in the event loop (``asyncio.sleep``), where the signal finds
a run in the middle of a rollout or a weight sync. Nothing is added to the
library for this: the launcher replaces module attributes before the run starts.

``--hang-engine-close`` makes the generation backend's ``close`` block for an hour
without yielding, as an engine whose shutdown hangs: the run must still end.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIGNAL_DELAY = 0.3
"""Seconds from the phase's start to the signal."""

HOLD_LIMIT = 60.0
"""The most a hold waits: a signal that never comes lets the phase go on (and the test fails)."""


@dataclass(frozen=True)
class Phase:
    """Where a phase starts (``entry``) and a call inside it that waits for the signal
    (``hold``), each as (owner, attribute name)."""

    entry: tuple[Any, str]
    hold: tuple[Any, str]
    occurrence: int = 1


def phases() -> dict[str, Phase]:
    """The phases a test can stop a run in, by the name the run's last line gives them."""
    from agentgym.builders import engines, strategies
    from agentgym.rollout.backends.hf import HFBackend
    from agentgym.trainers import grpo, run_state, updates
    from agentgym.trainers.ranks import StrategySpec

    return {
        "model build": Phase((strategies, "policy_strategy"), (StrategySpec, "build")),
        "engine start": Phase((engines, "generation_backend"), (engines, "make_backend")),
        "validation": Phase((grpo, "evaluate_step"), (HFBackend, "generate")),
        "policy update": Phase((grpo, "update_policy"), (updates, "minibatches")),
        # the second: checkpoint-1 is complete, so the line names it
        "checkpoint": Phase((grpo, "checkpoint"), (run_state, "save_checkpoint"), occurrence=2),
        "weight sync": Phase((grpo, "push_weights"), (HFBackend, "update_weights")),
    }


def _held(real: Callable[..., Any], active: threading.Event) -> Callable[..., Any]:
    """``real``, waiting first (up to :data:`HOLD_LIMIT` s) while ``active`` is set."""
    if inspect.iscoroutinefunction(real):

        @functools.wraps(real)
        async def holding_async(*args: Any, **kwargs: Any) -> Any:
            deadline = time.monotonic() + HOLD_LIMIT
            while active.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return await real(*args, **kwargs)

        return holding_async

    @functools.wraps(real)
    def holding(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + HOLD_LIMIT
        while active.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        return real(*args, **kwargs)

    return holding


def arm(phase: Phase) -> None:
    """Patch ``phase``'s entry to start the signal's timer and its hold to wait for it."""
    owner, name = phase.entry
    entry = getattr(owner, name)
    active = threading.Event()
    calls = 0

    @functools.wraps(entry)
    def entered(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == phase.occurrence:
            active.set()
            timer = threading.Timer(SIGNAL_DELAY, send_sigterm)
            timer.daemon = True
            timer.start()
        return entry(*args, **kwargs)

    setattr(owner, name, entered)
    hold_owner, hold_name = phase.hold
    setattr(hold_owner, hold_name, _held(getattr(hold_owner, hold_name), active))


def send_sigterm() -> None:
    """SIGTERM to this process, its wall time first written to ``$SIGTERM_LAUNCHER_MARK``
    (the test's clock for "within so many seconds of the signal")."""
    mark = os.environ.get("SIGTERM_LAUNCHER_MARK")
    if mark:
        written = Path(f"{mark}.tmp")
        written.write_text(repr(time.time()))
        written.replace(mark)  # whole, never read half-written
    os.kill(os.getpid(), signal.SIGTERM)


def hang_engine_close() -> None:
    """Make the HF backend's close block its thread for an hour (an engine that hangs)."""
    from agentgym.rollout.backends.hf import HFBackend

    async def close(self: Any) -> None:
        time.sleep(3600)

    HFBackend.close = close  # type: ignore[method-assign]


def main() -> None:
    """Arm the phase named by the first argument, then run ``agentgym.train`` with the rest."""
    phase, *arguments = sys.argv[1:]
    if "--hang-engine-close" in arguments:
        arguments.remove("--hang-engine-close")
        hang_engine_close()
    arm(phases()[phase])
    sys.argv[1:] = arguments  # the run's resume line repeats these
    from agentgym.train import main as train_main

    train_main()


if __name__ == "__main__":
    main()
