"""``python -m <module> ...`` for tests, without paying torch's imports each time.

About 150 tests run an ``agentgym`` command in a process of its own (the docs'
commands, ROLL's and Trinity's files, the env configs). A fresh interpreter spends
7-9 s of this machine's CPU importing torch and transformers before the command does
anything. :func:`run_python` forks such a command from a server process that imported
them once (as ``multiprocessing``'s forkserver does), so a test pays only the
command's own work: a two-step training command takes 3.2 s here instead of 11.4 s.

The child is a process of its own with the test's working folder, environment,
arguments, standard streams and ``sys.path``; it runs the module as ``python -m``
does (``runpy``) and exits as the interpreter would (non-daemon threads joined, atexit
handlers run), less the teardown of the preloaded modules.

What stays a fresh ``python``: anything but ``-m`` (``-c`` scripts), and a command whose
environment differs from the server's in a variable that a preloaded library reads when
it is imported (:data:`IMPORT_TIME`). agentgym itself is never preloaded, so its module
state is fresh in every child. Tests about signals, process trees and interpreter
start-up keep spawning real processes with :mod:`subprocess`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PRELOADED = (
    "torch",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "hydra",
    "omegaconf",
    "gymnasium",
    "numpy",
)
"""Imported once by the server. Not agentgym's modules (their state starts fresh in
each command), nor vLLM's or Ray's: agentgym sets variables those two read at import
(``VLLM_LOGGING_CONFIG_PATH``, Ray's loopback binding) just before importing them."""

IMPORT_TIME = ("TORCH", "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "CUDA_", "HF_",
               "HUGGINGFACE", "TRANSFORMERS_", "TOKENIZERS_", "HYDRA_", "PYTHON", "TMP",
               "TEMP", "HOME", "XDG_")  # fmt: skip
"""Prefixes of the variables that the preloaded libraries or the interpreter read at
import (or cache on first use). A command whose value for any of them differs from the
server's runs in a fresh interpreter."""

AT_RUN_TIME = ("PYTHONPATH", "PYTHONBREAKPOINT", "TORCH_NCCL_", "TORCHINDUCTOR_",
               "PYTORCH_NVML_BASED_CUDA_CHECK", "PYTORCH_CUDA_ALLOC_CONF")  # fmt: skip
"""Exceptions among those, read only when used: ``PYTHONPATH`` (the child puts its
entries on ``sys.path`` as a fresh interpreter would), the breakpoint hook, NCCL's
settings (read as a group is made), inductor's (read as a graph compiles), the CUDA
check and the CUDA allocator's settings (read as it starts; ``benchmarks.gpu`` sets
them on import). vLLM's CPU engine, started inside a test, sets the last three and
``LD_PRELOAD`` in the test process's environment for its own workers; the loader's
variables are not compared, for the same reason: the command gets them in its
environment, and the processes it starts load with them."""

BASE_ENV = dict(os.environ)
"""The test process's environment as collection found it, before any test (or the
library code a test calls: vLLM's and Ray's settings, ``RAY_ADDRESS``) changed it."""


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that must match the server's (see :data:`IMPORT_TIME`)."""
    return {
        k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and not k.startswith(AT_RUN_TIME)
    }


# --- the server -------------------------------------------------------------------------


def serve() -> dict[str, Any]:
    """Preload, then fork one child per request until the client closes the pipe.

    Returns only in a child, with the request it is to run. Replies are JSON lines:
    ``{"id", "pid"}`` when a child starts, ``{"id", "returncode"}`` when it ends.
    """
    import gc

    for name in PRELOADED:
        __import__(name)
    gc.freeze()  # the children's collections skip the preloaded objects (and share their pages)
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    running: dict[int, int] = {}  # pid -> request id
    pending = b""
    while True:
        readable, _, _ = select.select([requests], [], [], 0.05)
        if readable:
            chunk = requests.read(65536)
            if not chunk:
                os._exit(0)  # the client is gone; children finish on their own
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    requests.close()
                    replies.close()
                    return dict(request)
                running[pid] = request["id"]
                replies.write(json.dumps({"id": request["id"], "pid": pid}) + "\n")
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            ident = running.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            replies.write(json.dumps({"id": ident, "returncode": code}) + "\n")


def become(request: dict[str, Any]) -> None:
    """In the child: take the request's folder, environment, streams and path, then
    run its module as ``python -m`` would."""
    import runpy
    import types

    ours = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # the server's
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    point(0, request["stdin"], os.O_RDONLY)
    point(1, request["stdout"], os.O_WRONLY | os.O_APPEND)
    if request["stderr"] == request["stdout"]:
        os.dup2(1, 2)
    else:
        point(2, request["stderr"], os.O_WRONLY | os.O_APPEND)
    served = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in ours]
    sys.path[:] = [os.getcwd(), *served, *base]
    for name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
        del sys.modules[name]
    import numpy

    numpy.random.seed()  # a fresh interpreter seeds numpy's global state from the OS
    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.argv = ["-m", *request["argv"][1:]]
    try:
        runpy._run_module_as_main(request["argv"][0], alter_argv=True)  # type: ignore[attr-defined]
        code = 0
    except SystemExit as stop:
        code = exit_code(stop.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    finish(code)


def point(fd: int, path: str, flags: int) -> None:
    """Make ``fd`` (a standard stream) the file at ``path``."""
    opened = os.open(path, flags)
    os.dup2(opened, fd)
    os.close(opened)


def exit_code(code: object) -> int:
    """The status ``sys.exit(code)`` gives a process (a message goes to stderr)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def finish(code: int) -> None:
    """Exit as the interpreter would, less its module teardown: wait for non-daemon
    threads, run the atexit handlers, collect garbage (closing what finalizers close),
    flush. The teardown of the preloaded modules alone costs 1.5 s a command here."""
    import atexit as exits
    import gc

    threading._shutdown()  # type: ignore[attr-defined]
    exits._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a command may have closed one
            stream.flush()
    os._exit(code)


# --- the client -------------------------------------------------------------------------


class ForkServer:
    """The test process's side: one server, shared by the test's threads."""

    def __init__(self) -> None:
        self.env = BASE_ENV
        self.folder = Path(tempfile.mkdtemp(prefix="agentgym-forkserver-"))
        self.log = (self.folder / "server.log").open("w")
        root = Path(__file__).parents[1]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver"], cwd=root, env=self.env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
        )  # fmt: skip
        assert self.process.stdout is not None
        if not self.process.stdout.readline():
            raise RuntimeError(f"the fork server died:\n{self.read_log()}")
        self.lock = threading.Condition()
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        self.next_id = 0
        self.dead = False
        threading.Thread(target=self.read_replies, daemon=True).start()

    def read_log(self) -> str:
        self.log.flush()
        return (self.folder / "server.log").read_text()[-3000:]

    def read_replies(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            reply = json.loads(line)
            with self.lock:
                if "pid" in reply:
                    self.pids[reply["id"]] = reply["pid"]
                else:
                    self.codes[reply["id"]] = reply["returncode"]
                self.lock.notify_all()
        with self.lock:
            self.dead = True
            self.lock.notify_all()

    def compatible(self, env: Mapping[str, str]) -> bool:
        """Whether a command with ``env`` may run from this server. With
        ``AGENTGYM_FORKSERVER_LOG`` set, a command that may not is logged there, with the
        variables that differ."""
        theirs, ours = import_time_env(env), import_time_env(self.env)
        if theirs == ours:
            return True
        if log := os.environ.get("AGENTGYM_FORKSERVER_LOG"):
            differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
            with open(log, "a") as file:
                file.write(json.dumps({"pid": os.getpid(), "differ": differ}) + "\n")
        return False

    def submit(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str],
               streams: tuple[Path, Path, Path]) -> int:  # fmt: skip
        """Fork ``python -m <argv>`` with stdin, stdout and stderr from ``streams``
        (existing files; output is appended); returns the request's id."""
        with self.lock:
            ident, self.next_id = self.next_id, self.next_id + 1
            paths = {name: str(path) for name, path in zip(STREAMS, streams, strict=True)}
            request = {"id": ident, "argv": list(argv), "cwd": str(cwd), "env": dict(env),
                       **paths}  # fmt: skip
            assert self.process.stdin is not None
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        return ident

    def pid(self, ident: int) -> int:
        with self.lock:
            self.lock.wait_for(lambda: ident in self.pids or self.dead)
            if ident not in self.pids:
                raise RuntimeError(f"the fork server died:\n{self.read_log()}")
            return self.pids[ident]

    def wait(self, ident: int, timeout: float | None) -> int | None:
        """The request's exit status, or None if it is still running after ``timeout``."""
        with self.lock:
            if not self.lock.wait_for(lambda: ident in self.codes or self.dead, timeout):
                return None
            if ident not in self.codes:
                raise RuntimeError(f"the fork server died:\n{self.read_log()}")
            return self.codes[ident]

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


STREAMS = ("stdin", "stdout", "stderr")


class Forked:
    """A command forked from the server, used as a :class:`subprocess.Popen` is (``pid``,
    ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``)."""

    def __init__(self, server: ForkServer, ident: int, argv: Sequence[str]) -> None:
        self.server, self.ident, self.args = server, ident, ["python", "-m", *argv]
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.server.pid(self.ident)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.wait(self.ident, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.wait(self.ident, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, signal: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it ended just now
                os.kill(self.pid, signal)

    def kill(self) -> None:
        self.send_signal(9)


Process = Forked | subprocess.Popen[str]
"""What :func:`start_python` gives."""

_server: ForkServer | None = None
_starting = threading.Lock()


def server() -> ForkServer:
    """This test process's fork server, started on first use."""
    global _server
    with _starting:
        if _server is None:
            _server = ForkServer()
            atexit.register(_server.close)
        return _server


def start_python(
    args: Sequence[str], *, cwd: Path | str, env: Mapping[str, str] | None = None,
    output: Path,
) -> Process:  # fmt: skip
    """``python <args>`` started in ``cwd`` with ``env`` (default: this process's), its
    stdout and stderr appended to ``output``: forked from the preloaded server for
    ``-m`` commands, a fresh interpreter otherwise (see the module's docstring)."""
    env = dict(os.environ if env is None else env)
    output.touch()
    if args and args[0] == "-m" and (forks := server()).compatible(env):
        ident = forks.submit(args[1:], Path(cwd), env, (Path(os.devnull), output, output))
        return Forked(forks, ident, args[1:])
    with output.open("a") as log:
        return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def run_python(
    args: Sequence[str], *, cwd: Path | str, env: Mapping[str, str] | None = None,
    input: str = "", timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``python <args>`` in ``cwd`` with ``env`` (default: this process's), its output
    captured as text, as :func:`subprocess.run` gives it: forked from the preloaded
    server for ``-m`` commands, a fresh interpreter otherwise."""
    env = dict(os.environ if env is None else env)
    if not args or args[0] != "-m" or not (forks := server()).compatible(env):
        return subprocess.run([sys.executable, *args], cwd=cwd, env=env, input=input,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
    with tempfile.TemporaryDirectory(dir=forks.folder) as scratch:
        streams = (Path(scratch) / "stdin", Path(scratch) / "stdout", Path(scratch) / "stderr")
        streams[0].write_text(input)
        streams[1].touch()
        streams[2].touch()
        process = Forked(forks, forks.submit(args[1:], Path(cwd), env, streams), args[1:])
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        out, err = (path.read_text(errors="replace") for path in streams[1:])
    return subprocess.CompletedProcess(process.args, code, out, err)


if __name__ == "__main__":
    become(serve())
