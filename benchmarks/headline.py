"""The README's headline from several fresh runs of ``make run``'s job, as min / median /
max: validation success at step 0 and at the end, the gain, the peak, and the run's
duration without the model cache (the first run builds the tiny model) and with it.

Each run is ``python -m agentgym.train env=sokoban`` (``make run``'s command) in a new
output folder; the first builds the tiny model in a new ``model.cache_dir``, the others
reuse it. Run ``n`` (from 0) trains with ``seed=n``: run 0 is ``make run``'s job
exactly, the others show the spread a change of seed gives (``--same-seed``: all seed 0,
the spread of one job on this machine). The machine, its load and its thread settings
are printed with the figures.

    python benchmarks/headline.py [--runs 3] [--same-seed] [--json PATH] [key=value ...]

``--dry-run`` (CI): two runs of 1 step at ``first_run.py``'s tiny sizes, validated on 4
episodes at steps 0 and 1; it checks the table, not the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from first_run import DRY
from machine import machine, print_machine

COMMAND = ("-m", "agentgym.train", "env=sokoban")
"""``make run``'s job."""

DRY_RUN = (
    *DRY, "max_steps=1", "eval_steps=1", "val_batch_size=4", "val_env_manager.env_groups=4",
)  # fmt: skip
"""The dry run's overrides."""

SUCCESS = "val/all/success"
"""The validation success rate the README quotes (every validation env's episodes)."""


def one_run(folder: Path, cache: Path, overrides: list[str]) -> dict[str, Any]:
    """One run's duration and its validation success at each validated step."""
    command = [sys.executable, *COMMAND, f"model.cache_dir={cache}", f"output_dir={folder}"]
    started = time.perf_counter()
    done = subprocess.run([*command, *overrides], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    curve = {}
    for line in (folder / "logs" / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if SUCCESS in row:
            curve[int(row["step"])] = float(row[SUCCESS])
    if len(curve) < 2:
        raise RuntimeError(f"run in {folder} validated {len(curve)} time(s); need start and end")
    steps = sorted(curve)
    start, end = curve[steps[0]], curve[steps[-1]]
    return {
        "seconds": seconds,
        "start": start,
        "end": end,
        "gain": end - start,
        "peak": max(curve.values()),
        "peak_step": max(steps, key=lambda s: curve[s]),
        "curve": curve,
    }


def spread(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    """``min / median / max``."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return " / ".join(f"{v * scale:.{digits}f}" for v in (low, mid, high))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--same-seed", action="store_true", help="every run with seed 0")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="2 tiny runs of 1 step")
    parser.add_argument("overrides", nargs="*", help="key=value for every run (e.g. max_steps)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.dry_run:
        args.runs, args.overrides = 2, [*DRY_RUN, *args.overrides]
    settings = machine()
    print("machine:")
    print_machine(settings)
    root = Path(tempfile.mkdtemp(prefix="agentgym-headline-"))
    runs = []
    for number in range(args.runs):
        seed = 0 if args.same_seed else number
        run = one_run(root / f"run{number}", root / "cache", [f"seed={seed}", *args.overrides])
        runs.append(run)
        cached = "without the model cache" if number == 0 else "with the model cache"
        print(
            f"run {number + 1} (seed {seed}): {run['start']:.3f} -> {run['end']:.3f} "
            f"({run['gain'] * 100:+.1f} points; peak {run['peak']:.3f} at step "
            f"{run['peak_step']}) in {run['seconds']:.0f} s ({cached})",
            flush=True,
        )
    print(f"\n| figure ({len(runs)} runs) | min / median / max |")
    print("| --- | --- |")
    print(f"| validation success at step 0 | {spread([r['start'] for r in runs])} |")
    print(f"| at the last step | {spread([r['end'] for r in runs])} |")
    print(f"| gain, points | {spread([r['gain'] for r in runs], 100, 1)} |")
    print(f"| peak | {spread([r['peak'] for r in runs])} |")
    print(f"| duration without the model cache, s | {runs[0]['seconds']:.0f} |")
    if len(runs) > 1:
        print(f"| duration with it, s | {spread([r['seconds'] for r in runs[1:]], 1, 0)} |")
    print(f"\nload average after the runs: {machine()['load_average']}")
    if args.json:
        args.json.write_text(json.dumps({"machine": settings, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
