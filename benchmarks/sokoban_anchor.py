"""gym-sokoban's room generator as the anchor for our Sokoban generator, and timed sampling.

gym-sokoban 0.0.6 (``pip install --no-deps gym-sokoban``) keeps its generator
in ``gym_sokoban/envs/room_utils.py``, which needs only numpy; importing the
``gym_sokoban`` package would pull in the old ``gym``. So the file is loaded by
path, without importing the package.

gym-sokoban encodes a room as two integer grids: ``room_structure`` holds the
fixed parts (wall 0, floor 1, target 2) and ``room_state`` the movable ones
(box on target 3, box off target 4, player 5). It draws from the global
``random`` and ``np.random`` states, and raises ``RuntimeError`` or
``RuntimeWarning`` when a layout fails; its ``SokobanEnv.reset`` catches those
and retries, so one anchor room here is "call until success" as well.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import numpy as np

from agentgym.envs.sokoban.generator import GeneratedRoom, generate_room
from agentgym.envs.sokoban.room import SYMBOLS, Room

ANCHOR_NAME = "gym-sokoban"
INSTALL_HINT = "pip install --no-deps gym-sokoban"

# gym-sokoban's cell codes.
_WALL = 0
_TARGET = 2
_BOXES = (3, 4)
_PLAYER = 5

T = TypeVar("T")


@dataclass(frozen=True)
class Setting:
    """One benchmarked room size.

    Attributes:
        height: Rows, walls included.
        width: Columns, walls included.
        num_boxes: Boxes (and targets).
        anchor_rooms: gym-sokoban rooms the comparison script times by
            default; fewer at large sizes, where one room takes about a second.
    """

    height: int
    width: int
    num_boxes: int
    anchor_rooms: int

    @property
    def dim_room(self) -> tuple[int, int]:
        """``(height, width)``, as both generators take it."""
        return self.height, self.width

    @property
    def num_gen_steps(self) -> int:
        """Random-walk steps, ``int(1.7 * (height + width))`` as gym-sokoban's SokobanEnv uses."""
        return int(1.7 * (self.height + self.width))

    @property
    def label(self) -> str:
        """Human-readable name, e.g. ``"8x8, 2 boxes"``."""
        boxes = "box" if self.num_boxes == 1 else "boxes"
        return f"{self.height}x{self.width}, {self.num_boxes} {boxes}"

    @property
    def id(self) -> str:
        """Short identifier for test ids and JSON, e.g. ``"8x8-2box"``."""
        return f"{self.height}x{self.width}-{self.num_boxes}box"


SETTINGS = (
    Setting(6, 6, num_boxes=1, anchor_rooms=200),
    Setting(8, 8, num_boxes=2, anchor_rooms=200),
    Setting(10, 10, num_boxes=3, anchor_rooms=100),
)
"""The benchmarked room sizes, smallest first."""


@dataclass(frozen=True)
class TimedRooms:
    """Rooms from one generator and the wall-clock time each took.

    Attributes:
        rooms: The generated start states, in generation order.
        seconds: Generation time of each room (same order as ``rooms``).
        optimal_moves: The generator's own claim of each room's shortest
            solution length, or None when the generator makes no claim.
    """

    rooms: list[Room]
    seconds: list[float]
    optimal_moves: list[int] | None


@cache
def load_room_utils() -> ModuleType | None:
    """gym-sokoban's ``room_utils`` module, loaded by file path; None when not installed.

    Raises:
        FileNotFoundError: If gym-sokoban is installed but has no
            ``envs/room_utils.py`` (a layout other than 0.0.6's).
    """
    spec = importlib.util.find_spec("gym_sokoban")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "envs" / "room_utils.py"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found; the benchmark expects gym-sokoban 0.0.6 ({INSTALL_HINT}==0.0.6)"
        )
    file_spec = importlib.util.spec_from_file_location("gym_sokoban_room_utils", path)
    if file_spec is None or file_spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module


def anchor_version() -> str | None:
    """The installed gym-sokoban version, or None."""
    try:
        return importlib.metadata.version(ANCHOR_NAME)
    except importlib.metadata.PackageNotFoundError:
        return None


def seed_anchor(seed: int) -> None:
    """Seed the global ``random`` and ``np.random`` states that gym-sokoban draws from."""
    random.seed(seed)
    np.random.seed(seed)


def anchor_arrays(
    room_utils: ModuleType, setting: Setting, max_calls: int = 1000
) -> tuple[np.ndarray, np.ndarray]:
    """One gym-sokoban room: call its ``generate_room`` until it succeeds.

    Args:
        room_utils: The module from :func:`load_room_utils`.
        setting: Room size and box count.
        max_calls: Failed calls to allow before giving up (SokobanEnv retries forever).

    Returns:
        ``(room_structure, room_state)``, each ``[height, width]``.

    Raises:
        RuntimeError: If ``max_calls`` calls in a row failed.
    """
    for _ in range(max_calls):
        try:
            structure, state, _ = room_utils.generate_room(
                dim=setting.dim_room, num_steps=setting.num_gen_steps, num_boxes=setting.num_boxes
            )
        except (RuntimeError, RuntimeWarning):
            continue
        return structure, state
    raise RuntimeError(f"gym-sokoban failed {max_calls} times in a row at {setting.label}")


def _anchor_symbol(fixed: int, movable: int) -> str:
    """Our symbol for one cell given gym-sokoban's structure and state codes."""
    if fixed == _WALL:
        return SYMBOLS["wall"]
    on_target = fixed == _TARGET
    if movable == _PLAYER:
        kind = "player_on_target" if on_target else "player"
    elif movable in _BOXES:
        kind = "box_on_target" if on_target else "box"
    else:
        kind = "target" if on_target else "floor"
    return SYMBOLS[kind]


def anchor_to_room(structure: np.ndarray, state: np.ndarray) -> Room:
    """Convert gym-sokoban's ``(room_structure, room_state)`` to our :class:`Room`.

    Args:
        structure: ``[height, width]`` fixed parts (wall 0, floor 1, target 2).
        state: ``[height, width]`` movable parts (box 3 or 4, player 5).

    Returns:
        The same room, parsed from our text form.
    """
    rows = (
        "".join(_anchor_symbol(fixed, movable) for fixed, movable in zip(f_row, s_row, strict=True))
        for f_row, s_row in zip(
            structure.astype(int).tolist(), state.astype(int).tolist(), strict=True
        )
    )
    return Room.from_text("\n".join(rows))


def generate_ours(rng: np.random.Generator, setting: Setting) -> GeneratedRoom:
    """One room from our generator, with the same random-walk length as the anchor."""
    return generate_room(
        rng, setting.dim_room, num_boxes=setting.num_boxes, num_gen_steps=setting.num_gen_steps
    )


def _timed_calls(make: Callable[[], T], count: int) -> tuple[list[T], list[float]]:
    """Call ``make`` ``count`` times; return the results and each call's wall-clock seconds."""
    results: list[T] = []
    seconds: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        result = make()
        seconds.append(time.perf_counter() - start)
        results.append(result)
    return results, seconds


def time_ours(setting: Setting, count: int, seed: int) -> TimedRooms:
    """Generate ``count`` rooms with our generator from one seeded, advancing RNG."""
    rng = np.random.default_rng(seed)
    generated, seconds = _timed_calls(lambda: generate_ours(rng, setting), count)
    return TimedRooms(
        rooms=[g.room for g in generated],
        seconds=seconds,
        optimal_moves=[g.optimal_moves for g in generated],
    )


def time_anchor(room_utils: ModuleType, setting: Setting, count: int, seed: int) -> TimedRooms:
    """Generate ``count`` rooms with gym-sokoban after seeding its global RNGs.

    Only gym-sokoban's own generation is timed; the conversion to :class:`Room` is not.
    """
    seed_anchor(seed)
    arrays, seconds = _timed_calls(lambda: anchor_arrays(room_utils, setting), count)
    rooms = [anchor_to_room(structure, state) for structure, state in arrays]
    return TimedRooms(rooms=rooms, seconds=seconds, optimal_moves=None)
