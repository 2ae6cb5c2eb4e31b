"""Compare our Sokoban room generator with gym-sokoban's: speed and room difficulty.

For each setting in :data:`sokoban_anchor.SETTINGS`, times both generators in
one process and solves every room with our move-optimal solver (outside the
timed region) to compare how hard the rooms are. Prints one table per setting
and optionally writes them as JSON::

    python benchmarks/compare_sokoban_generation.py [--rooms N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
from sokoban_anchor import (
    ANCHOR_NAME,
    INSTALL_HINT,
    SETTINGS,
    Setting,
    TimedRooms,
    anchor_version,
    load_room_utils,
    time_anchor,
    time_ours,
)

from agentgym.envs.sokoban.room import Room
from agentgym.envs.sokoban.solver import solve

DEFAULT_ROOMS = 200
SOLVER_MAX_STATES = 500_000


@dataclass(frozen=True)
class GeneratorStats:
    """What one generator produced at one setting.

    Attributes:
        rooms: Rooms generated (and timed).
        ms_mean: Mean generation time per room, in milliseconds.
        ms_sem: Standard error of ``ms_mean``.
        moves_mean: Mean optimal solution length in moves, over solved rooms.
        moves_p50: Median optimal solution length.
        moves_p90: 90th percentile of the optimal solution length.
        solver_failures: Rooms the solver found no solution for within its budget.
        claim_mismatches: Rooms whose generator-reported optimal length
            differs from the solver's; None when the generator reports none.
    """

    rooms: int
    ms_mean: float
    ms_sem: float
    moves_mean: float | None
    moves_p50: float | None
    moves_p90: float | None
    solver_failures: int
    claim_mismatches: int | None


@dataclass(frozen=True)
class SettingResult:
    """Both generators at one setting.

    Attributes:
        setting: Which setting (e.g. ``"8x8-2box"``).
        label: Human-readable setting.
        ours: Our generator's stats.
        anchor: gym-sokoban's stats.
        speed_ratio: gym-sokoban's mean time per room over ours (> 1: ours is faster).
    """

    setting: str
    label: str
    ours: GeneratorStats
    anchor: GeneratorStats
    speed_ratio: float


def optimal_lengths(rooms: list[Room]) -> list[int | None]:
    """Shortest solution length of each room in moves; None where the solver gave up."""
    solutions = (solve(room, max_states=SOLVER_MAX_STATES) for room in rooms)
    return [None if path is None else len(path) for path in solutions]


def summarize(timed: TimedRooms) -> GeneratorStats:
    """Timing and difficulty statistics of one generator's rooms."""
    ms = np.asarray(timed.seconds) * 1e3  # [rooms]
    lengths = optimal_lengths(timed.rooms)
    solved = np.asarray([n for n in lengths if n is not None], dtype=float)  # [solved rooms]
    mismatches = None
    if timed.optimal_moves is not None:
        pairs = zip(timed.optimal_moves, lengths, strict=True)
        mismatches = sum(claimed != found for claimed, found in pairs)
    has_solved = solved.size > 0
    return GeneratorStats(
        rooms=len(timed.rooms),
        ms_mean=float(ms.mean()),
        ms_sem=float(ms.std(ddof=1) / np.sqrt(ms.size)) if ms.size > 1 else 0.0,
        moves_mean=float(solved.mean()) if has_solved else None,
        moves_p50=float(np.percentile(solved, 50)) if has_solved else None,
        moves_p90=float(np.percentile(solved, 90)) if has_solved else None,
        solver_failures=len(lengths) - solved.size,
        claim_mismatches=mismatches,
    )


def compare(
    setting: Setting, rooms: int, anchor_rooms: int, seed: int, room_utils: ModuleType
) -> SettingResult:
    """Time and solve both generators at one setting."""
    ours = summarize(time_ours(setting, rooms, seed))
    anchor = summarize(time_anchor(room_utils, setting, anchor_rooms, seed))
    return SettingResult(
        setting=setting.id,
        label=setting.label,
        ours=ours,
        anchor=anchor,
        speed_ratio=anchor.ms_mean / ours.ms_mean,
    )


def _fmt(value: float | None, digits: int) -> str:
    """A number for the table, or "-" when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(result: SettingResult) -> str:
    """One setting's comparison as a plain-text table."""
    ours, anchor = result.ours, result.anchor
    rows = [
        ("rooms", str(ours.rooms), str(anchor.rooms)),
        ("ms / room, mean", _fmt(ours.ms_mean, 3), _fmt(anchor.ms_mean, 3)),
        ("ms / room, std. error", _fmt(ours.ms_sem, 3), _fmt(anchor.ms_sem, 3)),
        ("optimal moves, mean", _fmt(ours.moves_mean, 2), _fmt(anchor.moves_mean, 2)),
        ("optimal moves, p50", _fmt(ours.moves_p50, 1), _fmt(anchor.moves_p50, 1)),
        ("optimal moves, p90", _fmt(ours.moves_p90, 1), _fmt(anchor.moves_p90, 1)),
        ("solver failures", str(ours.solver_failures), str(anchor.solver_failures)),
        (
            "claimed != solver length",
            str(ours.claim_mismatches),
            "-" if anchor.claim_mismatches is None else str(anchor.claim_mismatches),
        ),
    ]
    header = ("", "ours", ANCHOR_NAME)
    lines = [f"{name:<26}{left:>12}{right:>14}" for name, left, right in (header, *rows)]
    ratio = f"speed ratio ({ANCHOR_NAME} / ours): {result.speed_ratio:.1f}x"
    return "\n".join([f"== {result.label} ==", *lines, ratio])


def environment() -> dict[str, str | None]:
    """Versions and machine, recorded next to the numbers."""
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        ANCHOR_NAME: anchor_version(),
        "machine": platform.machine(),
        "system": platform.platform(),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=f"Compare our Sokoban room generator with {ANCHOR_NAME}'s."
    )
    parser.add_argument(
        "--rooms", type=int, default=DEFAULT_ROOMS, help="rooms per setting from our generator"
    )
    parser.add_argument(
        "--anchor-rooms",
        type=int,
        default=None,
        help=f"rooms per setting from {ANCHOR_NAME}; default: the smaller of --rooms and "
        "the per-setting budget in sokoban_anchor.SETTINGS (it takes ~1 s per 10x10 room)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of both generators")
    parser.add_argument("--json", type=Path, default=None, help="also write the tables here")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help=f"tiny: 2 rooms a setting; ours alone without {ANCHOR_NAME}",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        args.rooms, args.anchor_rooms = 2, 2
    for name in ("rooms", "anchor_rooms"):
        value = getattr(args, name)
        if value is not None and value < 2:
            parser.error(f"--{name.replace('_', '-')} must be at least 2, got {value}")
    return args


def dry_run_ours(rooms: int, seed: int) -> int:
    """The dry run without the anchor: time and solve our generator alone; 0 when every
    room it made is solved at the optimal length it reports."""
    print(f"{ANCHOR_NAME} is not installed: the dry run times our generator alone")
    wrong = 0
    for setting in SETTINGS:
        ours = summarize(time_ours(setting, rooms, seed))
        print(
            f"== {setting.label} == ours: {ours.rooms} rooms, {ours.ms_mean:.3f} ms / room, "
            f"solver failures {ours.solver_failures}, claimed != solver length "
            f"{ours.claim_mismatches}"
        )
        wrong += ours.solver_failures + (ours.claim_mismatches or 0)
    return 1 if wrong else 0


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; return the process exit status."""
    args = parse_args(argv)
    room_utils = load_room_utils()
    if room_utils is None and args.dry_run:
        return dry_run_ours(args.rooms, args.seed)
    if room_utils is None:
        print(f"{ANCHOR_NAME} is not installed; {INSTALL_HINT}", file=sys.stderr)
        return 1
    env = environment()
    print(", ".join(f"{key} {value}" for key, value in env.items()), flush=True)
    results = []
    for setting in SETTINGS:
        anchor_rooms = args.anchor_rooms or min(args.rooms, setting.anchor_rooms)
        result = compare(setting, args.rooms, anchor_rooms, args.seed, room_utils)
        print(f"\n{format_table(result)}", flush=True)
        results.append(result)
    if args.json is not None:
        report = {
            "environment": env,
            "seed": args.seed,
            "solver_max_states": SOLVER_MAX_STATES,
            "results": [asdict(result) for result in results],
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
