"""The env manager's own cost as the work grows: 128, 1,024 and 8,192 concurrent
episodes, in process and on 2 env workers of a local Ray instance.

The rollout benchmark's instant env and instant backend (:mod:`rollout_bench`), 8 turns
an episode, so that a collection's wall time is the manager's own work per env-turn
(chat rendering, tokenization, scheduling, the env hop, the bookkeeping) and its memory
is what the manager keeps per episode (Python's traced allocations in this process at
their peak, in a second collection; on env workers the envs live in the workers, so the
driver's figure is what the driver keeps per episode). The slope is the ratio of the
per-turn time at the largest size to that at the smallest (goal: within 1.5×); memory per
episode should stay constant.

    python benchmarks/scale_bench.py [--sizes 128 1024 8192] [--rounds 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from env_workers_bench import WORKERS, ray_cluster
from rollout_bench import TURNS, setup, timed_config

from agentgym.cluster import Cluster
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import collect

CONFIG = timed_config(TURNS)


def instant_manager(envs: int, cluster: Cluster | None) -> tuple[EnvManager, Any, Any]:
    """The instant env's manager of ``envs`` episodes (on ``cluster``'s workers if given)."""
    built, backend, chat = setup(envs)
    if cluster is None:
        return built, backend, chat
    built.close()
    placed = EnvManager(
        tags=["instant_bench"],
        env_groups=envs,
        group_size=1,
        cluster=cluster,
        max_env_num_per_worker=envs // WORKERS,
    )
    return placed, backend, chat


def measure(envs: int, cluster: Cluster | None, rounds: int) -> dict[str, float]:
    """The best of ``rounds`` collections' ms per env-turn, and bytes per episode."""
    placed, backend, chat = instant_manager(envs, cluster)
    try:
        best = float("inf")
        for _ in range(rounds):
            started = time.perf_counter()
            result = asyncio.run(collect(placed, backend, chat, CONFIG))
            seconds = time.perf_counter() - started
            turns = sum(len(t.turns) for t in result.trajectories)
            assert turns == envs * TURNS
            assert not any(t.failed for t in result.trajectories)
            best = min(best, seconds / turns)
        tracemalloc.start()
        asyncio.run(collect(placed, backend, chat, CONFIG))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        placed.close()
    return {"ms_per_env_turn": 1000 * best, "bytes_per_episode": peak / envs}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 1024, 8192])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="tiny: 8 and 16 episodes, 1 round")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.sizes, args.rounds = [8, 16], 1
    figures: dict[str, dict[int, dict[str, float]]] = {"in process": {}}
    for size in args.sizes:
        figures["in process"][size] = measure(size, None, args.rounds)
    with ray_cluster() as cluster:
        place = f"{WORKERS} env workers"
        figures[place] = {size: measure(size, cluster, args.rounds) for size in args.sizes}
    print(f"instant env and backend, {TURNS} turns an episode; best of {args.rounds} rounds")
    print("| where | episodes | ms per env-turn | KiB per episode |")
    print("| --- | ---: | ---: | ---: |")
    slopes = {}
    for place, rows in figures.items():
        for size, row in rows.items():
            print(
                f"| {place} | {size:,} | {row['ms_per_env_turn']:.3f} | "
                f"{row['bytes_per_episode'] / 1024:.1f} |"
            )
        first, last = rows[min(rows)], rows[max(rows)]
        slopes[place] = last["ms_per_env_turn"] / first["ms_per_env_turn"]
    for place, slope in slopes.items():
        print(f"{place}: per-turn time {max(args.sizes):,} ÷ {min(args.sizes):,} = {slope:.2f}×")
    result = {"figures": figures, "slopes": slopes}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
