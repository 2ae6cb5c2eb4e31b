"""The pytest-benchmark modules of ``benchmarks/`` that need no Ray, dry: each benchmarked
function runs once, untimed, at the module's dry sizes, with its own assertions."""

from __future__ import annotations

import pytest

from tests.bench_dry.runner import run_module

# module -> tests that pass dry here (the gym-sokoban anchor's tests skip without it)
PASSED = {
    "test_rollout_benchmark": 4,
    "test_extra_prompts_benchmark": 2,
    "test_webshop_benchmark": 3,
    "test_sandbox_latency": 3,
    "test_sokoban_generation": 3,
    "test_new_paths_benchmark": 4,  # GEM: 2 ids × 2 modes (the proxy, http env: elsewhere)
}


@pytest.mark.parametrize("module", list(PASSED))
def test_benchmark_module_runs_dry(module: str) -> None:
    counts = run_module(module)
    assert counts["passed"] >= PASSED[module], counts
