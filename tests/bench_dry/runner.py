"""Run a benchmark dry: a pytest-benchmark module under ``--benchmark-disable`` with
``AGENTGYM_BENCH_DRY=1``, or a script with ``--dry-run``."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.forkserver import run_python

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def run_module(name: str, timeout: float = 600) -> dict[str, int]:
    """``python -m pytest benchmarks/<name>.py --benchmark-disable`` dry, from the
    repository root (so ``benchmarks/pytest.ini`` applies); the outcome counts of its
    summary line (``passed``, ``skipped``, ...), after checking that none failed."""
    command = ["-m", "pytest", f"benchmarks/{name}.py", "--benchmark-disable",
               "-p", "no:cacheprovider", "-q", "-rs"]  # fmt: skip
    env = {**os.environ, "AGENTGYM_BENCH_DRY": "1"}
    done = run_python(command, cwd=ROOT, env=env, timeout=timeout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    assert counts.get("passed", 0) > 0, done.stdout[-2000:]
    return counts


def run_script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python benchmarks/<name>.py --dry-run <args>`` from the repository root, run as
    ``python -m <name>`` with ``benchmarks/`` on the path (the scripts import their
    sibling modules), so the forkserver spares it torch's imports; checks it exits 0."""
    path = os.pathsep.join(p for p in (str(BENCHMARKS), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    done = run_python(["-m", name, "--dry-run", *args], cwd=ROOT, env=env, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-4000:]
    return done
