"""Env workers against in-process envs (the anchor), with pytest-benchmark.

Each group holds the same scripted-solver rollout twice: every env in this
process (the loop's thread pool, one interpreter lock) and the envs on 2 env
workers of a local Ray instance. Groups:

- ``env workers: CPU-bound tool env``: :class:`PrimeToolEnv` (a pure-Python
  tool call of about 10 ms per episode), 64 envs × 4 episodes;
- ``env workers: WebShop 100k oracle``: WebShop at 100,000 products with its
  oracle, 64 envs × 2 episodes (the 100k shop is built once, about a minute);
- ``env workers: manager overhead, 1,024 envs``: the rollout benchmark's instant
  env and backend, 8 turns each (the time per env-turn is the manager's own).

    python -m pytest benchmarks/test_env_workers_benchmark.py --benchmark-only \
        -p no:cacheprovider -s
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from env_workers_bench import WORKERS, Rollout, ray_cluster, solver_rollout
from rollout_bench import TURNS, setup

from agentgym.cluster import Cluster
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, collect

PLACES = ["in-process", f"{WORKERS} env workers"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with ray_cluster() as started:
        yield started


@pytest.fixture(scope="session")
def webshop_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("webshop-workers-bench")


def _place(request: pytest.FixtureRequest, place: str) -> Cluster | None:
    if place == "in-process":
        return None
    found: Cluster = request.getfixturevalue("cluster")
    return found


def _measure(benchmark: Any, label: str, run: Callable[[], int], rounds: int = 3) -> None:
    """Time ``run`` (which returns env-turns); print env-turns/s and this process's CPU
    per turn (the driver's, and in process the envs' too)."""
    run()  # warm-up: worker start, first resets, caches
    turns: list[int] = []
    cpu = time.process_time()
    benchmark.pedantic(lambda: turns.append(run()), rounds=rounds, iterations=1)
    cpu = (time.process_time() - cpu) / sum(turns)
    best = turns[0] / benchmark.stats.stats.min
    benchmark.extra_info.update(turns_per_second=best, process_cpu_ms_per_turn=1000 * cpu)
    print(
        f"\n{label}: {best:.1f} env-turns/s (best of {rounds}), process CPU "
        f"{1000 * cpu:.2f} ms/turn, load average {os.getloadavg()[0]:.1f}"
    )


def _rollout(rollout: Rollout, benchmark: Any, label: str) -> None:
    try:
        _measure(benchmark, label, rollout.run)
    finally:
        rollout.manager.close()


TOOL_COSTS = {
    "10 ms": {},  # primes below ~10,000 per call
    "40 ms": {"low": 24_000, "high": 26_000},
}
"""Tool call cost -> the env's kwargs (the count's range sets the work of a call)."""


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("cost", list(TOOL_COSTS))
def test_cpu_bound_tool_env(
    benchmark: Any, request: pytest.FixtureRequest, place: str, cost: str
) -> None:
    benchmark.group = f"env workers: CPU-bound tool env, {cost} a call (64 envs x 4 episodes)"
    rollout = solver_rollout(
        "prime_tool", TOOL_COSTS[cost], envs=64, episodes_per_env=4, cluster=_place(request, place)
    )
    _rollout(rollout, benchmark, f"prime tool env ({cost} a call), {place}")


@pytest.mark.parametrize("place", PLACES)
def test_webshop_100k_oracle(
    benchmark: Any, request: pytest.FixtureRequest, place: str, webshop_cache: Path
) -> None:
    benchmark.group = "env workers: WebShop 100k oracle (64 envs x 2 episodes)"
    kwargs = {"num_products": 100_000, "split": "eval", "cache_dir": str(webshop_cache)}
    rollout = solver_rollout(
        "webshop", kwargs, envs=64, episodes_per_env=2, cluster=_place(request, place)
    )
    _rollout(rollout, benchmark, f"WebShop 100k oracle, {place}")


@pytest.mark.parametrize("place", PLACES)
def test_manager_overhead_1024_envs(
    benchmark: Any, request: pytest.FixtureRequest, place: str
) -> None:
    benchmark.group = "env workers: manager overhead (1,024 envs x 8 turns)"
    envs = 1024
    manager, backend, chat = setup(envs)
    cluster = _place(request, place)
    if cluster is not None:
        manager.close()
        manager = EnvManager(
            tags=["instant_bench"],
            env_groups=envs,
            group_size=1,
            cluster=cluster,
            max_env_num_per_worker=envs // WORKERS,
        )
    config = RolloutConfig(
        mode="trajectory", max_turns=TURNS, sequence_length=4096, prefix_check="off"
    )

    def run() -> int:
        result = asyncio.run(collect(manager, backend, chat, config))
        return sum(len(t.turns) for t in result.trajectories)

    try:
        _measure(benchmark, f"manager overhead, {place}", run)
    finally:
        manager.close()
    ms = 1000 * benchmark.stats.stats.min / (envs * TURNS)
    benchmark.extra_info["ms_per_env_turn"] = ms
    print(f"manager overhead, {place}: {ms:.3f} ms per env-turn (best round)")
