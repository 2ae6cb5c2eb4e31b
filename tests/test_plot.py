"""The validation plot: tick values, metrics reading and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from agentgym.plot import (
    TRAINING_COLOR,
    TREND_COLOR,
    VALIDATION_COLOR,
    ValidationPanel,
    moving_mean,
    nice_ticks,
    plot_curves,
    plot_validation,
    read_metrics,
    validation_panels,
)


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [
        (0.13, 0.41, [0.1, 0.2, 0.3, 0.4, 0.5]),
        (0, 40, [0, 10, 20, 30, 40]),
        (-1.2, 3.7, [-2, 0, 2, 4]),
        (5, 5, [4.5, 5, 5.5]),  # a flat curve gets a unit range around it
        (-0.4, -0.39999999999999997, [-1, -0.5, 0, 0.5]),  # flat up to float noise
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


def test_read_metrics_skips_and_counts_lines_that_are_not_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        '{"step": 1, "val/all/success": 0.25}\n'
        '{"step": 2, "val/all/success": 0.5}{"step": 2, "val/all/suc\n'  # two writers' lines
        '{"step": 3, "val/all/success": "n/a"}\n'  # not a number
        '{"val/all/success": 0.9}\n'  # no step
        '{"step": 4, "val/all/success": 0.75}\n'
        '{"step": 5, "val/all/succ'  # cut short by a kill
    )
    assert read_metrics(path, ["val/all/success"]) == {
        "val/all/success": [(1.0, 0.25), (4.0, 0.75)]
    }
    assert "skipped 4 line(s) that are not metrics records (line 2, 3, 4, 6)" in (
        capsys.readouterr().err
    )


def colors(png: Path) -> set[tuple[int, ...]]:
    pixels = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3)
    return {tuple(color) for color in np.unique(pixels, axis=0).tolist()}


def test_plot_validation_draws_training_per_step_beside_the_validation_points(
    tmp_path: Path,
) -> None:
    records: list[dict[str, float]] = [{"step": 0, "val/all/success": 0.2, "val/all/score": 0.0}]
    for s in range(1, 25):
        records.append({"step": s, "train/all/success": s / 100, "train/all/score": s / 10})
        if s % 12 == 0:
            records.append({"step": s, "val/all/success": 0.2 + s / 100, "val/all/score": s / 10})
    path = write_metrics(tmp_path / "metrics.jsonl", records)

    success, score = validation_panels(path)
    assert success == ValidationPanel(
        "success",
        training=[(float(s), s / 100) for s in range(1, 25)],
        validation=[(0.0, 0.2), (12.0, 0.32), (24.0, 0.44)],
    )
    assert score.title == "mean score" and score.validation == [
        (0.0, 0.0),
        (12.0, 1.2),
        (24.0, 2.4),
    ]

    png = plot_validation(path, tmp_path / "out" / "validation.png")
    assert png == tmp_path / "out" / "validation.png"
    assert Image.open(png).size == (960, 360)
    # each series in its own colour: the validation points, the training steps, their mean
    assert {VALIDATION_COLOR, TRAINING_COLOR, TREND_COLOR} <= colors(png)


def test_the_older_training_keys_are_read_too(tmp_path: Path) -> None:
    path = write_metrics(
        tmp_path / "metrics.jsonl",
        [{"step": 1, "train/success": 0.5, "train/score": 2.0}, {"step": 2, "train/success": 1}],
    )
    success, score = validation_panels(path)
    assert success.training == [(1.0, 0.5), (2.0, 1.0)] and success.validation == []
    assert score.training == [(1.0, 2.0)]


def test_a_run_without_validation_plots_its_training_curve(tmp_path: Path) -> None:
    path = write_metrics(tmp_path / "metrics.jsonl", [{"step": 1, "train/all/success": 0.5}])
    png = plot_validation(path, tmp_path / "validation.png")
    assert png is not None
    assert Image.open(png).size == (480, 360)  # success only: no score was logged
    assert TRAINING_COLOR in colors(png) and VALIDATION_COLOR not in colors(png)


def test_plot_validation_without_either_metric_writes_nothing(tmp_path: Path) -> None:
    path = write_metrics(tmp_path / "metrics.jsonl", [{"step": 1, "actor/pg_loss": 0.5}])
    assert plot_validation(path, tmp_path / "validation.png") is None
    assert not (tmp_path / "validation.png").exists()


def test_moving_mean_is_centred_and_shorter_at_the_ends() -> None:
    points = [(1, 0.0), (2, 3.0), (3, 0.0), (4, 3.0), (5, 6.0)]
    # step 1: (0 + 3) / 2; step 3: (3 + 0 + 3) / 3; step 5: (3 + 6) / 2
    assert moving_mean(points, 3) == [(1, 1.5), (2, 1.0), (3, 2.0), (4, 3.0), (5, 4.5)]
    assert moving_mean(points, 1) == points


def test_plot_curves_draws_one_panel_per_curve(tmp_path: Path) -> None:
    png = plot_curves({"a": [(0, 1.0), (1, 2.0)], "b": [], "c": [(0, 0.0)]}, tmp_path / "x.png")
    assert Image.open(png).size == (960, 360)
    assert VALIDATION_COLOR in colors(png)


def test_plot_curves_refuses_empty_curves(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_curves({"a": []}, tmp_path / "x.png")
