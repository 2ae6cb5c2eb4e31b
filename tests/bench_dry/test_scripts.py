"""The benchmark scripts of ``benchmarks/`` with ``--dry-run``: tiny sizes; what each
times runs, and its figures and table come out right (never how fast)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from tests.bench_dry.runner import run_script


def test_dynamic_batching_figures(tmp_path: Path) -> None:
    done = run_script("dynamic_batching_figures")
    assert done.stdout.startswith("16 samples")
    rows = {
        r[0]: (int(r[1]), int(r[2]))
        for r in re.findall(r"\| (.+?) \| (\d+) \| (\d+) \|", done.stdout)
    }
    assert len(rows) == 5
    assert rows["every row padded to 8192"][0] == 16  # one micro-batch a row
    assert rows["dynamic: 8192 tokens, round 1"][1] < rows["fixed: 2 rows, trimmed"][1]


def test_compare_sandbox_latency(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = run_script("compare_sandbox_latency", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["meta"]["calls"] == 5  # every call's output was checked
    assert len(report["figures"]) == 3
    assert all(
        row["p50_ms"] > 0 and row["concurrent_calls_per_s"] > 0
        for row in report["figures"].values()
    )
    assert "sandbox, zygote per worker" in done.stdout


def test_partial_rollout_bench(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = run_script("partial_rollout_bench", "--json", str(out))
    figures = json.loads(out.read_text())
    assert list(figures) == ["drain", "regenerate", "continue"]
    assert figures["drain"]["aborted"] == figures["drain"]["continued"] == 0
    assert figures["drain"]["generated_per_kept_token"] == 1  # nothing thrown away
    assert figures["continue"]["aborted"] == 0  # stopped pieces go on, none restarts
    assert all(f["responses_per_s"] > 0 for f in figures.values())
    assert "8 episodes, 2 syncs" in done.stdout


def test_webshop_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    run_script("webshop_figures", "--json", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    assert row["num_products"] == 200
    assert row["oracle_success"] == 1.0  # the oracle buys every goal's product
    assert row["recall_at_50"] > 0.5
    assert row["search_p50_ms"] > 0


def test_rollout_figures() -> None:
    done = run_script("rollout_figures")
    rows = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)$", done.stdout, re.MULTILINE)
    assert [int(r[0]) for r in rows] == [1, 8]
    assert re.search(r"tokens/s: HF [1-9]\d* \(dry run: vLLM skipped\)", done.stdout)


def test_compare_sokoban_generation() -> None:
    done = run_script("compare_sokoban_generation")  # exits 1 on a room not solved as claimed
    tables = re.findall(r"^== .+ ==", done.stdout, re.MULTILINE)
    assert len(tables) == 3
    if importlib.util.find_spec("gym_sokoban") is None:  # ours alone (the anchor is not in CI)
        assert done.stdout.count("ours: 2 rooms") == 3
        assert done.stdout.count("claimed != solver length 0") == 3


def test_lora_figures(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = run_script("lora_figures", "--json", str(out))
    rows = json.loads(out.read_text())
    assert list(rows) == ["tiny/full", "tiny/lora"]
    full, lora = rows["tiny/full"], rows["tiny/lora"]
    assert full["trainable"] == full["parameters"]
    assert 0 < lora["trainable"] < full["trainable"] / 5
    assert 0 < lora["optimizer_mib"] < full["optimizer_mib"]
    assert done.stdout.count("| tiny |") == 2
