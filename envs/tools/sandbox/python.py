"""Run model-written Python in a sandbox: fresh process, namespaces, limits.

Every call runs in a fresh process of an isolated interpreter (``python -I``),
with an empty environment, resource limits (CPU seconds, address space, file
size, processes, open files), a wall-clock timeout that kills everything the
code started, and its output truncated. Where the kernel allows it (the
default on Debian and most CI machines), the process also gets its own
network, mount, pid, IPC and UTS namespaces: no network at all, a read-only
root holding only the system directories and the Python installation, an
empty writable home directory (``/home/sandbox``, also the working directory)
that vanishes afterwards, and no view of the host's processes. See
:mod:`agentgym.envs.tools.sandbox._launcher` for the details.

Without namespaces the sandbox refuses to start unless it is told
``allow_no_network_isolation=True``; then the code runs with the limits, the
empty environment and a temporary working directory only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.envs.tools.sandbox.pool import (
    Request,
    Result,
    WorkerPool,
    default_pool,
    launcher_command,
    run_once,
)

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("auto", "namespaces", "none")
"""Valid ``isolation`` settings: the best available, namespaces or fail, none."""

_PROBE_LIMITS_PROCESSES = 8
# The probe checks the network, the working directory, the user, and that the
# process limit holds (the kernel does not apply it to host root, which a
# caller inside someone else's user namespace may be without knowing).
_PROBE = f"""
import os, socket, time
forked = 0
for _ in range({_PROBE_LIMITS_PROCESSES + 4}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(10)
        os._exit(0)
    forked += 1
interfaces = sorted(name for _, name in socket.if_nameindex())
print(interfaces, os.getcwd(), os.getuid(), forked < {_PROBE_LIMITS_PROCESSES})
"""
_PROBE_OUTPUT = "['lo'] /home/sandbox 65534 True"


class SandboxUnavailableError(RuntimeError):
    """The requested isolation is not available on this machine."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed call.

    Attributes:
        cpu_seconds: CPU time of the process (SIGXCPU, then SIGKILL a second later).
        wall_seconds: Wall-clock time before everything the call started is killed.
        memory_mb: Address-space limit of each process, in MiB.
        file_size_mb: Largest file the code may write, in MiB.
        disk_mb: Size of the writable home tmpfs, in MiB (namespaces only).
        max_processes: Processes (and threads) the code may have at once.
        max_open_files: Open file descriptors per process.
        max_output_bytes: Output kept from stdout and stderr; the process is
            killed when it writes more.
    """

    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_mb: int = 512
    file_size_mb: int = 16
    disk_mb: int = 32
    max_processes: int = 32
    max_open_files: int = 64
    max_output_bytes: int = 8192

    def __post_init__(self) -> None:
        minimum = {"memory_mb": 64, "max_open_files": 16, "max_processes": 2}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            low = minimum.get(field.name, 1)
            if not value >= low:
                raise ValueError(f"SandboxLimits.{field.name} must be >= {low}, got {value!r}")

    def request(self) -> dict[str, Any]:
        """The limits as the launcher's request fields."""
        mib = 1 << 20
        return {
            "cpu_seconds": self.cpu_seconds,
            "wall_seconds": self.wall_seconds,
            "memory_bytes": self.memory_mb * mib,
            "file_size_bytes": self.file_size_mb * mib,
            "tmpfs_bytes": self.disk_mb * mib,
            "max_processes": self.max_processes,
            "max_open_files": self.max_open_files,
            "max_output_bytes": self.max_output_bytes,
        }


@dataclass(frozen=True)
class SandboxResult:
    """How one sandboxed call ended.

    Attributes:
        output: stdout and stderr, interleaved, decoded as UTF-8 (truncated).
        status: ``"ok"`` (exit status 0), ``"error"`` (non-zero exit status,
            e.g. an exception), ``"timeout"``, ``"cpu_limit"``,
            ``"output_limit"``, ``"crashed"`` (killed by a signal) or
            ``"sandbox_error"`` (the sandbox itself failed).
        message: A one-line explanation for the model; empty when ``ok``.
        exit_code: The exit status, or None when killed.
        truncated: Whether output was cut at ``max_output_bytes``.
        wall_seconds: Time from start to end of the process tree.
        cpu_seconds: CPU time of the code's process.
    """

    output: str
    status: str
    message: str = ""
    exit_code: int | None = None
    truncated: bool = False
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the code ran to completion with exit status 0."""
        return self.status == "ok"

    def to_text(self) -> str:
        """The tool result shown to the model: the output, then what went wrong."""
        text = self.output
        if self.truncated:
            text += "\n[output truncated]"
        if self.message:
            text = f"{text.rstrip()}\n[{self.message}]" if text.strip() else f"[{self.message}]"
        return text if text.strip() else "(no output)"


def _interpret(raw: Result, limits: SandboxLimits) -> SandboxResult:
    output = raw.get("output", b"").decode("utf-8", errors="replace")
    common = {
        "output": output,
        "exit_code": raw.get("exit_code"),
        "truncated": bool(raw.get("truncated")),
        "wall_seconds": float(raw.get("wall_seconds", 0.0)),
        "cpu_seconds": float(raw.get("cpu_seconds", 0.0)),
    }
    sig = raw.get("signal")
    if "setup_error" in raw:
        return SandboxResult(
            **common, status="sandbox_error", message=f"sandbox error: {raw['setup_error']}"
        )
    if raw.get("stop") == "timeout":
        message = f"killed: wall-clock limit of {limits.wall_seconds:g} s exceeded"
        return SandboxResult(**common, status="timeout", message=message)
    if raw.get("stop") == "output_limit":
        message = f"killed: output exceeded {limits.max_output_bytes} bytes"
        return SandboxResult(**common, status="output_limit", message=message)
    cpu_kill = sig == signal.SIGKILL and common["cpu_seconds"] >= limits.cpu_seconds
    if sig == signal.SIGXCPU or cpu_kill:
        message = f"killed: CPU time limit of {limits.cpu_seconds} s exceeded"
        return SandboxResult(**common, status="cpu_limit", message=message)
    if sig is not None:
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        return SandboxResult(**common, status="crashed", message=f"killed by signal {name}")
    if raw.get("exit_code") == 0:
        return SandboxResult(**common, status="ok")
    message = f"exit status {raw.get('exit_code')}"
    if "MemoryError" in output:
        message += f" (memory limit: {limits.memory_mb} MiB)"
    return SandboxResult(**common, status="error", message=message)


_DETAILS = {
    "root": "mount, pid, net, ipc and uts namespaces created as root",
    "user": "an unprivileged user namespace with mount, pid, net, ipc and uts namespaces",
}


@dataclass(frozen=True)
class IsolationReport:
    """Whether namespaces work here, and how.

    Attributes:
        available: A test call ran with loopback as its only network
            interface, in ``/home/sandbox``, as nobody.
        detail: The isolation in force, or why namespaces are not available.
    """

    available: bool
    detail: str


@functools.cache
def probe_isolation(command: tuple[str, ...]) -> IsolationReport:
    """Try the namespaces once per interpreter command (the answer is cached)."""
    with _workdirs(1) as roots:
        limits = SandboxLimits(max_processes=_PROBE_LIMITS_PROCESSES)
        request = {**_request(_PROBE, limits, True, command), "root": roots[0]}
        raw = run_once(list(command), request)
    if "setup_error" in raw:
        return IsolationReport(False, str(raw["setup_error"]))
    output = raw.get("output", b"").decode(errors="replace").strip()
    if output.endswith("False"):
        return IsolationReport(
            False, "the process limit is not enforced: the sandbox's user is root on the host"
        )
    if output != _PROBE_OUTPUT:
        return IsolationReport(False, f"the probe printed {output!r}, expected {_PROBE_OUTPUT!r}")
    detail = _DETAILS.get(raw.get("namespaces", ""), "namespaces")
    report = IsolationReport(
        True,
        f"{detail}; a read-only root with only the system and Python directories and a "
        "private home directory; the code runs as nobody with no capabilities",
    )
    logger.info("Python sandbox isolation: %s", report.detail)
    return report


def _request(code: str, limits: SandboxLimits, isolate: bool, command: Sequence[str]) -> Request:
    return {
        "code": code,
        "isolate": isolate,
        "ro_binds": _python_dirs(site_packages="-S" not in command),
        **limits.request(),
    }


@contextlib.contextmanager
def _workdirs(count: int) -> Iterator[list[str]]:
    """Empty temporary directories, one per call, removed afterwards."""
    roots = [tempfile.mkdtemp(prefix="agentgym-sandbox-") for _ in range(count)]
    try:
        yield roots
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


@functools.cache
def _python_dirs(site_packages: bool) -> list[str]:
    """Host directories the sandboxed interpreter needs, bound read-only at the same path."""
    dirs = {os.path.realpath(sys.base_prefix)}
    if site_packages:
        import site

        dirs.add(os.path.realpath(sys.prefix))
        dirs.update(os.path.realpath(path) for path in site.getsitepackages())
    return sorted(dirs)


class PythonSandbox:
    """Runs Python code in a confined fresh process per call.

    Args:
        limits: Resource limits of each call.
        isolation: ``"auto"`` (namespaces where the kernel allows them, else
            none, which must then be allowed), ``"namespaces"`` (fail without
            them) or ``"none"``.
        allow_no_network_isolation: Run without namespaces (no network, mount
            or pid isolation: only limits, an empty environment and a
            temporary directory) instead of refusing to start.
        site_packages: Let the code import the installed packages (numpy,
            sympy, ...) besides the standard library.
        pool: The worker pool that bounds concurrent calls; default: one
            shared by every sandbox in the process, ``os.cpu_count()`` wide.

    Attributes:
        isolation: The isolation in force: ``"namespaces"`` or ``"none"``.
        isolation_detail: What that means on this machine, in a sentence.

    Raises:
        ValueError: If ``isolation`` is not one of :data:`ISOLATION_MODES`.
        SandboxUnavailableError: If namespaces are required (or ``auto`` and
            no isolation is not allowed) but the kernel refuses them; the
            message says why and how to fix it.
    """

    def __init__(
        self,
        *,
        limits: SandboxLimits | None = None,
        isolation: str = "auto",
        allow_no_network_isolation: bool = False,
        site_packages: bool = False,
        pool: WorkerPool | None = None,
    ) -> None:
        if isolation not in ISOLATION_MODES:
            raise ValueError(
                f"isolation={isolation!r} is not supported; valid options: {list(ISOLATION_MODES)}"
            )
        self.limits = limits or SandboxLimits()
        self._command = launcher_command(sys.executable, site_packages)
        self._pool = pool
        probe = None if isolation == "none" else probe_isolation(tuple(self._command))
        reason = "isolation='none' was requested" if probe is None else probe.detail
        if probe is not None and probe.available:
            self.isolation = "namespaces"
            self.isolation_detail = probe.detail
        elif isolation == "namespaces" or not allow_no_network_isolation:
            raise SandboxUnavailableError(
                "The Python sandbox needs network isolation, and this machine does not allow "
                f"unprivileged user/network/mount namespaces ({reason}). "
                "Enable them (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu "
                "kernel.apparmor_restrict_unprivileged_userns=0; in Docker, run with a seccomp "
                "profile that allows unshare), or pass allow_no_network_isolation=True to run "
                "trusted code with resource limits only."
            )
        else:
            self.isolation = "none"
            self.isolation_detail = (
                f"none ({reason}): resource limits, an empty environment and a temporary "
                "directory only; the code can use the network and see the host's files"
            )
            logger.warning("Python sandbox running WITHOUT namespaces: %s", reason)

    def run(self, code: str) -> SandboxResult:
        """Run one piece of code; never raises because of what the code does."""
        return self.run_many([code])[0]

    def run_many(self, codes: Sequence[str]) -> list[SandboxResult]:
        """Run several pieces of code concurrently (bounded by the pool); results in order."""
        pool = self._pool or default_pool()
        isolate = self.isolation == "namespaces"
        requests = [_request(code, self.limits, isolate, self._command) for code in codes]
        with _workdirs(len(requests)) as roots:
            raws = pool.run(
                self._command,
                [{**req, "root": root} for req, root in zip(requests, roots, strict=True)],
            )
        return [_interpret(raw, self.limits) for raw in raws]
