"""Tile rendering of Sokoban rooms to RGB arrays."""

from __future__ import annotations

import functools

import numpy as np

from agentgym.envs.sokoban.room import Room
from agentgym.envs.tiles import compose, disc, framed, solid


@functools.cache
def tiles() -> dict[str, np.ndarray]:
    """One picture per cell kind of :meth:`Room.kinds`."""
    floor = solid((219, 212, 196))
    target = floor.copy()
    target[5:11, 5:11] = (214, 69, 65)
    wall = framed((120, 72, 48), (86, 50, 34), 1)
    wall[7:9, :] = (86, 50, 34)
    return {
        "wall": wall,
        "floor": floor,
        "target": target,
        "box": framed((222, 160, 60), (140, 90, 30), 2),
        "box_on_target": framed((98, 180, 80), (50, 110, 40), 2),
        "player": disc((52, 101, 164), floor, 5.5),
        "player_on_target": disc((52, 101, 164), target, 5.5),
    }


def render_rgb(room: Room) -> np.ndarray:
    """Draw ``room`` as a ``[height * 16, width * 16, 3]`` uint8 image."""
    return compose(room.kinds(), tiles())
