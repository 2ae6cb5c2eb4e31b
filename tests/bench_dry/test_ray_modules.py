"""The benchmarks that start a Ray cluster, dry (with the other Ray tests, never beside
them: tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_dry.runner import run_module, run_script

WORKERS = 2
"""benchmarks/env_workers_bench.py's env workers."""

pytestmark = pytest.mark.ray


def test_env_workers_benchmark_runs_dry() -> None:
    # a tool env, the WebShop oracle, the manager in process and on env workers
    assert run_module("test_env_workers_benchmark")["passed"] == 4


def test_weight_sync_benchmark_runs_dry() -> None:
    # the tiny model to an HF engine: synced, the engine's logprobs then match the trainer's
    assert run_module("test_weight_sync_benchmark")["passed"] == 1


def test_scale_bench_runs_dry(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = run_script("scale_bench", "--json", str(out))
    figures = json.loads(out.read_text())["figures"]
    assert list(figures) == ["in process", f"{WORKERS} env workers"]
    for rows in figures.values():  # every episode played all its turns (checked inside)
        assert list(rows) == ["8", "16"]
        assert all(row["ms_per_env_turn"] > 0 for row in rows.values())
    assert "| in process | 16 |" in done.stdout
