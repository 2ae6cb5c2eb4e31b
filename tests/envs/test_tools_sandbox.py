"""The Python sandbox against hostile code, through ``MathToolEnv.step``.

Every attack must come back as an error result (an invalid call) within its
limit, leave nothing behind on the host, and leave the env, the sandbox pool
and this test process working. Limits are small (1 s CPU, 2 s wall clock,
128 MiB) to keep the suite fast; the time bounds asserted are generous and
only prove that a kill happened.
"""

from __future__ import annotations

import itertools
import os
import socket
import tempfile
import time
from pathlib import Path

import pytest

from agentgym.envs.tools.math_tool import MathToolEnv
from agentgym.envs.tools.protocol import format_call
from agentgym.envs.tools.sandbox import (
    PythonSandbox,
    SandboxLimits,
    SandboxUnavailableError,
    WorkerPool,
)
from agentgym.envs.tools.sandbox import pool as pool_module
from agentgym.envs.tools.sandbox import python as python_module
from tests.processes import descendants, parent_pids

WALL_SECONDS = 2.0
KILL_BOUND = 15.0  # seconds; far above every limit, far below "never"


def run(env: MathToolEnv, code: str) -> tuple[str, dict[str, object], float]:
    """One python call through ``step``: the result text, the info and the time taken."""
    env.reset(seed=0)
    started = time.monotonic()
    _, _, _, _, info = env.step(format_call("python", {"code": code}))
    results = info["tool_results"]
    assert isinstance(results, list) and len(results) == 1
    return results[0], info, time.monotonic() - started


def assert_error(result: str, info: dict[str, object], *fragments: str) -> None:
    assert result.startswith("Error:"), result[:300]
    assert info["action_is_valid"] is False and info["invalid_tool_calls"] == 1
    for fragment in fragments:
        assert fragment in result, result[-300:]


@pytest.fixture(scope="module")
def env() -> MathToolEnv:
    return MathToolEnv(
        cpu_seconds=1,
        wall_seconds=WALL_SECONDS,
        memory_mb=128,
        max_output_bytes=4096,
        isolation="namespaces",
    )


@pytest.fixture
def workdirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the sandbox makes its temporary working directories, for this test."""
    parent = tmp_path / "workdirs"
    parent.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(parent))
    return parent


def launcher_processes() -> int:
    """Processes running the sandbox launcher (zygotes and their forks) below this test
    process or orphaned to init: another test process's sandboxes (a second xdist
    worker's) are not counted, one that escaped this process's tree is."""
    parents = parent_pids()
    ours = descendants(os.getpid(), parents)
    count = 0
    for pid, parent in parents.items():
        if pid not in ours and parent != 1:
            continue
        try:
            count += str(pool_module.LAUNCHER).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
    return count


def test_a_normal_call_runs_isolated_in_an_empty_directory(
    env: MathToolEnv, workdirs: Path
) -> None:
    code = (
        "import os, sys, socket\n"
        "print(sys.flags.isolated, sorted(os.environ), os.listdir('.'), os.getcwd())\n"
        "print(sorted(name for _, name in socket.if_nameindex()))\n"
        "open('scratch.txt', 'w').write('x')\n"
    )
    result, info, _ = run(env, code)
    assert result.splitlines()[:2] == [
        "1 ['HOME', 'PATH', 'TMPDIR'] [] /home/sandbox",
        "['lo']",
    ]
    assert info["action_is_valid"] is True and env.sandbox.isolation == "namespaces"
    assert env.reset(seed=0)[1]["sandbox_isolation"] == "namespaces"
    assert list(workdirs.iterdir()) == []  # the working directory was removed


def test_fork_bomb_is_killed_with_all_its_processes(env: MathToolEnv) -> None:
    run(env, "print(1)")  # the pool's zygote is up before the count (run alone, it was not)
    before = launcher_processes()
    code = (
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    )
    result, info, elapsed = run(env, code)
    assert_error(result, info, "wall-clock limit of 2 s exceeded")
    assert elapsed < KILL_BOUND
    deadline = time.monotonic() + 10
    while launcher_processes() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert launcher_processes() <= before


def test_process_limit_stops_forks(env: MathToolEnv) -> None:
    code = (
        "import os, time\nn = 0\n"
        "for _ in range(200):\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    n += 1\n"
        "print('forked', n)\n"
    )
    result, _, elapsed = run(env, code)
    forked = int(result.split()[1])
    assert 0 < forked < SandboxLimits().max_processes  # 32 processes at most, runner included
    assert elapsed < KILL_BOUND  # the sleeping children died with the namespace


def test_infinite_loop_hits_the_cpu_limit(env: MathToolEnv) -> None:
    result, info, elapsed = run(env, "while True:\n    pass\n")
    assert_error(result, info)
    assert "CPU time limit of 1 s" in result or "wall-clock limit" in result
    assert elapsed < KILL_BOUND


def test_sleeping_forever_hits_the_wall_clock_limit(env: MathToolEnv) -> None:
    result, info, elapsed = run(env, "import time\nprint('start', flush=True)\ntime.sleep(600)\n")
    assert_error(result, info, "start", "wall-clock limit of 2 s exceeded")
    assert elapsed < KILL_BOUND


@pytest.mark.parametrize(
    "code",
    ["x = bytearray(10**10)\n", "a = []\nwhile True:\n    a.append(bytearray(10**7))\n"],
)
def test_memory_bomb_raises_memory_error(env: MathToolEnv, code: str) -> None:
    result, info, elapsed = run(env, code)
    assert_error(result, info, "MemoryError", "memory limit: 128 MiB")
    assert elapsed < KILL_BOUND


def test_100_mb_of_output_is_cut_and_killed(env: MathToolEnv) -> None:
    code = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)\n"
    result, info, elapsed = run(env, code)
    assert_error(result, info, "output exceeded 4096 bytes")
    assert len(result) < env.toolbox.max_result_chars + 200
    assert elapsed < KILL_BOUND


def test_writes_outside_the_working_directory_fail_and_leave_nothing(
    env: MathToolEnv, tmp_path: Path
) -> None:
    targets = [tmp_path / "escaped.txt", Path("/tmp") / f"agentgym-escape-{os.getpid()}"]
    targets.append(Path(__file__).with_name(f"escaped-{os.getpid()}.py"))
    code = "import os\nfor path in %r:\n" % [str(t) for t in targets]
    code += (
        "    try:\n        os.makedirs(os.path.dirname(path), exist_ok=True)\n"
        "        open(path, 'w').write('x')\n        print('wrote', path)\n"
        "    except OSError as exc:\n        print('refused', path, type(exc).__name__)\n"
        "open('/usr/agentgym-escape', 'w')\n"
    )
    result, info, _ = run(env, code)
    assert_error(result, info, "Read-only file system")
    assert [t for t in targets if t.exists()] == []
    assert not Path("/usr/agentgym-escape").exists()


def test_the_parents_environment_is_invisible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = f"agentgym-secret-{os.getpid()}"
    monkeypatch.setenv("AGENTGYM_TEST_SECRET", secret)
    pool = WorkerPool(1)  # zygotes started now, with the secret in our environment
    monkeypatch.setattr(pool_module, "_DEFAULT_POOL", pool)
    try:
        env = MathToolEnv(cpu_seconds=1, wall_seconds=WALL_SECONDS, isolation="namespaces")
        code = (
            "import os, glob\nprint(dict(os.environ))\n"
            f"for path in glob.glob('/proc/*/environ') + ['/proc/{os.getpid()}/environ']:\n"
            "    try:\n        print(path, open(path, 'rb').read())\n"
            "    except OSError as exc:\n        print(path, exc)\n"
        )
        result, info, _ = run(env, code)
    finally:
        pool.close()
    assert info["action_is_valid"] is True
    assert secret not in result and "AGENTGYM_TEST_SECRET" not in result


def test_no_connection_reaches_a_listener_on_localhost(env: MathToolEnv) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        result, info, _ = run(env, code)
        assert_error(result, info, "OSError")
        listener.settimeout(0.5)
        with pytest.raises(TimeoutError):
            listener.accept()


def test_signals_cannot_reach_the_parent(env: MathToolEnv) -> None:
    code = (
        "import os, signal\n"
        f"for pid in ({os.getpid()}, {os.getppid()}, os.getppid()):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n        print('sent', pid)\n"
        "    except OSError as exc:\n        print(pid, type(exc).__name__)\n"
        "os.kill(0, signal.SIGKILL)\n"  # its own process group
    )
    result, info, _ = run(env, code)
    assert_error(result, info, "killed by signal SIGKILL")  # it only killed itself
    result, info, _ = run(env, "print(6 * 7)")  # the env and its pool still work
    assert result.strip() == "42" and info["action_is_valid"] is True


def test_deep_recursion_is_an_error_result(env: MathToolEnv) -> None:
    code = "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n"
    result, info, elapsed = run(env, code)
    assert_error(result, info)
    assert elapsed < KILL_BOUND


def test_ctypes_segfault_is_an_error_result(env: MathToolEnv) -> None:
    result, info, _ = run(env, "import ctypes\nctypes.string_at(0)\n")
    assert_error(result, info, "killed by signal SIGSEGV")


def test_ctypes_cannot_undo_the_confinement(env: MathToolEnv) -> None:
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "MS_REMOUNT, MS_BIND = 32, 4096\n"
        "print('remount', libc.mount(None, b'/usr', None, MS_REMOUNT | MS_BIND, None))\n"
        "print('unshare', libc.unshare(0x10000000 | 0x00020000))\n"  # new user + mount ns
        "print('remount', libc.mount(None, b'/usr', None, MS_REMOUNT | MS_BIND, None))\n"
        "print('umount', libc.umount2(b'/usr', 2))\n"
        "print('setuid', libc.setuid(0))\n"
        "open('/usr/agentgym-escape', 'w')\n"
    )
    result, info, _ = run(env, code)
    assert_error(result, info, "Read-only file system")
    assert "remount -1" in result and "umount -1" in result and "setuid -1" in result
    assert not Path("/usr/agentgym-escape").exists()


def test_calls_of_one_turn_run_concurrently_and_in_order(env: MathToolEnv) -> None:
    env.reset(seed=0)
    code = "import time\nstart = time.time()\ntime.sleep(1)\nprint({i}, start, time.time())"
    turn = "".join(format_call("python", {"code": code.format(i=i)}) for i in range(2))
    *_, info = env.step(turn)
    spans = [tuple(map(float, r.split())) for r in info["tool_results"]]
    assert [int(s[0]) for s in spans] == [0, 1]
    if pool_module.default_pool().max_workers >= 2:
        assert spans[0][1] < spans[1][2] and spans[1][1] < spans[0][2]  # the two overlapped


def test_a_one_worker_pool_runs_calls_one_at_a_time() -> None:
    pool = WorkerPool(1)
    try:
        sandbox = PythonSandbox(isolation="namespaces", pool=pool)
        code = "import time\nstart = time.time()\ntime.sleep(0.2)\nprint(start, time.time())"
        spans = [tuple(map(float, r.output.split())) for r in sandbox.run_many([code] * 3)]
    finally:
        pool.close()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_without_namespaces_the_sandbox_refuses_unless_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    failed = python_module.IsolationReport(False, "unshare: EPERM")
    monkeypatch.setattr(python_module, "probe_isolation", lambda command: failed)
    with pytest.raises(SandboxUnavailableError, match="unshare: EPERM"):
        PythonSandbox()
    with pytest.raises(SandboxUnavailableError, match="allow_no_network_isolation=True"):
        MathToolEnv(isolation="namespaces", allow_no_network_isolation=True)
    with pytest.raises(SandboxUnavailableError):
        PythonSandbox(isolation="none")
    sandbox = PythonSandbox(allow_no_network_isolation=True)
    assert sandbox.isolation == "none"
    result = sandbox.run("import os\nprint(sorted(os.environ))")
    assert result.ok and result.output.strip() == "['HOME', 'PATH', 'TMPDIR']"


def test_site_packages_are_importable_only_when_allowed() -> None:
    code = "import numpy\nprint(numpy.__name__)"
    assert "ModuleNotFoundError" in PythonSandbox().run(code).output
    result = PythonSandbox(site_packages=True).run(code)
    assert (result.ok, result.output.strip()) == (True, "numpy")


def test_bad_configuration_raises() -> None:
    with pytest.raises(ValueError, match="isolation='chroot'"):
        PythonSandbox(isolation="chroot")
    with pytest.raises(ValueError, match="memory_mb must be >= 64"):
        SandboxLimits(memory_mb=8)
    with pytest.raises(ValueError, match="Did you mean 'modpow'"):
        MathToolEnv(problems=["modpw"])
