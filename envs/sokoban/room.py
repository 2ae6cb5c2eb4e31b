"""Sokoban rooms as bitmasks, and their text form.

Cells are numbered row-major, ``cell = row * width + col``; a set of cells is
a Python int with bit ``cell`` set. Every room is bordered by walls, so moving
one cell in any direction from a floor cell stays inside the grid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SYMBOLS = {
    "wall": "#",
    "floor": "_",
    "target": "O",
    "box": "X",
    "box_on_target": "√",
    "player": "P",
    "player_on_target": "S",
}
"""Cell kind -> symbol of the text observation."""

GRID_CODES = ("wall", "floor", "target", "box_on_target", "box", "player", "player_on_target")
"""gym-sokoban's cell codes (ROLL's ``grid_lookup`` keys) -> cell kind."""

ACTIONS = ("Up", "Down", "Left", "Right")


def action_offsets(width: int) -> dict[str, int]:
    """Cell-index offset of each action in a room of this width."""
    return {"Up": -width, "Down": width, "Left": -1, "Right": 1}


def cells(mask: int) -> list[int]:
    """The cell indices set in ``mask``, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


@dataclass(frozen=True)
class Room:
    """One Sokoban state: the fixed layout plus box and player positions.

    Attributes:
        height: Rows, walls included.
        width: Columns, walls included.
        floor: Cells that are not walls (targets included).
        targets: Box target cells.
        boxes: Cells holding a box.
        player: The player's cell.
    """

    height: int
    width: int
    floor: int
    targets: int
    boxes: int
    player: int

    @property
    def solved(self) -> bool:
        """Whether every box is on a target."""
        return self.boxes == self.targets

    def kinds(self) -> list[list[str]]:
        """The kind of every cell, row by row (keys of :data:`SYMBOLS`)."""
        grid = []
        for r in range(self.height):
            row = []
            for c in range(self.width):
                cell = r * self.width + c
                bit = 1 << cell
                on_target = bool(self.targets & bit)
                if not self.floor & bit:
                    row.append("wall")
                elif cell == self.player:
                    row.append("player_on_target" if on_target else "player")
                elif self.boxes & bit:
                    row.append("box_on_target" if on_target else "box")
                else:
                    row.append("target" if on_target else "floor")
            grid.append(row)
        return grid

    def to_text(self, symbols: Mapping[str, str] = SYMBOLS) -> str:
        """The grid, one row per line, in ``symbols`` (cell kind -> symbol)."""
        return "\n".join("".join(symbols[kind] for kind in row) for row in self.kinds())

    @classmethod
    def from_text(cls, text: str) -> Room:
        """Parse a grid written with this module's symbols.

        Raises:
            ValueError: If the grid is ragged, has an unknown symbol, not
                exactly one player, a floor cell on the border, or box and
                target counts that differ.
        """
        lines = text.strip("\n").split("\n")
        height, width = len(lines), len(lines[0]) if lines else 0
        if height < 3 or any(len(line) != width for line in lines):
            raise ValueError("a room needs at least 3 rows of equal length")
        kind_of = {symbol: kind for kind, symbol in SYMBOLS.items()}
        floor = targets = boxes = 0
        players = []
        for r, line in enumerate(lines):
            for c, symbol in enumerate(line):
                kind = kind_of.get(symbol)
                if kind is None:
                    raise ValueError(f"unknown symbol {symbol!r} at row {r}, column {c}")
                if kind == "wall":
                    continue
                if r in (0, height - 1) or c in (0, width - 1):
                    raise ValueError(f"the border must be walls; {symbol!r} at row {r}, column {c}")
                bit = 1 << (r * width + c)
                floor |= bit
                if kind.endswith("target"):
                    targets |= bit
                if kind.startswith("box"):
                    boxes |= bit
                if kind.startswith("player"):
                    players.append(r * width + c)
        if len(players) != 1:
            raise ValueError(f"a room needs exactly one player, found {len(players)}")
        if boxes.bit_count() != targets.bit_count():
            raise ValueError(
                f"{boxes.bit_count()} boxes but {targets.bit_count()} targets; counts must match"
            )
        return cls(height, width, floor, targets, boxes, players[0])
