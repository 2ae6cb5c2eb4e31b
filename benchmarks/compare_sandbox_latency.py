"""Python-tool call latency: our sandbox against a bare ``python -c`` subprocess.

The anchor is what GEM and ROLL do for their Python tools: one
``subprocess.run([python, "-c", code])`` per call, with no isolation. Ours is
:class:`agentgym.envs.tools.sandbox.PythonSandbox` with namespaces on, in its
default pre-forked mode (a zygote per worker) and with ``prefork=False`` (a new
interpreter per call). Each mode runs the same tiny program; the script prints
p50 / p99 latency of sequential calls and calls per second, sequential and
with one call in flight per core.

Usage::

    python benchmarks/compare_sandbox_latency.py [--calls 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from agentgym.envs.tools.sandbox import PythonSandbox, WorkerPool

CODE = "print(sum(range(1000)))"
EXPECTED = "499500"


def bare_call() -> str:
    """The anchor: a bare interpreter per call, no isolation."""
    done = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout


def measure(call: Callable[[], str], calls: int, workers: int) -> dict[str, float]:
    """Sequential latency percentiles and calls/s, then calls/s with ``workers`` in flight."""
    for _ in range(5):  # warm-up: zygotes, page cache
        assert call().strip() == EXPECTED
    latencies = []
    for _ in range(calls):
        started = time.perf_counter()
        output = call()
        latencies.append(time.perf_counter() - started)
        assert output.strip() == EXPECTED, output
    latencies.sort()
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as executor:
        outputs = list(executor.map(lambda _: call(), range(calls)))
    concurrent = calls / (time.perf_counter() - started)
    assert all(output.strip() == EXPECTED for output in outputs)
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "sequential_calls_per_s": calls / sum(latencies),
        "concurrent_calls_per_s": concurrent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--dry-run", action="store_true", help="tiny: 5 calls, 2 workers")
    args = parser.parse_args()
    if args.dry_run:
        args.calls, args.workers = 5, 2

    zygotes = WorkerPool(args.workers)
    one_shot = WorkerPool(args.workers, prefork=False)
    sandbox = PythonSandbox(isolation="namespaces", pool=zygotes)
    sandbox_one_shot = PythonSandbox(isolation="namespaces", pool=one_shot)
    modes: dict[str, Callable[[], str]] = {
        "bare `python -c` (anchor)": bare_call,
        "sandbox, zygote per worker": lambda: sandbox.run(CODE).output,
        "sandbox, interpreter per call": lambda: sandbox_one_shot.run(CODE).output,
    }
    try:
        figures = {name: measure(call, args.calls, args.workers) for name, call in modes.items()}
    finally:
        zygotes.close()
        one_shot.close()
    anchor = figures["bare `python -c` (anchor)"]["p50_ms"]
    print(f"isolation: {sandbox.isolation_detail}")
    print(f"{args.calls} calls of {CODE!r}; concurrent runs use {args.workers} workers\n")
    header = (
        f"{'mode':32} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>8} {'conc. calls/s':>14} "
        f"{'p50 vs anchor':>14}"
    )
    print(header)
    print("-" * len(header))
    for name, row in figures.items():
        print(
            f"{name:32} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} "
            f"{row['sequential_calls_per_s']:8.1f} {row['concurrent_calls_per_s']:14.1f} "
            f"{anchor / row['p50_ms']:13.2f}x"
        )
    if args.json:
        meta = {
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "isolation": sandbox.isolation_detail,
            "calls": args.calls,
            "workers": args.workers,
        }
        with open(args.json, "w") as handle:
            json.dump({"meta": meta, "figures": figures}, handle, indent=2)


if __name__ == "__main__":
    main()
