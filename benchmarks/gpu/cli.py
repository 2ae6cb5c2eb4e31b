"""``python -m benchmarks.gpu [--minutes 8] [--dry-run] [--json out.json] [--only a,b]
[--kernels]``."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .async_ratio import async_ratio
from .decoupled import decoupled_sync
from .engine import generation, peak, weight_sync
from .models import DRY, GPU, Settings
from .runner import Context, Item, Row, run_item, table
from .training import fsdp2_step, megatron_planned, megatron_tp1, planner_fit, torch_step

ITEMS: dict[str, tuple[Item, float]] = {
    "peak": (peak, 0.03),
    "megatron_tp1": (megatron_tp1, 0.17),
    "megatron_planned": (megatron_planned, 0.17),
    "planner_fit": (planner_fit, 0.12),
    "torch_step": (torch_step, 0.15),
    "fsdp2_step": (fsdp2_step, 0.15),
    "generation": (generation, 0.12),
    "weight_sync": (weight_sync, 0.12),
    "decoupled_sync": (decoupled_sync, 0.10),
    "async_ratio": (async_ratio, 0.24),
}
"""Item name -> (function, its weight in the time left). ``peak`` runs first: MFU needs it."""

SETUP_SHARE = 0.1
"""The share of ``--minutes`` kept for building the model folders."""


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu",
        description="The GPU suite: Megatron, torch and FSDP2 train steps (tokens/s, MFU, "
        "peak memory), HF generation, weight sync in process and between a decoupled "
        "job's processes, async ratio 0 vs 1; one table, also as JSON.",
    )
    p.add_argument("--minutes", type=float, default=8.0, help="the whole suite's time budget")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="on the CPU with tiny shapes: every item end to end in seconds (CI)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the table as JSON here")
    p.add_argument("--only", default=None, help=f"comma-separated items of {list(ITEMS)}")
    p.add_argument(
        "--kernels",
        action="store_true",
        help="the train steps profile one more step: their top kernels, the device's busy "
        "share and the matmul/attention/other shares (what keeps MFU down)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="model folders and run outputs (default: a temporary folder)",
    )
    return p


def selected(only: str | None) -> list[str]:
    """The items to run, in suite order.

    Raises:
        SystemExit: Naming an unknown item and the close ones.
    """
    if only is None:
        return list(ITEMS)
    names = [name.strip() for name in only.split(",") if name.strip()]
    for name in names:
        if name not in ITEMS:
            close = difflib.get_close_matches(name, ITEMS, n=2)
            hint = f"; did you mean {close}?" if close else ""
            raise SystemExit(f"unknown item {name!r}: valid items are {list(ITEMS)}{hint}")
    return [name for name in ITEMS if name in names]


def machine(settings: Settings) -> dict[str, Any]:
    """Where the figures come from."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": settings.device,
        "host": platform.node(),
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    if settings.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_memory_gib": props.total_memory / 2**30}
    try:
        from importlib.metadata import version

        info["transformers"] = version("transformers")
        info["megatron_core"] = version("megatron-core")
    except Exception as error:  # a missing package is a fact to record, not a failure
        info["missing"] = str(error)
    return info


def run_suite(
    names: Sequence[str],
    settings: Settings,
    minutes: float,
    work_dir: Path,
    on_row: Callable[[list[Row]], None] = lambda rows: None,
    kernels: bool = False,
) -> list[Row]:
    """Build the models, then run ``names`` one after another, each with its share of
    the time left; ``on_row`` gets the rows so far after each one (a run cut short by
    its machine's time limit keeps what it measured); ``kernels``: the train steps
    profile one more step (:func:`~benchmarks.gpu.runner.kernel_profile`)."""
    started = time.perf_counter()
    total = minutes * 60
    ctx = Context(settings, work_dir, kernels=kernels)
    setup = Row("models", "ok", 0.0, total * SETUP_SHARE, {})
    try:
        shapes = {settings.train_shape, settings.sync_shape, settings.async_shape}
        for shape in shapes:
            ctx.model(shape)
        setup.figures["folders"] = float(len(shapes))
    except Exception as error:
        setup.status, setup.error = "error", f"{type(error).__name__}: {error}"
    setup.seconds = time.perf_counter() - started
    rows = [setup]
    on_row(rows)
    for index, name in enumerate(names):
        item, weight = ITEMS[name]
        left = total - (time.perf_counter() - started)
        weights = sum(ITEMS[later][1] for later in names[index:])
        budget = max(left * weight / weights, 1.0)
        print(f"[{name}] budget {budget:.0f} s", flush=True)
        rows.append(run_item(name, item, ctx, budget))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        on_row(rows)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Run the suite, print each item's row as it ends and the table at the end, write the
    JSON after each item (``complete`` false until the last); exit 1 when an item failed."""
    args = parser().parse_args(argv)
    names = selected(args.only)
    settings = DRY if args.dry_run else GPU
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run on a GPU machine, or pass --dry-run")
    started = time.perf_counter()

    def write(rows: list[Row]) -> None:
        if args.json is None:
            return
        report = {
            "dry_run": args.dry_run,
            "minutes": args.minutes,
            "seconds": time.perf_counter() - started,
            "complete": len(rows) == len(names) + 1,
            "machine": machine(settings),
            "settings": settings.as_dict(),
            "items": [row.as_dict() for row in rows],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="gpu-suite-") as scratch:
        work_dir = args.work_dir or Path(scratch)
        rows = run_suite(names, settings, args.minutes, work_dir, write, args.kernels)
        elapsed = time.perf_counter() - started
    write(rows)
    print(f"\nGPU suite ({'dry run, CPU' if args.dry_run else settings.device}), {elapsed:.0f} s")
    print(table(rows))
    if args.json is not None:
        print(f"wrote {args.json}")
    if any(row.status != "ok" for row in rows):
        sys.exit(1)
