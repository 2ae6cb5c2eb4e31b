"""The benchmark scripts that train (``compare_trl.py``, ``first_run.py``,
``headline.py``) with
``--dry-run``: a model warm-started for 2 steps, one training step."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from tests.bench_dry.runner import run_script


def test_compare_trl(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = run_script("compare_trl", "--json", str(out))
    report = json.loads(out.read_text())
    assert [row["episodes"] for row in report["overhead"]] == [16, 16, 16]
    assert all(row["wall_ms"] > 0 for row in report["overhead"])
    ours = report["runs"]["agentgym"]
    assert len(ours["step_seconds"]) == len(ours["reward"]) == 1
    assert ours["tokens"][0] > 0
    if importlib.util.find_spec("trl") is None:  # the compare extra is not in CI
        assert list(report["runs"]) == ["agentgym"]
        assert "trl is not installed" in done.stdout
    else:
        assert len(report["runs"]["trl"]["reward"]) == 1


def test_first_run() -> None:
    done = run_script("first_run")  # exits 1 unless the run reached its first step
    assert re.search(r"^sokoban: step 1 at \d+ s", done.stdout, re.MULTILINE)
    assert re.search(r"^\| `sokoban` \| \d+ s \|", done.stdout, re.MULTILINE)


def test_headline(tmp_path: Path) -> None:
    out = tmp_path / "headline.json"
    done = run_script("headline", "--json", str(out))
    report = json.loads(out.read_text())
    assert [sorted(run["curve"]) for run in report["runs"]] == [["0", "1"], ["0", "1"]]
    for run in report["runs"]:
        assert 0.0 <= run["start"] <= 1.0 and 0.0 <= run["end"] <= 1.0
        assert (run["start"], run["end"]) == (run["curve"]["0"], run["curve"]["1"])
    assert "| duration without the model cache, s |" in done.stdout
    assert report["machine"]["logical_cpus"] >= 1
