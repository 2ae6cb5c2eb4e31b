"""The benchmarks that start a Ray cluster, dry (with the other Ray tests, never beside
them: tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.bench_dry.runner import run_module

pytestmark = pytest.mark.ray


def test_env_workers_benchmark_runs_dry() -> None:
    # two tool costs, the WebShop oracle, the manager in process and on env workers
    assert run_module("test_env_workers_benchmark")["passed"] == 5


def test_weight_sync_benchmark_runs_dry() -> None:
    # the tiny model to two HF engines: synced, the engines' logprobs then match
    assert run_module("test_weight_sync_benchmark")["passed"] == 1
