"""How long the first run of each env takes to reach its first training step, from an
empty model cache (the tiny model, its tokenizer and its warm start are built first).

Each env runs ``python -m agentgym.train env=<env> max_steps=1 eval_steps=0`` with a
fresh ``model.cache_dir`` in a fresh folder; the figure is the wall time until the
``step 1/1`` line, and where the time went before it (the lines the run printed, with
their times). Goal (issue 48): at most 3 minutes on the 2-core CPU machine.

    python benchmarks/first_run.py [--envs sokoban ...] [--limit 900] [--override K=V ...]

``--override``: more of the run's overrides (e.g. ``model.warm_start.steps=2``).
``--dry-run``: Sokoban alone, with :data:`DRY` (a 2-step warm start, a 4-episode step
on the HF engine), and an exit status of 1 unless it reached its first step.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

ENVS = ("sokoban", "frozen_lake", "webshop", "math_tool", "sql", "search_qa", "math_workflow")
DRY = (
    "model.warm_start.steps=2", "model.warm_start.batch_size=8",
    "model.warm_start.examples_per_env=64", "generation=hf", "max_turns=2",
    "train_env_manager.env_groups=2", "train_env_manager.group_size=2", "rollout_batch_size=4",
    "actor_train.training_args.per_device_train_batch_size=2",
    "actor_train.training_args.gradient_accumulation_steps=2",
)  # fmt: skip
"""The dry run's overrides: what is timed runs, at the smallest sizes."""


def first_step(
    env: str, limit: float, overrides: Iterable[str] = ()
) -> tuple[float | None, list[tuple[float, str]]]:
    """Seconds until ``env``'s first step line (None: not within ``limit``), and the
    run's lines with the second each came at (``overrides``: more of the run's)."""
    folder = Path(tempfile.mkdtemp(prefix=f"first-run-{env}-"))
    command = [
        sys.executable, "-m", "agentgym.train", f"env={env}", "max_steps=1", "eval_steps=0",
        f"model.cache_dir={folder / 'cache'}", f"output_dir={folder / 'run'}", *overrides,
    ]  # fmt: skip
    started = time.perf_counter()
    lines: list[tuple[float, str]] = []
    process = subprocess.Popen(  # its own process group: the engine's process goes with it
        command,
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    reached = None
    try:
        for line in process.stdout:
            now = time.perf_counter() - started
            lines.append((now, line.rstrip()))
            if line.startswith("step 1/"):
                reached = now
                break
            if now > limit:
                break
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return reached, lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=list(ENVS))
    parser.add_argument("--limit", type=float, default=900.0, help="seconds before giving up")
    parser.add_argument("--override", action="append", default=[], help="KEY=VALUE of the run")
    parser.add_argument("--dry-run", action="store_true", help="Sokoban, tiny (DRY)")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.envs, args.override = ["sokoban"], [*DRY, *args.override]
    rows = []
    for env in args.envs:
        reached, lines = first_step(env, args.limit, args.override)
        said = [f"{t:.0f}s {text[:70]}" for t, text in lines if not text.startswith(" ")][-4:]
        rows.append((env, reached))
        shown = f"{reached:.0f} s" if reached is not None else f"> {args.limit:.0f} s"
        print(f"{env}: step 1 at {shown}; last lines: {' | '.join(said)}", flush=True)
    print("\n| env | first step, from an empty model cache | goal <= 180 s |")
    print("| --- | ---: | --- |")
    for env, reached in rows:
        met = "met" if reached is not None and reached <= 180 else "not met"
        shown = f"{reached:.0f} s" if reached is not None else f"> {args.limit:.0f} s"
        print(f"| `{env}` | {shown} | {met} |")
    if args.dry_run and any(reached is None for _, reached in rows):
        raise SystemExit("the dry run never reached its first step")


if __name__ == "__main__":
    main()
