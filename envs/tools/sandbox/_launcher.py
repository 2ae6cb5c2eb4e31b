"""The sandbox launcher: runs one piece of Python code in a fresh, confined process.

:class:`agentgym.envs.tools.sandbox.python.PythonSandbox` runs this file as
``python -I -S _launcher.py`` with an empty environment, writes one request
(a ``marshal``-encoded dict) to its stdin and reads one result (the same) from
its stdout. Standard library only, and only fast imports (no ``json``, ``re``,
``signal`` or ``enum``): interpreter start is most of a call's latency.

Isolated mode, processes and what each one does::

    monitor   this process: unshare(mount, pid, net, ipc, uts [+ user when not
      │       root]), then reads the output pipe under the wall-clock and
      │       output limits; on either it kills init, and the kernel kills
      │       everything left in the pid namespace with it
      └─ init     pid 1 of the new pid namespace: mounts a new root (a tmpfs with
           │      read-only binds of /usr and the Python installation, /dev
           │      nodes, a fresh /proc, a size-capped writable home) and
           │      pivots into it, detaching the host's root; drops every
           │      privilege (setuid nobody when started as root, else a nested
           │      user namespace that locks the mounts); reaps orphans
           └─ runner  resource limits, empty environment, cwd /home/sandbox, runs the code

Without isolation (``isolate`` false) the monitor forks the same two processes
in the host's namespaces, and the runner works in the parent's empty temporary
directory.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import select
import sys
import time
from typing import Any

NOBODY = 65534
SIGKILL = 9

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2
# Per-mount flags that a less privileged mount namespace may not clear (they
# are locked), so a read-only remount has to repeat them.
_LOCKED_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME | MS_RELATIME

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
WORKDIR = "/home/sandbox"
ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "TMPDIR": WORKDIR}
SETUP_FAILED = 125


class SetupError(Exception):
    """The sandbox could not be set up (reported to the parent, never to the code)."""


LIBC: Any = ctypes.CDLL(None, use_errno=True)
"""The C library's calls that Python's ``os`` lacks (mount, unshare, prctl, ...)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)} (errno {errno})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        LIBC.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source or fstype} on {target}",
    )


def _enter_user_namespace(flags: int, inner: int, outer: tuple[int, int], what: str) -> None:
    """Unshare a new user namespace (and ``flags``); map one user and one group into it:
    ``inner`` inside is ``outer`` (uid, gid) outside."""
    _check(LIBC.unshare(flags | CLONE_NEWUSER), what)
    LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    uid, gid = outer
    maps = {"setgroups": "deny", "uid_map": f"{inner} {uid} 1", "gid_map": f"{inner} {gid} 1"}
    for name, line in maps.items():
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def _become_nobody() -> None:
    """Leave root for user and group nobody (leaving uid 0 clears all capabilities)."""
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def _exit_report(wait_status: int, usage: resource.struct_rusage) -> dict[str, Any]:
    """How a waited-for process ended, and the CPU time it used."""
    return {
        "exit_code": os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else None,
        "signal": os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else None,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
    }


# -- monitor --------------------------------------------------------------------
def monitor(request: dict[str, Any]) -> dict[str, Any]:
    """Start the code, collect its output within the limits, and report how it ended.

    Returns:
        ``output`` (bytes, at most ``max_output_bytes``), ``truncated``,
        ``stop`` (``"timeout"``, ``"output_limit"`` or None), ``exit_code``,
        ``signal``, ``cpu_seconds``, ``wall_seconds``, ``namespaces``
        (``"root"`` or ``"user"``: who created them) and, when the sandbox
        could not be set up, ``setup_error``.
    """
    isolate = bool(request["isolate"])
    privileged = enter_namespaces() if isolate else os.geteuid() == 0
    out_r, out_w = os.pipe()
    status_r, status_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(status_r)
        _init(request, privileged, out_w, status_w)  # never returns
    os.close(out_w)
    os.close(status_w)
    limit = int(request["max_output_bytes"])
    output, stop = _collect(out_r, started + float(request["wall_seconds"]), limit)
    if stop is not None:
        _kill(pid, isolate)
    _, wait_status, usage = os.wait4(pid, 0)
    if not isolate:  # without a pid namespace, children the runner left behind live on
        _kill(pid, isolate)
    wall = time.monotonic() - started
    report = _read_all(status_r)
    os.close(out_r)
    result = _exit_report(wait_status, usage)
    if isolate:
        result["namespaces"] = "root" if privileged else "user"
    if report:  # init's account of the runner; absent when init was killed first
        result.update(marshal.loads(report))
    result.update(
        output=output[:limit], truncated=len(output) > limit, stop=stop, wall_seconds=wall
    )
    return result


def enter_namespaces() -> bool:
    """Unshare the namespaces; the next child forked is pid 1 of the new pid namespace.

    Root with CAP_SYS_ADMIN creates them directly (the code will run as
    nobody). Anyone else, root without that capability included, creates a
    user namespace first, as a user other than root: root's processes are
    exempt from the process-count limit.

    Returns:
        Whether the namespaces were created with root's privileges.
    """
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    if os.geteuid() == 0:
        if LIBC.unshare(flags) == 0:
            return True
        _become_nobody()
    _enter_user_namespace(flags, 0, (os.getuid(), os.getgid()), "unshare")
    return False


def _collect(fd: int, deadline: float, limit: int) -> tuple[bytes, str | None]:
    """Read the code's output until EOF, the deadline or one byte past ``limit``."""
    chunks: list[bytes] = []
    size = 0
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), "timeout"
        if not poller.poll(left * 1000):
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), None
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks), "output_limit"


def _kill(pid: int, isolate: bool) -> None:
    try:
        if isolate:
            os.kill(pid, SIGKILL)  # pid 1 of its namespace: the kernel kills the rest
        else:
            os.killpg(pid, SIGKILL)  # init's group: the code's processes, unless they left it
    except ProcessLookupError:
        pass


def _read_all(fd: int) -> bytes:
    """Read ``fd`` to its end, then close it."""
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


# -- init -----------------------------------------------------------------------
def _init(request: dict[str, Any], privileged: bool, out_w: int, status_w: int) -> None:
    """Confine, run the code in a child, reap orphans, report on ``status_w``; never returns."""
    report: dict[str, Any] = {}
    try:
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)  # the monitor's stdin and stdout are the parent's pipes
        os.dup2(null, 1)
        _close_all_but(2, out_w, status_w)
        os.setsid()  # its own process group: the code's kill(0, ...) cannot reach the monitor
        if request["isolate"]:
            build_root(request, privileged)
            cwd = WORKDIR
        else:
            cwd = request["root"]
            if privileged:
                os.chown(cwd, NOBODY, NOBODY)
        drop_privileges(privileged, request["isolate"])
        if request["isolate"]:
            LIBC.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)  # after the last credential change
        report = _run_runner(request, out_w, cwd)
    except BaseException as exc:  # report a setup failure to the parent, never to the code
        report = {"setup_error": f"{type(exc).__name__}: {exc}"}
    finally:
        _try_write(status_w, marshal.dumps(report))
        os._exit(0)


def _close_all_but(*keep: int) -> None:
    """Close every descriptor above 2 except ``keep``."""
    low = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _try_write(fd: int, data: str | bytes) -> None:
    try:  # noqa: SIM105 - contextlib is one more import to pay on every start
        os.write(fd, data.encode() if isinstance(data, str) else data)
    except OSError:
        pass


def _run_runner(request: dict[str, Any], out_w: int, cwd: str) -> dict[str, Any]:
    pid = os.fork()
    if pid == 0:
        status = SETUP_FAILED
        try:
            prepare_runner(request, out_w, cwd)
            status = run_code(request["code"])
        except BaseException as exc:
            _try_write(2, f"sandbox setup failed: {type(exc).__name__}: {exc}\n")
        finally:
            os._exit(status)
    os.close(out_w)
    while True:  # as pid 1, init also reaps the runner's orphans
        reaped, wait_status, usage = os.wait4(-1, 0)
        if reaped == pid:
            return _exit_report(wait_status, usage)


def build_root(request: dict[str, Any], privileged: bool) -> None:
    """Mount the sandbox's root file system on ``request["root"]`` and pivot into it.

    Only what the code needs is visible, read-only: the system directories,
    the Python installation, a few /dev nodes and a fresh /proc of the new pid
    namespace. The home directory (also at ``/tmp``) is the only writable
    place, a tmpfs of ``tmpfs_bytes`` that vanishes with the namespace.
    """
    root = request["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    read_only = [root, *_bind_host_dirs(root, [*SYSTEM_DIRS, *request["ro_binds"]])]
    os.makedirs(root + "/dev")
    for name in DEVICES:
        target = f"{root}/dev/{name}"
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(f"/dev/{name}", target, None, MS_BIND)
        read_only.append(target)
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        os.symlink(f"/proc/self/fd/{fd}", f"{root}/dev/{name}")
    os.symlink("/proc/self/fd", f"{root}/dev/fd")
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    owner = NOBODY if privileged else 0  # the code's user, as seen from this namespace
    options = f"size={int(request['tmpfs_bytes'])},mode=0700,uid={owner},gid={owner}"
    os.makedirs(root + WORKDIR)
    _mount("tmpfs", root + WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV, options)
    if not os.path.exists(root + "/tmp"):  # unless a host directory is bound under /tmp
        os.makedirs(root + "/tmp")
        _mount(root + WORKDIR, root + "/tmp", None, MS_BIND)
    for target in read_only:
        flags = os.statvfs(target).f_flag & _LOCKED_FLAGS
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | flags)
    os.chdir(root)
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise SetupError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    _check(LIBC.syscall(number, b".", b"."), "pivot_root")
    _check(LIBC.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir(WORKDIR)
    LIBC.sethostname(b"sandbox", 7)


def _bind_host_dirs(root: str, paths: list[str]) -> list[str]:
    """Bind host directories at the same paths under ``root``; return the mount points."""
    mounted = []
    for path in paths:
        if path == WORKDIR or path.startswith((WORKDIR + "/", "/proc/", "/dev/")):
            raise SetupError(f"cannot bind {path}: the sandbox has its own {path}")
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path) and not os.path.exists(root + path):
            os.makedirs(root + path)
            _mount(path, root + path, None, MS_BIND | MS_REC)
            mounted.append(root + path)
    return mounted


def drop_privileges(privileged: bool, isolate: bool) -> None:
    """Give up every capability for good, and gain none on exec."""
    if privileged:
        _become_nobody()
    elif isolate:
        # A nested user namespace: the mounts become locked (no remount, no
        # unmount), and the code is user nobody there, not root.
        _enter_user_namespace(CLONE_NEWNS, NOBODY, (0, 0), "unshare the inner user namespace")
        header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()
        _check(LIBC.capset(header, data), "capset")
    _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


# -- runner ---------------------------------------------------------------------
def prepare_runner(request: dict[str, Any], out_w: int, cwd: str) -> None:
    """Limits, file descriptors and environment of the process that runs the code."""
    cpu = int(request["cpu_seconds"])
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # SIGXCPU, then SIGKILL a second later
        resource.RLIMIT_AS: int(request["memory_bytes"]),
        resource.RLIMIT_FSIZE: int(request["file_size_bytes"]),
        resource.RLIMIT_NPROC: int(request["max_processes"]),
        resource.RLIMIT_NOFILE: int(request["max_open_files"]),
        resource.RLIMIT_CORE: 0,
    }
    for which, value in limits.items():
        resource.setrlimit(which, value if isinstance(value, tuple) else (value, value))
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    os.closerange(3, 1 << 16)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(ENVIRONMENT)
    # Fresh streams on the new descriptors: flushed line by line, so that what
    # the code printed before a timeout is not lost in a buffer.
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        stream = open(  # noqa: SIM115 - lives as long as the process
            fd,
            "r" if fd == 0 else "w",
            buffering=-1 if fd == 0 else 1,
            encoding="utf-8",
            errors="backslashreplace",
            closefd=False,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.argv = ["-c"]


def run_code(code: str) -> int:
    """Run ``code`` as ``__main__`` and return the exit status ``python -c`` would have."""
    import builtins

    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    status = 0
    try:
        exec(compile(code, "<code>", "exec"), namespace)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException as exc:
        import traceback

        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # drop this frame
        traceback.print_exception(type(exc), exc, tb)
        status = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    return status


# -- entry points ---------------------------------------------------------------
def _guarded_monitor(request: dict[str, Any]) -> bytes:
    try:
        return marshal.dumps(monitor(request))
    except BaseException as exc:  # never let a setup failure escape as a traceback
        return marshal.dumps({"setup_error": f"{type(exc).__name__}: {exc}"})


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = os.read(fd, size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def serve() -> None:
    """Zygote mode: serve requests one after another, each in a freshly forked monitor.

    Frames on stdin and stdout are an 8-byte big-endian length and a
    ``marshal`` payload. The zygote itself never runs code and never enters
    a namespace; it exits at the end of its input.
    """
    while True:
        header = _read_exactly(0, 8)
        payload = _read_exactly(0, int.from_bytes(header, "big")) if header else None
        if payload is None:
            os._exit(0)
        result_r, result_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(result_r)
            data = _guarded_monitor(marshal.loads(payload))
            _write_all(result_w, data)
            os._exit(0)
        os.close(result_w)
        data = _read_all(result_r)
        os.waitpid(pid, 0)
        if not data:
            data = marshal.dumps({"setup_error": "the sandbox monitor died without a result"})
        _write_all(1, len(data).to_bytes(8, "big") + data)


def main() -> None:
    """One-shot mode: one request on stdin, one result on stdout."""
    data = _guarded_monitor(marshal.loads(sys.stdin.buffer.read()))
    _write_all(1, data)
    os._exit(0)  # skip the interpreter's teardown: a few milliseconds per call


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["serve"] else main()
