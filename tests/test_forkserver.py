"""The fork server runs ``python -m`` commands as a fresh interpreter would: folder,
environment, streams, ``sys.path``, exit status, atexit handlers, signals, and fresh
agentgym modules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.forkserver import Forked, run_python, server, start_python

PROBE = """
import atexit, json, os, sys, threading, time

state = {
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "pid": os.getpid(),
    "stdin": sys.stdin.read(), "flag": os.environ.get("PROBE_FLAG"),
    "agentgym_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "agentgym"),
    "torch_loaded": "torch" in sys.modules, "main": __name__,
    "late_loaded": sorted(m for m in ("vllm", "ray") if m in sys.modules),
}
print(json.dumps(state))
print("to stderr", file=sys.stderr)

def late():  # a non-daemon thread the interpreter waits for, then an atexit handler
    time.sleep(0.2)
    open("thread-done", "w").close()

threading.Thread(target=late).start()
atexit.register(lambda: open("atexit-done", "w").close())
if len(sys.argv) > 1:
    if sys.argv[1] == "raise":
        raise ValueError("the probe failed")
    if sys.argv[1] == "sleep":
        open("sleeping", "w").write(str(os.getpid()))
        time.sleep(60)
    sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    (tmp_path / "probe_module.py").write_text(PROBE)
    return tmp_path


def test_a_command_sees_its_folder_arguments_input_and_environment(probe: Path) -> None:
    env = {**os.environ, "PROBE_FLAG": "on"}
    result = run_python(["-m", "probe_module"], cwd=probe, env=env, input="typed")
    assert result.returncode == 0, result.stderr
    state = json.loads(result.stdout)
    assert state["argv"] == [str(probe / "probe_module.py")]  # as python -m sets it
    assert state["cwd"] == state["path0"] == str(probe)
    assert state["stdin"] == "typed" and state["flag"] == "on" and state["main"] == "__main__"
    assert state["torch_loaded"]  # preloaded: the point of the server
    assert state["agentgym_loaded"] == []  # agentgym's own modules start fresh
    assert state["late_loaded"] == []  # agentgym sets their import-time variables first
    assert state["pid"] != server().process.pid
    assert result.stderr == "to stderr\n"
    assert (probe / "thread-done").exists() and (probe / "atexit-done").exists()


@pytest.mark.parametrize(("argument", "code"), [("0", 0), ("3", 3), ("raise", 1)])
def test_exit_status_is_the_interpreters(probe: Path, argument: str, code: int) -> None:
    result = run_python(["-m", "probe_module", argument], cwd=probe)
    assert result.returncode == code
    if argument == "raise":
        assert "ValueError: the probe failed" in result.stderr
        assert result.stderr.lstrip().startswith("to stderr\nTraceback")
    assert (probe / "atexit-done").exists()  # atexit runs on every way out


def test_pythonpath_entries_are_importable_as_in_a_fresh_interpreter(
    probe: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    (elsewhere / "placed.py").write_text("import sys; print(sys.path.index(sys.argv[1]))\n")
    env = {**os.environ, "PYTHONPATH": str(probe)}
    result = run_python(["-m", "placed", str(probe)], cwd=elsewhere, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"  # after the folder, before site-packages
    without = run_python(["-m", "probe_module"], cwd=elsewhere)
    assert without.returncode == 1 and "No module named probe_module" in without.stderr


def test_an_import_time_variable_gets_a_fresh_interpreter(probe: Path) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1" if os.environ.get("OMP_NUM_THREADS") != "1" else "2",
    }
    assert not server().compatible(env)
    result = run_python(["-m", "probe_module"], cwd=probe, env=env)
    assert result.returncode == 0, result.stderr
    assert not json.loads(result.stdout)["torch_loaded"]  # nothing was preloaded


def test_what_library_code_sets_at_run_time_keeps_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # in-process tests leave these in the test process's environment (vLLM's in-process
    # engine, ray.init, the Ray cluster's loopback binding, torch's NCCL group)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/inductor")  # vLLM's CPU engine
    monkeypatch.setenv("LD_PRELOAD", "libtcmalloc_minimal.so.4")  # its workers' allocator
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # benchmarks.gpu
    assert server().compatible(os.environ)


def test_a_timeout_kills_the_command(probe: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["-m", "probe_module", "sleep"], cwd=probe, timeout=5)
    with pytest.raises(ProcessLookupError):  # killed and reaped before the raise
        os.kill(int((probe / "sleeping").read_text()), 0)


def test_a_started_command_takes_signals_as_a_process(probe: Path) -> None:
    log = probe / "probe.log"
    process = start_python(["-m", "probe_module", "sleep"], cwd=probe, output=log)
    assert isinstance(process, Forked)
    deadline = time.monotonic() + 60
    while "to stderr" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == -signal.SIGTERM
    assert json.loads(log.read_text().splitlines()[0])["pid"] == process.pid
