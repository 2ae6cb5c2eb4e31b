"""The training benchmarks (``async_generation_ratio``, decoupled explorer and trainer),
dry: two steps of the tiny model a run, the trainer's gradient checked non-zero."""

from __future__ import annotations

import pytest

from tests.bench_dry.runner import run_module


@pytest.mark.parametrize("module", ["test_async_benchmark", "test_decoupled_benchmark"])
def test_training_benchmark_runs_dry(module: str) -> None:
    assert run_module(module)["passed"] == 2  # ratios 0 and 1; sync and decoupled
