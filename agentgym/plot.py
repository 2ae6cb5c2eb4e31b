"""Draw training curves to a PNG with Pillow (no plotting library needed).

:func:`plot_validation` reads what the stdout tracker writes to
``metrics.jsonl`` and draws success and mean score over the training steps,
one panel each: the training rollouts' value at every step as a thin line, and
the validation checkpoints as a thick line with dots, so that a person sees
the training trend and the validation points together.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

Series = Sequence[tuple[float, float]]
"""Points ``(x, y)`` of one curve, in order of x."""

Color = tuple[int, int, int]

_PANEL = (480, 360)  # width, height of one panel in pixels
_MARGIN = (70, 20, 50, 56)  # left, right, bottom, top inside a panel
_INSET = 6  # pixels between the frame and the first and last ticks
_INK, _GRID = (40, 40, 40), (225, 225, 225)
VALIDATION_COLOR: Color = (31, 119, 180)
"""The validation curves' blue."""
TRAINING_COLOR: Color = (253, 190, 133)
"""The training curves' light orange (each step)."""
TREND_COLOR: Color = (230, 85, 13)
"""The training trend's dark orange (a moving mean)."""


@dataclass(frozen=True)
class Curve:
    """One line of a panel.

    Attributes:
        label: Its name in the panel's legend.
        points: ``(step, value)`` in order of step.
        color: RGB.
        width: Line width in pixels.
        dots: Mark each point with a dot.
    """

    label: str
    points: Series
    color: Color = VALIDATION_COLOR
    width: int = 2
    dots: bool = True


@dataclass(frozen=True)
class PanelSpec:
    """Which metrics one panel of :func:`plot_validation` draws.

    Attributes:
        title: The panel's title.
        validation: The validation metric's key.
        training: Keys of the per-step training metric; the first one logged is drawn.
    """

    title: str
    validation: str
    training: tuple[str, ...]


VALIDATION_PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("success", "val/all/success", ("train/all/success", "train/success")),
    PanelSpec("mean score", "val/all/score", ("train/all/score", "train/score")),
)
"""The panels of :func:`plot_validation`."""


def read_metrics(
    metrics_file: str | Path, keys: Sequence[str]
) -> dict[str, list[tuple[float, float]]]:
    """``{key: [(step, value), ...]}`` for ``keys`` from a ``metrics.jsonl`` file.

    A step logged twice (a resumed run) keeps its last value; keys never
    logged map to an empty list. A line that is not a metrics record (cut short by
    a kill, or two writers' lines run together) is skipped, and the skipped lines
    are counted in one line on stderr.
    """
    found: dict[str, dict[float, float]] = {key: {} for key in keys}
    skipped: list[int] = []
    lines = Path(metrics_file).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = float(record["step"])
            values = {key: float(record[key]) for key in keys if key in record}
        except (ValueError, TypeError, KeyError):
            skipped.append(number)
            continue
        for key, value in values.items():
            found[key][step] = value
    if skipped:
        shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
        print(
            f"{metrics_file}: skipped {len(skipped)} line(s) that are not metrics records "
            f"(line {shown})",
            file=sys.stderr,
        )
    return {key: sorted(points.items()) for key, points in found.items()}


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 × 10^k) that cover ``[low, high]``.

    >>> nice_ticks(0.13, 0.41)
    [0.1, 0.2, 0.3, 0.4, 0.5]
    """
    if high - low <= 1e-9 * max(1.0, abs(low), abs(high)):
        # flat, up to float noise (a mean of -0.4 written as -0.39999999999999997)
        low, high = low - 0.5, high + 0.5
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step + 1e-9) * step
    ticks = [first]
    while ticks[-1] < high - 1e-9:
        ticks.append(ticks[-1] + step)
    digits = max(0, -math.floor(math.log10(step) + 1e-9))
    return [round(t, digits) for t in ticks]


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1e-9 else "0"


def _panel(curves: Sequence[Curve], title: str, x_label: str) -> Image.Image:
    """One panel: title, legend, axes, grid, ticks and the curves (the first drawn first)."""
    image = Image.new("RGB", _PANEL, "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=13)
    left, right, bottom, top = _MARGIN
    x0, y0, x1, y1 = left, top, _PANEL[0] - right, _PANEL[1] - bottom
    draw.text((x0, 8), title, fill=_INK, font=font)
    legend_x = x0
    for curve in curves if len(curves) > 1 else ():
        draw.line([(legend_x, 33), (legend_x + 20, 33)], fill=curve.color, width=curve.width)
        if curve.dots:
            draw.ellipse([legend_x + 7, 30, legend_x + 13, 36], fill=curve.color)
        draw.text((legend_x + 26, 33), curve.label, fill=_INK, font=font, anchor="lm")
        legend_x += 36 + int(draw.textlength(curve.label, font=font))
    points = [point for curve in curves for point in curve.points]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))

    def to_pixel(x: float, y: float) -> tuple[float, float]:
        # _INSET keeps a curve on the first or last tick clear of the frame
        px = x0 + _INSET + (x - x_ticks[0]) / (x_ticks[-1] - x_ticks[0]) * (x1 - x0 - 2 * _INSET)
        py = y1 - _INSET - (y - y_ticks[0]) / (y_ticks[-1] - y_ticks[0]) * (y1 - y0 - 2 * _INSET)
        return px, py

    for tick in y_ticks:
        _, py = to_pixel(x_ticks[0], tick)
        draw.line([(x0, py), (x1, py)], fill=_GRID)
        draw.text((x0 - 6, py), _label(tick), fill=_INK, font=font, anchor="rm")
    for tick in x_ticks:
        px, _ = to_pixel(tick, y_ticks[0])
        draw.line([(px, y1), (px, y1 + 4)], fill=_INK)
        draw.text((px, y1 + 6), _label(tick), fill=_INK, font=font, anchor="ma")
    draw.rectangle([x0, y0, x1, y1], outline=_INK)
    draw.text(((x0 + x1) / 2, _PANEL[1] - 18), x_label, fill=_INK, font=font, anchor="ma")
    for curve in curves:
        pixels = [to_pixel(x, y) for x, y in curve.points]
        if len(pixels) > 1:
            draw.line(pixels, fill=curve.color, width=curve.width)
        for px, py in pixels if curve.dots or len(pixels) == 1 else ():
            draw.ellipse([px - 3, py - 3, px + 3, py + 3], fill=curve.color)
    return image


def _save(panels: Sequence[Image.Image], path: str | Path) -> Path:
    image = Image.new("RGB", (_PANEL[0] * len(panels), _PANEL[1]), "white")
    for index, panel in enumerate(panels):
        image.paste(panel, (index * _PANEL[0], 0))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def _span(name: str, points: Series) -> str:
    (first_x, first), (last_x, last) = points[0], points[-1]
    return f"{name} {first:.3g} at step {first_x:g}, {last:.3g} at step {last_x:g}"


def plot_curves(
    curves: Mapping[str, Series], path: str | Path, *, x_label: str = "training step"
) -> Path:
    """Draw one panel per non-empty curve, side by side, and save a PNG.

    Args:
        curves: Panel title → points.
        path: The PNG to write (its folder is created).
        x_label: The x axis' label.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        ValueError: If every curve is empty.
    """
    panels = [
        _panel(
            [Curve(title, points)],
            f"{title}: {points[0][1]:.3g} at start, {points[-1][1]:.3g} at end",
            x_label,
        )
        for title, points in curves.items()
        if points
    ]
    if not panels:
        raise ValueError(f"nothing to plot: every curve of {list(curves)} is empty")
    return _save(panels, path)


@dataclass(frozen=True)
class ValidationPanel:
    """What one panel of :func:`plot_validation` shows.

    Attributes:
        title: ``success`` or ``mean score``.
        training: The training rollouts' value at every logged step.
        validation: The validation's value at each validation step.
    """

    title: str
    training: Series
    validation: Series


def moving_mean(points: Series, window: int) -> list[tuple[float, float]]:
    """Each point's value replaced by the mean over the ``window`` points centred
    on it (fewer at the ends).

    >>> moving_mean([(1, 0.0), (2, 3.0), (3, 0.0), (4, 3.0)], 3)
    [(1, 1.5), (2, 1.0), (3, 2.0), (4, 1.5)]
    """
    half = window // 2
    values = [y for _, y in points]
    return [
        (x, sum(part := values[max(0, i - half) : i + half + 1]) / len(part))
        for i, (x, _) in enumerate(points)
    ]


def validation_panels(metrics_file: str | Path) -> list[ValidationPanel]:
    """The panels of :data:`VALIDATION_PANELS` that have points in ``metrics_file``."""
    keys = [key for spec in VALIDATION_PANELS for key in (spec.validation, *spec.training)]
    series = read_metrics(metrics_file, keys)
    panels = []
    for spec in VALIDATION_PANELS:
        training = next((series[key] for key in spec.training if series[key]), [])
        if training or series[spec.validation]:
            panels.append(ValidationPanel(spec.title, training, series[spec.validation]))
    return panels


def plot_validation(metrics_file: str | Path, path: str | Path) -> Path | None:
    """Plot success and mean score over the training steps from ``metrics.jsonl``:
    the training rollouts' at every step (thin, light orange) with its moving
    mean over about a sixth of the run (dark orange) when the run has 12 steps
    or more, and the validations' at their steps (blue, with dots).

    Returns:
        The PNG written, or None when the file has neither metric.
    """
    images = []
    for panel in validation_panels(metrics_file):
        window = len(panel.training) // 12 * 2 + 1  # odd: centred on its step
        curves = [
            Curve("training (each step)", panel.training, TRAINING_COLOR, 1, dots=False),
            Curve(
                f"mean of {window} steps",
                moving_mean(panel.training, window) if window > 1 else [],
                TREND_COLOR,
                dots=False,
            ),
            Curve("validation", panel.validation),
        ]
        curves = [curve for curve in curves if curve.points]
        summary = (
            _span("validation", panel.validation)
            if panel.validation
            else _span("training", panel.training)
        )
        images.append(_panel(curves, f"{panel.title}: {summary}", "training step"))
    return _save(images, path) if images else None
