"""benchmarks/limit_bench.py in its dry mode (4 episodes a step, 2 steps): what it times
works, on each engine and in each mode (not how fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "limit_bench.py"


def dry_run(tmp_path: Path, *options: str) -> tuple[list[dict[str, Any]], str]:
    out = tmp_path / "figures.json"
    command = [sys.executable, str(SCRIPT), "--dry-run", "--json", str(out), *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())["rows"], done.stdout


def check_row(row: dict[str, Any]) -> None:
    """A row's figures: the bare parts ran on the step's own work, its breakdown adds
    up to the step."""
    median, bare, shares = row["median"], row["bare"], row["shares"]
    step = median["time/step"]
    # the bare pass trains exactly the samples the step's update trained
    assert row["samples"] == row["kept_samples_logged"] > 0
    assert bare["generation"] > 0 and bare["env"] > 0 and bare["training"] > 0
    assert row["ratio"] == pytest.approx(step / sum(bare.values()))
    # the trainer's side of the breakdown and the bare parts it contains make the step
    trainer = {k: v for k, v in shares.items() if not k.startswith("explorer")}
    inside = bare["training"] + (bare["env"] if row["mode"] == "both" else 0.0)
    assert sum(trainer.values()) + inside == pytest.approx(step, rel=1e-6)
    if row["mode"] == "both":
        assert median["time/engine"] > 0  # timed inside the engine
        assert median["time/engine"] < median["time/rollout"]
    else:
        explorer = row["explorer"]
        assert 0 < explorer["engine"] < explorer["explore_batch"]
        assert explorer["weight_load"] > 0 and median["time/weight_sync"] > 0


def test_the_limit_benchmark_runs_dry_on_hf_in_both_modes(tmp_path: Path) -> None:
    rows, stdout = dry_run(tmp_path, "--engine", "hf")
    assert [(row["engine"], row["mode"]) for row in rows] == [("hf", "both"), ("hf", "decoupled")]
    for row in rows:
        check_row(row)
    assert "| hf | both |" in stdout and "| hf | decoupled |" in stdout


def test_the_limit_benchmark_runs_dry_on_vllm(tmp_path: Path) -> None:
    # vLLM's bare part is its own LLM.generate: one engine start more (~1 min in all)
    if os.environ.get("AGENTGYM_REQUIRE_VLLM") == "1":
        import vllm  # noqa: F401  (an ImportError fails the test in CI)
    else:
        pytest.importorskip("vllm")
    rows, stdout = dry_run(tmp_path, "--engine", "vllm", "--mode", "both")
    assert [(row["engine"], row["mode"]) for row in rows] == [("vllm", "both")]
    check_row(rows[0])
    assert "| vllm | both |" in stdout
