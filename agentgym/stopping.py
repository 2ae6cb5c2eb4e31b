"""Stopping a run from outside: SIGTERM (how schedulers stop a job) and Ctrl-C.

Slurm, Kubernetes and Ray stop a job with SIGTERM, then SIGKILL it after a grace
period (30 s by default: Slurm's ``KillWait``, Kubernetes'
``terminationGracePeriodSeconds``). After :func:`install`:

- the first SIGTERM or Ctrl-C raises :class:`Interrupted`, a ``KeyboardInterrupt``:
  the recipe unwinds as it does for Ctrl-C, closing its parts, and the entry point
  prints one line (:func:`report`): the step and phase the run stopped in, the
  last checkpoint, and the command that goes on from there;
- the same signal arms a watchdog: if the process still runs :data:`GRACE_SECONDS`
  later (a close that hangs, a thread that never ends), the watchdog prints that
  line (unless it was printed), writes where the main thread was to ``train.log``,
  stops Ray, kills the processes the run started (engines, env sandboxes, a local
  Ray) and exits;
- a second signal does the same at once.

A closed stdout or stderr (``| head``, a log viewer that went away) does not stop
the run (:func:`guard_console`): from the first broken pipe on, that descriptor
writes to /dev/null, and the console's lines still go to the run's ``train.log``. A
run is stopped with a signal; a reader that left is no reason to throw away the
steps since the last checkpoint.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from agentgym.trainers.checkpoint import latest_checkpoint
from agentgym.trainers.lifecycle import frames_of, phase_of, stack_of, step_of

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer as Buffer

GRACE_SECONDS = 20.0
"""Seconds from the first signal to the watchdog's exit: inside the 30 s that Slurm and
Kubernetes give before SIGKILL, so that the line is printed and the children killed."""

RAY_SHUTDOWN_SECONDS = 3.0
"""The most the watchdog waits for ``ray.shutdown`` before killing Ray's processes."""

SIGNAL_NAMES: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
"""How the stop line names a signal."""


class Interrupted(KeyboardInterrupt):
    """The first SIGTERM or Ctrl-C (``signum``): the run unwinds as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass(frozen=True)
class Run:
    """What the stop line says about a run.

    Args:
        output_dir: The run's ``output_dir`` as configured.
        arguments: The command line's ``key=value`` arguments.
        start_step: The step the run resumed from (0 for a fresh run).
        console_log: The file that keeps the console's lines (the run's ``train.log``),
            where the stop line goes too; None: none.
    """

    output_dir: str
    arguments: tuple[str, ...]
    start_step: int = 0
    console_log: Path | None = None


class _State:
    """This process's stop: the first signal, the run, and the stop line's one print."""

    signum: int | None = None
    landed: tuple[int | None, str | None] = (None, None)  # the step and phase it came in
    run: Run | None = None
    line_taken = threading.Lock()  # taken, never waited for, by whoever prints the line


def install() -> None:
    """Handle SIGTERM, and Ctrl-C unless it is ignored (a job started in the background),
    as the module says; make stdout and stderr proof against a closed pipe."""
    signal.signal(signal.SIGTERM, _on_signal)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_signal)
    sys.stdout = guard_console(sys.stdout)
    sys.stderr = guard_console(sys.stderr)


def describe(run: Run) -> None:
    """Tell the stop line (and the watchdog) which run this process is."""
    _State.run = run


def exit_code() -> int:
    """128 + the signal that stopped the run: 143 for SIGTERM, 130 for Ctrl-C."""
    return 128 + (_State.signum or signal.SIGINT)


def stop_line(step: int, phase: str, checkpoint: Path | None, run: Run) -> str:
    """The line a stopped run prints, e.g. ``interrupted at step 3 (weight sync) by
    SIGTERM; last checkpoint: <dir>; resume with: python -m agentgym.train <arguments>
    output_dir=<dir> resume_from_checkpoint=true``; with no checkpoint yet, the command
    that starts the run again instead."""
    signum = _State.signum or signal.SIGINT
    by = SIGNAL_NAMES.get(signum, f"signal {signum}")
    kept = [a for a in run.arguments if not a.startswith(("output_dir=", "resume_from_"))]
    command = " ".join(["python -m agentgym.train", *kept, f"output_dir={run.output_dir}"])
    if checkpoint is None:
        then = f"no checkpoint yet; start again with: {command}"
    else:
        then = f"last checkpoint: {checkpoint}; resume with: {command} resume_from_checkpoint=true"
    return f"interrupted at step {step} ({phase}) by {by}; {then}"


def report(interrupt: KeyboardInterrupt) -> int:
    """Print the stop line of ``interrupt`` (to stderr and ``train.log``), unless it was
    printed; return the exit code.

    The step and phase are the interrupt's when it carries them
    (:class:`~agentgym.trainers.grpo.TrainingInterruptedError`), else read off its
    traceback (a stop while the parts were built, or in the final shutdown).
    """
    frames = frames_of(interrupt.__traceback__)
    step = getattr(interrupt, "step", None)
    phase = getattr(interrupt, "phase", None)
    line = _claim_line(
        step if isinstance(step, int) else step_of(frames),
        phase if isinstance(phase, str) else phase_of(frames),
    )
    if line is not None:
        if sys.stderr.isatty():
            sys.stderr.write("\n")  # after the ^C the terminal echoed
        print(line, file=sys.stderr, flush=True)
        _append_to_log(line)
    return exit_code()


def _claim_line(step: int | None, phase: str | None) -> str | None:
    """The stop line, to the first caller only (the entry point or the watchdog)."""
    if not _State.line_taken.acquire(blocking=False):
        return None
    run = _State.run
    if run is None:
        return "interrupted during start-up, before the run began: start it again"
    checkpoint = latest_checkpoint(Path(run.output_dir) / "checkpoints")
    phase = phase or "before or after training"  # the command line's checks, the summary
    return stop_line(run.start_step if step is None else step, phase, checkpoint, run)


def _append_to_log(text: str) -> None:
    log_file = _State.run.console_log if _State.run is not None else None
    if log_file is not None:
        with contextlib.suppress(OSError), log_file.open("a", encoding="utf-8") as log:
            log.write(text + "\n")


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _State.signum is not None:  # the second: no more waiting
        _exit_now(f"a second {SIGNAL_NAMES.get(signum, signum)}", stop_ray=False)
    _State.signum = signum
    stack = stack_of(frame)
    _State.landed = (step_of(stack), phase_of(stack))
    threading.Thread(target=_watch, name="stop watchdog", daemon=True).start()
    raise Interrupted(signum)


def _watch() -> None:
    time.sleep(GRACE_SECONDS)
    _exit_now(f"the run did not end within {GRACE_SECONDS:g} s", stop_ray=True)


def _exit_now(why: str, *, stop_ray: bool) -> None:
    """Print the stop line (of where the first signal came in), write every thread's
    stack to ``train.log``, stop Ray, kill this process's children and exit with
    :func:`exit_code`.

    Nothing here may wait on the main thread, which may hold any lock: the line goes
    to stderr's descriptor, unbuffered and non-blocking, not through ``sys.stderr``.
    """
    with contextlib.suppress(BaseException):
        line = _claim_line(*_State.landed)
        if line is not None:
            _append_to_log(line)
            os.set_blocking(2, False)  # a stderr pipe nobody reads must not hold the exit
            try:
                os.write(2, f"{line}\n".encode())
            finally:
                os.set_blocking(2, True)  # the descriptor is shared: a terminal stays usable
    with contextlib.suppress(BaseException):
        _append_to_log(f"{why}: stopped by force; its threads were at:\n{_thread_stacks()}")
    if stop_ray:
        with contextlib.suppress(BaseException):
            _stop_ray()
    with contextlib.suppress(BaseException):
        kill_children()
    os._exit(exit_code())


def _thread_stacks() -> str:
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "".join(
        f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in sys._current_frames().items()
    )


def _stop_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    stopper = threading.Thread(target=ray.shutdown, name="ray shutdown", daemon=True)
    stopper.start()
    stopper.join(RAY_SHUTDOWN_SECONDS)


def kill_children() -> list[int]:
    """SIGKILL every process below this one (engines, env sandboxes, a local Ray).

    Returns:
        Their process ids (none where there is no /proc to read).
    """
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [os.getpid()]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return found


class _Console(io.RawIOBase):
    """A console descriptor that a closed pipe does not break: on the first EPIPE the
    descriptor becomes /dev/null (for processes started later too) and the write
    counts as done."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)

    def write(self, data: Buffer, /) -> int:
        try:
            return os.write(self.fd, data)
        except BrokenPipeError:
            # no logging here: its console handler writes to this very stream
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.fd)
            os.close(devnull)
            name = {1: "stdout", 2: "stderr"}.get(self.fd, f"file descriptor {self.fd}")
            _append_to_log(f"({name} is a closed pipe: the run goes on, its lines only here)")
            return memoryview(data).nbytes


def guard_console(stream: TextIO) -> TextIO:
    """A text stream on ``stream``'s descriptor (stdout's, stderr's) that keeps working
    when the pipe's reader goes away; ``stream`` itself when it has no descriptor."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return stream
    with contextlib.suppress(OSError):
        stream.flush()
    return io.TextIOWrapper(
        io.BufferedWriter(_Console(fd)),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=bool(stream.line_buffering),
        write_through=getattr(stream, "write_through", False),
    )
