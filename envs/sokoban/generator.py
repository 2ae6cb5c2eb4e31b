"""Procedural Sokoban rooms by reverse playing, as in gym-sokoban, but exact and fast.

gym-sokoban (Schrader 2018) carves a room by a random walk, puts the boxes on
their targets, then plays backwards (the player walks and *pulls* boxes) with
a depth-first search that keeps the state of largest box displacement.

We keep the topology and the idea, and replace the search with a
breadth-first search over reverse moves started from *every* solved state
(boxes on targets, player anywhere). Breadth-first order makes the depth at
which a state is first reached its exact optimal solution length in moves,
so the generator returns the state whose optimal solution is longest (up to
``search_depth``): the hardest room the layout allows, solvable by
construction, never already solved, and with its optimal move count known.

The search runs over a compact form: for each box placement, the set of
player cells is one Python int, and a whole layer of player moves is four
shifts and a mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentgym.envs.sokoban.room import Room, cells

# gym-sokoban's carving masks: cells set to floor around the walker.
_MASKS = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
_DIRECTIONS = ((1, 0), (0, 1), (-1, 0), (0, -1))


class GenerationError(RuntimeError):
    """No room with the requested parameters could be generated."""


@dataclass(frozen=True)
class GeneratedRoom:
    """A generated room and what the generator knows about it.

    Attributes:
        room: The start state.
        optimal_moves: Length of its shortest solution, in moves.
        attempts: Layouts tried before this one succeeded.
    """

    room: Room
    optimal_moves: int
    attempts: int


def carve_topology(
    rng: np.random.Generator, height: int, width: int, num_steps: int, p_change_direction: float
) -> int:
    """Carve floor cells with a random walk (gym-sokoban's ``room_topology_generation``).

    Returns:
        The floor bitmask; the border is always wall.
    """
    # All random draws at once: one call per array is far cheaper than one per step.
    changes = rng.random(num_steps).tolist()
    new_dirs = rng.integers(0, 4, num_steps).tolist()
    masks = rng.integers(0, len(_MASKS), num_steps).tolist()
    row = int(rng.integers(1, height - 1))
    col = int(rng.integers(1, width - 1))
    dr, dc = _DIRECTIONS[int(rng.integers(0, 4))]
    floor = 0
    for step in range(num_steps):
        if changes[step] < p_change_direction:
            dr, dc = _DIRECTIONS[new_dirs[step]]
        row = min(max(row + dr, 1), height - 2)
        col = min(max(col + dc, 1), width - 2)
        for mr, mc in _MASKS[masks[step]]:
            r, c = row + mr, col + mc
            if 0 < r < height - 1 and 0 < c < width - 1:
                floor |= 1 << (r * width + c)
    return floor


def reverse_search(
    floor: int, targets: int, width: int, search_depth: int, max_states: int
) -> tuple[int, list[tuple[int, int]]]:
    """Breadth-first search over reverse moves from every solved state.

    Args:
        floor: Floor bitmask.
        targets: Target bitmask (the boxes start there).
        width: Room width (the cell offset of one row).
        search_depth: Deepest layer to explore.
        max_states: Stop after the layer during which this many states were seen.

    Returns:
        ``(depth, states)``: the depth of the deepest layer that holds a
        state with no box on a target, and those states as
        ``(boxes, player_cells_mask)`` pairs; ``(0, [])`` when there is none.
        (gym-sokoban likewise only keeps rooms whose targets are all empty.)
    """
    offsets = (-width, width, -1, 1)
    start = floor & ~targets
    visited = {targets: start}
    frontier = {targets: start}
    seen = start.bit_count()
    depth = best_depth = 0
    best: list[tuple[int, int]] = []
    while frontier and depth < search_depth and seen < max_states:
        layer: dict[int, int] = {}
        for boxes, players in frontier.items():
            free = floor & ~boxes
            walked = (players << 1 | players >> 1 | players << width | players >> width) & free
            walked &= ~visited[boxes]
            if walked:
                layer[boxes] = layer.get(boxes, 0) | walked
            remaining = boxes
            while remaining:
                low = remaining & -remaining
                remaining ^= low
                box = low.bit_length() - 1
                for offset in offsets:
                    # The player stands next to the box and steps away from it, pulling it along.
                    stand = box + offset
                    if players >> stand & 1 and free >> (stand + offset) & 1:
                        pulled = boxes ^ low | 1 << stand
                        bit = 1 << (stand + offset)
                        if not visited.get(pulled, 0) & bit:
                            layer[pulled] = layer.get(pulled, 0) | bit
        for boxes, players in layer.items():
            visited[boxes] = visited.get(boxes, 0) | players
            seen += players.bit_count()
        frontier = layer
        depth += 1
        off_target = [(b, p) for b, p in layer.items() if not b & targets]
        if off_target:
            best_depth, best = depth, off_target
    return best_depth, best


def generate_room(
    rng: np.random.Generator,
    dim_room: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    search_depth: int = 100,
    num_gen_steps: int | None = None,
    p_change_direction: float = 0.35,
    max_states: int = 20_000,
    max_attempts: int = 1000,
) -> GeneratedRoom:
    """Generate a solvable, unsolved room whose optimal solution is as long as possible.

    Args:
        rng: The only source of randomness; the same generator state gives
            the same room on any machine.
        dim_room: ``(height, width)``, walls included.
        num_boxes: Boxes (and targets).
        search_depth: Longest optimal solution to look for, in moves; the
            room's optimal solution is the longest the layout allows up to
            this (or up to what ``max_states`` lets the search reach).
        num_gen_steps: Random-walk steps; default ``1.7 * (height + width)``
            as in gym-sokoban.
        p_change_direction: Probability that the walk turns at each step.
        max_states: Search budget in states per layout.
        max_attempts: Layouts to try before giving up.

    Returns:
        The room, its optimal move count and the number of layouts tried.

    Raises:
        ValueError: If a parameter is out of range.
        GenerationError: If no layout in ``max_attempts`` let every box be
            pulled off the targets.
    """
    height, width = dim_room
    if height < 3 or width < 3:
        raise ValueError(f"dim_room must be at least (3, 3), got {dim_room}")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
    if search_depth < 1:
        raise ValueError(f"search_depth must be >= 1, got {search_depth}")
    if num_boxes + 1 > (height - 2) * (width - 2):
        raise ValueError(f"{num_boxes} boxes and a player do not fit in a {height}x{width} room")
    steps = num_gen_steps if num_gen_steps is not None else int(1.7 * (height + width))
    for attempt in range(1, max_attempts + 1):
        floor = carve_topology(rng, height, width, steps, p_change_direction)
        floor_cells = cells(floor)
        if len(floor_cells) < num_boxes + 2:
            continue
        chosen = rng.choice(len(floor_cells), size=num_boxes, replace=False).tolist()
        targets = sum(1 << floor_cells[i] for i in chosen)
        depth, layer = reverse_search(floor, targets, width, search_depth, max_states)
        if not layer:
            continue
        counts = [players.bit_count() for _, players in layer]
        pick = int(rng.integers(sum(counts)))
        for (boxes, players), count in zip(layer, counts, strict=True):
            if pick < count:
                player = cells(players)[pick]
                room = Room(height, width, floor, targets, boxes, player)
                return GeneratedRoom(room=room, optimal_moves=depth, attempts=attempt)
            pick -= count
    raise GenerationError(
        f"no {height}x{width} room with {num_boxes} boxes off their targets after "
        f"{max_attempts} layouts; use a larger dim_room or fewer boxes"
    )
