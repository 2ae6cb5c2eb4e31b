"""Move-optimal Sokoban solver: A* over (player, boxes) states.

The heuristic is admissible, so the first goal popped is a shortest solution
in moves (walks and pushes both count one):

* pushes: each box needs at least its push distance to the target it is
  matched with (distances ignore other boxes; the matching is the cheapest
  over all assignments), and every push is a move;
* walking: before the first push the player must walk next to some box,
  at least ``manhattan - 1`` moves, none of which is a push.

Boxes on *dead* cells (from which no sequence of pushes reaches any target)
are pruned: such states cannot be solved.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from agentgym.envs.sokoban.room import Room, action_offsets, cells

_UNREACHABLE = 1 << 30


def push_distances(room: Room) -> dict[int, dict[int, int]]:
    """For each target, the fewest pushes that bring a lone box from each cell onto it.

    Computed by pulling a box away from the target: a box at ``c`` can be
    pushed to ``c + d`` when the player can stand at ``c - d``.

    Returns:
        ``{target: {cell: pushes}}``; cells missing from a target's dict can
        never reach it.
    """
    offsets = (-room.width, room.width, -1, 1)
    table = {}
    for target in cells(room.targets):
        dist = {target: 0}
        queue = deque([target])
        while queue:
            cell = queue.popleft()
            for d in offsets:
                prev = cell - d
                if prev not in dist and room.floor >> prev & 1 and room.floor >> (prev - d) & 1:
                    dist[prev] = dist[cell] + 1
                    queue.append(prev)
        table[target] = dist
    return table


class _Heuristic:
    """Admissible lower bound on the moves left, cached per box placement."""

    def __init__(self, room: Room) -> None:
        self.width = room.width
        table = push_distances(room)
        self.targets = list(table)
        self.dist = [table[t] for t in self.targets]
        self.live = 0
        for dist in self.dist:
            for cell in dist:
                self.live |= 1 << cell
        self._push_bound: dict[int, int] = {}

    def push_bound(self, boxes: int) -> int:
        cached = self._push_bound.get(boxes)
        if cached is not None:
            return cached
        box_cells = cells(boxes)
        if len(box_cells) <= 5:
            bound = min(
                sum(self.dist[t].get(b, _UNREACHABLE) for b, t in zip(box_cells, perm, strict=True))
                for perm in itertools.permutations(range(len(self.targets)), len(box_cells))
            )
        else:  # too many permutations: each box to its own nearest target
            bound = sum(min(d.get(b, _UNREACHABLE) for d in self.dist) for b in box_cells)
        self._push_bound[boxes] = bound
        return bound

    def __call__(self, player: int, boxes: int) -> int:
        pushes = self.push_bound(boxes)
        if pushes == 0:
            return 0
        # The first push may be of any box, even one already on a target.
        pr, pc = divmod(player, self.width)
        walk = min(
            abs(pr - br) + abs(pc - bc) for br, bc in (divmod(b, self.width) for b in cells(boxes))
        )
        return pushes + walk - 1


def solve(room: Room, max_states: int = 500_000) -> list[str] | None:
    """A shortest sequence of actions that puts every box on a target.

    Args:
        room: The state to solve from.
        max_states: Give up after expanding this many states.

    Returns:
        Action names (``"Up"``, ...), empty when already solved; None when
        the room is unsolvable or the budget ran out.
    """
    if room.solved:
        return []
    heuristic = _Heuristic(room)
    if room.boxes & ~heuristic.live:
        return None
    moves = [(name, offset) for name, offset in action_offsets(room.width).items()]
    floor, live, targets = room.floor, heuristic.live, room.targets
    shift = room.width * room.height
    start = room.boxes * shift + room.player
    parent: dict[int, tuple[int, str]] = {}
    best_g = {start: 0}
    h0 = heuristic(room.player, room.boxes)
    counter = itertools.count()
    heap = [(h0, 0, next(counter), room.player, room.boxes)]
    expanded = 0
    while heap:
        _, neg_g, _, player, boxes = heapq.heappop(heap)
        g = -neg_g
        key = boxes * shift + player
        if best_g.get(key, _UNREACHABLE) < g:
            continue
        if boxes == targets:
            return _path(parent, key)
        expanded += 1
        if expanded > max_states:
            return None
        for name, offset in moves:
            step = player + offset
            if not floor >> step & 1:
                continue
            new_boxes = boxes
            if boxes >> step & 1:
                beyond = step + offset
                if not (floor >> beyond & 1) or boxes >> beyond & 1 or not live >> beyond & 1:
                    continue
                new_boxes = boxes ^ (1 << step) ^ (1 << beyond)
            new_key = new_boxes * shift + step
            if g + 1 >= best_g.get(new_key, _UNREACHABLE):
                continue
            best_g[new_key] = g + 1
            parent[new_key] = (key, name)
            f = g + 1 + heuristic(step, new_boxes)
            heapq.heappush(heap, (f, -(g + 1), next(counter), step, new_boxes))
    return None


def _path(parent: dict[int, tuple[int, str]], key: int) -> list[str]:
    path = []
    while key in parent:
        key, name = parent[key]
        path.append(name)
    path.reverse()
    return path
