"""Small numpy drawing helpers for the envs' ``rgb_array`` renderings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

TILE = 16
"""Tile side in pixels."""

Color = tuple[int, int, int]


def solid(color: Color) -> np.ndarray:
    """A ``[TILE, TILE, 3]`` uint8 tile of one color."""
    return np.full((TILE, TILE, 3), color, dtype=np.uint8)


def framed(fill: Color, frame: Color, width: int) -> np.ndarray:
    """A tile of ``fill`` with a ``width``-pixel border of ``frame``."""
    tile = solid(frame)
    tile[width : TILE - width, width : TILE - width] = fill
    return tile


def disc(color: Color, base: np.ndarray, radius: float) -> np.ndarray:
    """``base`` with a centred disc of ``color``."""
    tile = base.copy()
    yy, xx = np.mgrid[0:TILE, 0:TILE]
    centre = (TILE - 1) / 2
    tile[(yy - centre) ** 2 + (xx - centre) ** 2 <= radius**2] = color
    return tile


def compose(grid: Sequence[Sequence[str]], pictures: Mapping[str, np.ndarray]) -> np.ndarray:
    """Lay tiles out in a grid of kind names.

    Returns:
        A ``[rows * TILE, cols * TILE, 3]`` uint8 image.
    """
    rows = [np.concatenate([pictures[kind] for kind in row], axis=1) for row in grid]
    return np.concatenate(rows, axis=0)
