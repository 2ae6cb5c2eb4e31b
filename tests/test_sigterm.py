"""SIGTERM (how Slurm, Kubernetes and Ray stop a job before their SIGKILL) ends a run
from every phase within a grace period, with one stderr line saying where it stopped
and how to go on; also with stdout a closed pipe, and with an engine whose close hangs.

Each case is a real ``python -m agentgym.train`` run of a few seconds, started through
tests/sigterm_launcher.py, which lands the signal inside the phase. The cases run
three at a time (one module fixture): about two minutes on two cores.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentgym.stopping import GRACE_SECONDS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

EXIT_WITHIN = 30.0
"""Seconds from the signal to the exit: under Slurm's and Kubernetes' default grace (30 s)."""

SMALL = (
    "env=frozen_lake", "generation=hf", "max_steps=2", "save_steps=1", "eval_steps=1",
    "max_turns=2", "sequence_length=512", "generation.max_new_tokens=6",
    "train_env_manager.env_groups=2", "train_env_manager.group_size=2",
    "rollout_batch_size=4", "val_batch_size=4", "val_env_manager.env_groups=4",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=1",
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    """A run stopped in ``phase``; ``step`` is the step its line names, ``checkpoint``
    the last complete checkpoint then (None: none yet)."""

    phase: str
    step: int
    checkpoint: str | None = None
    closed_stdout: bool = False
    hang_engine_close: bool = False
    second_signal: bool = False


CASES = {
    "model build": Case("model build", 0),
    "engine start": Case("engine start", 0),
    "validation": Case("validation", 0),
    "policy update": Case("policy update", 1),
    "checkpoint": Case("checkpoint", 2, "checkpoint-1"),
    "weight sync": Case("weight sync", 1),
    # the reader of stdout is gone before the run prints its first line
    "closed stdout": Case("checkpoint", 2, "checkpoint-1", closed_stdout=True),
    # the engine's close never returns: the grace period's watchdog ends the run
    "hung close": Case("policy update", 1, hang_engine_close=True),
    # ... and a second SIGTERM ends it at once
    "second signal": Case("policy update", 1, hang_engine_close=True, second_signal=True),
}


@dataclass(frozen=True)
class Stopped:
    """How a run ended: exit code (None: killed by the test), stderr, and seconds from
    the (first) signal to the exit (None: the signal never came)."""

    output: Path
    arguments: tuple[str, ...]
    returncode: int | None
    stderr: str
    seconds: float | None


def stop(case: Case, root: Path, model: Path) -> Stopped:
    """Run ``case`` to its end; kill it if it outlives the signal by :data:`EXIT_WITHIN` s."""
    root.mkdir()
    output, mark = root / "run", root / "signal-sent"
    arguments = (*SMALL, f"model.path={model}", f"output_dir={output}")
    flags = ("--hang-engine-close",) if case.hang_engine_close else ()
    environment = {**os.environ, "PYTHONPATH": str(REPO), "SIGTERM_LAUNCHER_MARK": str(mark)}
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.sigterm_launcher", case.phase, *flags, *arguments],
        cwd=root, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    if case.closed_stdout:
        process.stdout.close()
    deadline = time.monotonic() + 240
    while not mark.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not mark.exists():  # ended (or stuck) before the phase
        process.kill()
        _, stderr = process.communicate()
        return Stopped(output, arguments, process.returncode, stderr, None)
    sent = float(mark.read_text())
    if case.second_signal:
        time.sleep(2)
        process.send_signal(signal.SIGTERM)
    try:
        _, stderr = process.communicate(timeout=max(sent + EXIT_WITHIN - time.time(), 0.1))
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        return Stopped(output, arguments, None, stderr, time.time() - sent)
    return Stopped(output, arguments, process.returncode, stderr, time.time() - sent)


@pytest.fixture(scope="module")
def stopped(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Stopped]:
    root = tmp_path_factory.mktemp("sigterm")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            name: pool.submit(stop, case, root / name.replace(" ", "-"), tiny_model_dir)
            for name, case in CASES.items()
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_sigterm_ends_the_run_with_one_line_saying_where_and_how_to_go_on(
    stopped: dict[str, Stopped], name: str
) -> None:
    case, run = CASES[name], stopped[name]
    assert run.seconds is not None, f"ended before the signal: {run.returncode} {run.stderr}"
    assert run.returncode is not None, f"no exit within {EXIT_WITHIN} s of SIGTERM: {run.stderr}"
    assert run.returncode == 143, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1, run.stderr[-3000:]
    (line,) = lines
    assert line.startswith(f"interrupted at step {case.step} ({case.phase}) by SIGTERM; "), line
    command = f"python -m agentgym.train {' '.join(run.arguments)}"
    if case.checkpoint is None:
        assert f"; no checkpoint yet; start again with: {command}" in line
    else:
        checkpoint = run.output / "checkpoints" / case.checkpoint
        assert (checkpoint / "COMPLETE").is_file()
        assert line.endswith(
            f"; last checkpoint: {checkpoint}; resume with: {command} resume_from_checkpoint=true"
        ), line


def test_a_closed_stdout_does_not_end_the_run_its_lines_go_to_train_log(
    stopped: dict[str, Stopped],
) -> None:
    # the run went on to the checkpoint of step 2, printing all along into the
    # closed pipe; its console lines are in train.log
    run = stopped["closed stdout"]
    log = (run.output / "train.log").read_text()
    assert "(stdout is a closed pipe: the run goes on, its lines only here)" in log
    assert "step 1/2 |" in log and "val  1/2 |" in log
    assert "BrokenPipeError" not in run.stderr


def test_a_second_sigterm_does_not_wait_for_the_grace_period(
    stopped: dict[str, Stopped],
) -> None:
    hung, hurried = stopped["hung close"], stopped["second signal"]
    assert hung.returncode == hurried.returncode == 143
    assert hung.seconds is not None and hurried.seconds is not None
    # with the engine's close hung, only the watchdog ends the first run, after its grace
    # period; the second signal ends the other before that
    assert hung.seconds >= GRACE_SECONDS > hurried.seconds
    log = (hung.output / "train.log").read_text()
    assert f"did not end within {GRACE_SECONDS:g} s: stopped by force" in log
    assert "thread close generation backend:" in log and "time.sleep(3600)" in log
