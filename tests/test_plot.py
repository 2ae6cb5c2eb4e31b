"""The validation plot: tick values, metrics reading and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from agentgym.plot import nice_ticks, plot_curves, plot_validation, read_metrics


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [
        (0.13, 0.41, [0.1, 0.2, 0.3, 0.4, 0.5]),
        (0, 40, [0, 10, 20, 30, 40]),
        (-1.2, 3.7, [-2, 0, 2, 4]),
        (5, 5, [4.5, 5, 5.5]),  # a flat curve gets a unit range around it
    ],
)
def test_nice_ticks(low: float, high: float, ticks: list[float]) -> None:
    assert nice_ticks(low, high) == pytest.approx(ticks)


def write_metrics(path: Path, records: list[dict[str, float]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_read_metrics_keeps_the_last_value_of_a_step(tmp_path: Path) -> None:
    path = write_metrics(
        tmp_path / "metrics.jsonl",
        [
            {"step": 0, "val/all/success": 0.2},
            {"step": 1, "train/all/success": 0.5},
            {"step": 2, "val/all/success": 0.3},
            {"step": 2, "val/all/success": 0.35},  # logged again by a resumed run
        ],
    )
    assert read_metrics(path, ["val/all/success", "missing"]) == {
        "val/all/success": [(0.0, 0.2), (2.0, 0.35)],
        "missing": [],
    }


def test_plot_validation_draws_both_panels(tmp_path: Path) -> None:
    path = write_metrics(
        tmp_path / "metrics.jsonl",
        [
            {"step": s, "val/all/success": 0.2 + s / 100, "val/all/score": s / 10}
            for s in (0, 10, 20)
        ],
    )
    png = plot_validation(path, tmp_path / "out" / "validation.png")
    assert png == tmp_path / "out" / "validation.png"
    image = Image.open(png).convert("RGB")
    assert image.size == (960, 360)
    colors = {color for _, color in image.getcolors(maxcolors=1 << 16) or []}
    assert (31, 119, 180) in colors  # the curves' blue


def test_plot_validation_without_validation_metrics_writes_nothing(tmp_path: Path) -> None:
    path = write_metrics(tmp_path / "metrics.jsonl", [{"step": 1, "train/all/success": 0.5}])
    assert plot_validation(path, tmp_path / "validation.png") is None
    assert not (tmp_path / "validation.png").exists()


def test_plot_curves_refuses_empty_curves(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_curves({"a": []}, tmp_path / "x.png")
