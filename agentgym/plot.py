"""Draw training curves to a PNG with Pillow (no plotting library needed).

:func:`plot_validation` reads the ``val/*`` metrics that the stdout tracker
writes to ``metrics.jsonl`` and draws validation success and mean score over
the training steps, one panel each.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

Series = Sequence[tuple[float, float]]
"""Points ``(x, y)`` of one curve, in order of x."""

VALIDATION_PANELS = {
    "val/all/success": "validation success",
    "val/all/score": "validation mean score",
}
"""Metric key → panel title of :func:`plot_validation`."""

_PANEL = (480, 360)  # width, height of one panel in pixels
_MARGIN = (70, 20, 50, 40)  # left, right, bottom, top inside a panel
_INK, _GRID, _LINE = (40, 40, 40), (225, 225, 225), (31, 119, 180)


def read_metrics(
    metrics_file: str | Path, keys: Sequence[str]
) -> dict[str, list[tuple[float, float]]]:
    """``{key: [(step, value), ...]}`` for ``keys`` from a ``metrics.jsonl`` file.

    A step logged twice (a resumed run) keeps its last value; keys never
    logged map to an empty list.
    """
    found: dict[str, dict[float, float]] = {key: {} for key in keys}
    for line in Path(metrics_file).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        for key in keys:
            if key in record:
                found[key][float(record["step"])] = float(record[key])
    return {key: sorted(points.items()) for key, points in found.items()}


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 × 10^k) that cover ``[low, high]``.

    >>> nice_ticks(0.13, 0.41)
    [0.1, 0.2, 0.3, 0.4, 0.5]
    """
    if high <= low:
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


def _panel(points: Series, title: str, x_label: str) -> Image.Image:
    """One panel: axes, grid, ticks, the curve, and its first and last values in the title."""
    image = Image.new("RGB", _PANEL, "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=13)
    left, right, bottom, top = _MARGIN
    x0, y0, x1, y1 = left, top, _PANEL[0] - right, _PANEL[1] - bottom
    first, last = points[0][1], points[-1][1]
    draw.text((x0, 8), f"{title}: {first:.3g} at start, {last:.3g} at end", fill=_INK, font=font)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))

    def to_pixel(x: float, y: float) -> tuple[float, float]:
        px = x0 + (x - x_ticks[0]) / (x_ticks[-1] - x_ticks[0]) * (x1 - x0)
        py = y1 - (y - y_ticks[0]) / (y_ticks[-1] - y_ticks[0]) * (y1 - y0)
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
    pixels = [to_pixel(x, y) for x, y in points]
    if len(pixels) > 1:
        draw.line(pixels, fill=_LINE, width=2)
    for px, py in pixels:
        draw.ellipse([px - 3, py - 3, px + 3, py + 3], fill=_LINE)
    return image


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
    panels = [_panel(points, title, x_label) for title, points in curves.items() if points]
    if not panels:
        raise ValueError(f"nothing to plot: every curve of {list(curves)} is empty")
    image = Image.new("RGB", (_PANEL[0] * len(panels), _PANEL[1]), "white")
    for index, panel in enumerate(panels):
        image.paste(panel, (index * _PANEL[0], 0))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return path


def plot_validation(metrics_file: str | Path, path: str | Path) -> Path | None:
    """Plot validation success and mean score over steps from ``metrics.jsonl``.

    Returns:
        The PNG written, or None when the file has no validation metrics.
    """
    series = read_metrics(metrics_file, list(VALIDATION_PANELS))
    curves = {VALIDATION_PANELS[key]: points for key, points in series.items()}
    if not any(curves.values()):
        return None
    return plot_curves(curves, path)
