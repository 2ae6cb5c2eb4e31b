"""benchmarks/proxy_bench.py in its dry mode: what it times works (not how fast)."""

from __future__ import annotations

from benchmarks.proxy_bench import main


def test_the_proxy_benchmark_runs_dry() -> None:
    figures = main(["--dry-run"])
    costs = figures["request_cost"]
    assert [c["sessions"] for c in costs] == [1, 4]
    assert all(c["cpu_ms_per_request"] > 0 and c["app_p50_ms"] > 0 for c in costs)
    rates = figures["episodes_per_second"]
    assert len(rates["own"]) == len(rates["proxy"]) == 1 and rates["ratio"] > 0
