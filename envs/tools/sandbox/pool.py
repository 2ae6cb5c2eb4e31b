"""A bounded pool of launcher processes that run sandboxed code concurrently.

Each worker thread of the pool owns one *zygote*: a ``python -I -S``
interpreter running :mod:`._launcher` in ``serve`` mode, started with an empty
environment. For every call the zygote forks a fresh monitor process, which
sets up the namespaces and runs the code (see the launcher's docstring), so
each call still gets a fresh process while the interpreter's start-up is paid
once per worker. With ``prefork=False`` every call starts a new interpreter
instead (slower, and what the benchmark compares against).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import marshal
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

LAUNCHER = Path(__file__).with_name("_launcher.py")
BACKSTOP_SECONDS = 10.0
"""Extra time the parent gives the launcher past the wall-clock limit before killing it."""

Request = dict[str, Any]
Result = dict[str, Any]


def launcher_command(python: str, site_packages: bool) -> list[str]:
    """The command that starts the launcher: ``python -I [-S] _launcher.py``.

    ``-I`` isolates the interpreter from the environment and the user's site
    directory; ``-S`` (without ``site_packages``) leaves out site-packages too.
    """
    flags = ["-I"] if site_packages else ["-I", "-S"]
    return [python, *flags, str(LAUNCHER)]


def _failure(message: str) -> Result:
    return {"setup_error": message}


def _start_launcher(command: list[str], *, stderr: int) -> subprocess.Popen[bytes]:
    """Start a launcher: pipes to it, an empty environment, ``/`` as working directory.

    It gets a session of its own: a process group that :func:`_kill_group` ends whole.

    Args:
        command: What :func:`launcher_command` gave (with ``serve`` for a zygote).
        stderr: ``subprocess.PIPE`` to read its errors, or ``subprocess.DEVNULL``.
    """
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env={},
        cwd="/",
        start_new_session=True,
    )


def run_once(command: list[str], request: Request) -> Result:
    """Run one request in a freshly started launcher (no zygote)."""
    timeout = float(request["wall_seconds"]) + BACKSTOP_SECONDS
    proc = _start_launcher(command, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(marshal.dumps(request), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return _failure(f"the launcher did not answer within {timeout:.0f} s and was killed")
    if not out:
        return _failure(f"the launcher exited with {proc.returncode}: {err.decode()[-500:]}")
    result: Result = marshal.loads(out)
    return result


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class _Zygote:
    """One pre-started launcher in ``serve`` mode; used by one thread at a time."""

    def __init__(self, command: list[str]) -> None:
        self.proc = _start_launcher(command, stderr=subprocess.DEVNULL)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def call(self, request: Request) -> Result:
        deadline = time.monotonic() + float(request["wall_seconds"]) + BACKSTOP_SECONDS
        payload = marshal.dumps(request)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(len(payload).to_bytes(8, "big") + payload)
            self.proc.stdin.flush()
            header = self._read(8, deadline)
            data = self._read(int.from_bytes(header, "big"), deadline)
        except (OSError, TimeoutError, EOFError) as exc:
            self.close()
            return _failure(f"the sandbox launcher failed and was restarted: {exc!r}")
        result: Result = marshal.loads(data)
        return result

    def _read(self, size: int, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        chunks = []
        while size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no answer before the backstop deadline")
            chunk = os.read(fd, min(size, 1 << 20))
            if not chunk:
                raise EOFError("the launcher exited")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self.alive:
            _kill_group(self.proc)  # the monitor is in the group; init dies with the monitor
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class WorkerPool:
    """At most ``max_workers`` sandboxed calls at a time, the rest wait in line.

    Args:
        max_workers: Concurrent calls; default ``os.cpu_count()``.
        prefork: Keep one zygote per worker (fast) instead of starting an
            interpreter per call.

    Raises:
        ValueError: If ``max_workers`` is below 1.
    """

    def __init__(self, max_workers: int | None = None, *, prefork: bool = True) -> None:
        workers = max_workers if max_workers is not None else (os.cpu_count() or 1)
        if workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = workers
        self.prefork = prefork
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="agentgym-sandbox")
        self._local = threading.local()
        self._zygotes: list[_Zygote] = []
        self._lock = threading.Lock()

    def run(self, command: list[str], requests: Iterable[Request]) -> list[Result]:
        """Run requests concurrently (bounded by the pool), results in order."""
        return list(self._executor.map(functools.partial(self._call, command), requests))

    def _call(self, command: list[str], request: Request) -> Result:
        if not self.prefork:
            return run_once(command, request)
        zygotes: dict[tuple[str, ...], _Zygote] = self._local.__dict__.setdefault("zygotes", {})
        key = tuple(command)
        zygote = zygotes.get(key)
        if zygote is None or not zygote.alive:
            zygote = zygotes[key] = _Zygote([*command, "serve"])
            with self._lock:
                self._zygotes.append(zygote)
        return zygote.call(request)

    def close(self) -> None:
        """Stop the zygotes and the worker threads."""
        self._executor.shutdown(wait=True)
        with self._lock:
            for zygote in self._zygotes:
                zygote.close()
            self._zygotes.clear()


_DEFAULT_POOL: WorkerPool | None = None
_DEFAULT_LOCK = threading.Lock()


def _forget_default_pool() -> None:
    """In a forked child the parent's worker threads and zygote pipes are not ours."""
    global _DEFAULT_POOL, _DEFAULT_LOCK
    _DEFAULT_POOL = None
    _DEFAULT_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_default_pool)


def default_pool() -> WorkerPool:
    """The process-wide pool shared by every sandbox that is not given its own."""
    global _DEFAULT_POOL
    with _DEFAULT_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = WorkerPool()
            atexit.register(_DEFAULT_POOL.close)
        return _DEFAULT_POOL
