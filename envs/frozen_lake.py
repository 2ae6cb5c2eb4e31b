"""FrozenLake as a text environment, over Gymnasium's FrozenLake-v1 dynamics."""

from __future__ import annotations

import functools
from collections import deque
from typing import Any, ClassVar

import numpy as np
from gymnasium.envs.toy_text import frozen_lake as gym_frozen_lake

from agentgym.envs.text_env import TextEnv, require_reset
from agentgym.envs.tiles import compose, disc, framed, solid

ACTIONS = ("Left", "Down", "Right", "Up")
"""In Gymnasium's order: action ``i`` of FrozenLake-v1 is ``ACTIONS[i]``."""

SYMBOLS = {
    "frozen": "_",
    "hole": "O",
    "goal": "G",
    "player": "P",
    "player_in_hole": "X",
    "player_on_goal": "√",
}
"""Cell kind -> symbol of the text observation."""

_MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


class FrozenLakeEnv(TextEnv):
    """FrozenLake: walk across the frozen lake to the goal without falling into a hole.

    The dynamics are Gymnasium's ``FrozenLake-v1`` (reused, not rewritten): a
    new random map per seed, reward 1 on reaching the goal, episode over on
    the goal or a hole. On a slippery lake a move goes in the intended
    direction with probability ``success_rate`` and otherwise to one side.

    Args:
        size: Side of the square map.
        p: Probability that a tile is frozen (not a hole).
        is_slippery: Whether moves may slip sideways.
        success_rate: On a slippery lake, the probability a move goes as intended.
        max_steps: Step limit per episode; an unparsable response counts as a step.
        **kwargs: :class:`TextEnv` options (``response_format``,
            ``max_actions_per_turn``, ``format_penalty``, ``render_mode``: also
            ``rgb_array``, a picture of the lake).
    """

    generator_version: ClassVar[int | None] = 1
    inline_calls: ClassVar[bool] = True
    """A small lake, made and stepped in pure Python: well under a millisecond a call."""

    action_names: ClassVar[tuple[str, ...]] = ACTIONS

    def __init__(
        self,
        *,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        success_rate: float = 1.0 / 3.0,
        max_steps: int = 100,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps=max_steps, **kwargs)
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if not 0.0 < p <= 1.0:
            raise ValueError(f"p must be in (0, 1], got {p}")
        self.size = size
        self.p = p
        self.is_slippery = is_slippery
        self.success_rate = success_rate
        self.lake: gym_frozen_lake.FrozenLakeEnv | None = None
        self._map: list[str] = []

    @property
    def _rules(self) -> str:
        slip = (
            " The ice is slippery: you may slide sideways instead of where you meant to go."
            if self.is_slippery
            else ""
        )
        return (
            "You are playing FrozenLake. Walk from your position to the goal without "
            "falling into a hole.\n"
            "Symbols: _ frozen ice, O hole, G goal, P you, X you in a hole, √ you on the goal.\n"
            f"Each action moves you one cell; moving into the edge of the map does nothing.{slip}"
        )

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        map_seed, lake_seed = self.np_random.integers(0, 2**31 - 1, size=2).tolist()
        self._map = gym_frozen_lake.generate_random_map(size=self.size, p=self.p, seed=map_seed)
        self.lake = gym_frozen_lake.FrozenLakeEnv(
            desc=self._map, is_slippery=self.is_slippery, success_rate=self.success_rate
        )
        self.lake.reset(seed=lake_seed)
        return {}

    def _apply(self, action: str) -> tuple[float, bool]:
        _, reward, terminated, _, _ = self._lake.step(ACTIONS.index(action))
        return float(reward), bool(terminated)

    def _position(self) -> tuple[int, int]:
        row, col = divmod(int(self._lake.s), self.size)
        return row, col

    def _tile(self, row: int, col: int) -> str:
        return self._map[row][col]

    def kinds(self) -> list[list[str]]:
        """The kind of every cell, row by row (keys of :data:`SYMBOLS`)."""
        player = self._position()
        tile_kind = {"S": "frozen", "F": "frozen", "H": "hole", "G": "goal"}
        on_kind = {"frozen": "player", "hole": "player_in_hole", "goal": "player_on_goal"}
        grid = []
        for r in range(self.size):
            row = [tile_kind[self._tile(r, c)] for c in range(self.size)]
            if r == player[0]:
                row[player[1]] = on_kind[row[player[1]]]
            grid.append(row)
        return grid

    def _observation(self) -> str:
        return "\n".join("".join(SYMBOLS[kind] for kind in row) for row in self.kinds())

    def _success(self) -> bool:
        return self.lake is not None and self._tile(*self._position()) == "G"

    def _render_rgb(self) -> np.ndarray:
        return compose(self.kinds(), _tiles())

    @property
    def _lake(self) -> gym_frozen_lake.FrozenLakeEnv:
        return require_reset(self.lake)

    def solve(self) -> list[str] | None:
        """A shortest list of action names from the current cell to the goal.

        Returns:
            The actions (empty when on the goal), or None when the goal cannot
            be reached (the player is in a hole).

        Raises:
            ValueError: On a slippery lake, where no fixed plan is guaranteed.
        """
        if self.is_slippery:
            raise ValueError("solve() needs is_slippery=False: a slippery lake has no fixed plan")
        start = self._position()
        if self._tile(*start) == "H":
            return None
        parent: dict[tuple[int, int], tuple[tuple[int, int], str]] = {}
        seen = {start}
        queue = deque([start])
        while queue:
            cell = queue.popleft()
            if self._tile(*cell) == "G":
                path = []
                while cell != start:
                    cell, name = parent[cell]
                    path.append(name)
                return path[::-1]
            for name, (dr, dc) in _MOVES.items():
                nxt = (cell[0] + dr, cell[1] + dc)
                if (
                    0 <= nxt[0] < self.size
                    and 0 <= nxt[1] < self.size
                    and nxt not in seen
                    and self._tile(*nxt) != "H"
                ):
                    seen.add(nxt)
                    parent[nxt] = (cell, name)
                    queue.append(nxt)
        return None


@functools.cache
def _tiles() -> dict[str, np.ndarray]:
    ice = solid((204, 230, 245))
    goal = framed((246, 208, 72), (196, 150, 30), 2)
    hole = disc((28, 52, 92), ice, 6.5)
    player_color = (214, 69, 65)
    return {
        "frozen": ice,
        "hole": hole,
        "goal": goal,
        "player": disc(player_color, ice, 4.5),
        "player_in_hole": disc(player_color, hole, 3.5),
        "player_on_goal": disc(player_color, goal, 4.5),
    }
