"""benchmarks/proxy_bench.py in its dry mode: what it times works (not how fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "proxy_bench.py"


def test_the_proxy_benchmark_runs_dry(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    command = [sys.executable, str(SCRIPT), "--dry-run", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    costs = figures["request_cost"]
    assert [c["sessions"] for c in costs] == [1, 4]
    assert all(c["cpu_ms_per_request"] > 0 and c["app_p50_ms"] > 0 for c in costs)
    rates = figures["episodes_per_second"]
    assert len(rates["own"]) == len(rates["proxy"]) == 1 and rates["ratio"] > 0
    assert "episodes/s, in process" in done.stdout
