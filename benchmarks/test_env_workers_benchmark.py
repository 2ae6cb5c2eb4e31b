"""Env workers against in-process envs (the anchor), with pytest-benchmark.

The throughput benchmarks play the same scripted-solver rollout two ways,
every env in this process (the loop's thread pool, one interpreter lock) and
the envs on 2 env workers of a local Ray instance, and alternate them round
by round (anchor, contender, anchor, ...): this machine's speed drifts by
20-30 % within minutes, so each ratio compares two rounds a second apart.
pytest-benchmark times the contender; the anchor's rounds, each round's
ratio and their median are in ``extra_info`` and printed. Groups:

- ``env workers: CPU-bound tool env``: :class:`PrimeToolEnv` (a pure-Python
  tool call of about 10 or 40 ms per episode), 64 envs × 8 or 4 episodes;
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
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dry import sized
from env_workers_bench import WORKERS, Rollout, ray_cluster, solver_rollout
from rollout_bench import TURNS
from scale_bench import CONFIG, instant_manager

from agentgym.cluster import Cluster
from agentgym.rollout.loop import collect

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
    if benchmark.disabled:  # --benchmark-disable: one untimed round, no stats
        return
    best = turns[0] / benchmark.stats.stats.min
    benchmark.extra_info.update(turns_per_second=best, process_cpu_ms_per_turn=1000 * cpu)
    print(
        f"\n{label}: {best:.1f} env-turns/s (best of {rounds}), process CPU "
        f"{1000 * cpu:.2f} ms/turn, load average {os.getloadavg()[0]:.1f}"
    )


def _interleaved(
    benchmark: Any, label: str, anchor: Rollout, contender: Rollout, rounds: int = 5
) -> None:
    """Time ``contender`` with pytest-benchmark, an ``anchor`` round before each of its
    rounds (in the benchmark's untimed setup); print and record the ratios."""
    anchor_rates: list[float] = []
    turns: list[int] = []

    def anchor_round() -> None:
        start = time.perf_counter()
        played = anchor.run()
        anchor_rates.append(played / (time.perf_counter() - start))

    def contender_round() -> None:
        turns.append(contender.run())

    try:
        anchor.run()  # warm-up: worker start, first resets, caches
        contender.run()
        benchmark.pedantic(contender_round, setup=anchor_round, rounds=rounds, iterations=1)
    finally:
        anchor.manager.close()
        contender.manager.close()
    if benchmark.disabled:  # one untimed round (after its anchor round), no stats
        assert len(turns) == len(anchor_rates) == 1
        assert turns[0] > 0
        return
    rates = [n / t for n, t in zip(turns, benchmark.stats.stats.data, strict=True)]
    ratios = [ours / theirs for ours, theirs in zip(rates, anchor_rates, strict=True)]
    median = statistics.median(ratios)
    benchmark.extra_info.update(
        anchor_turns_per_second=anchor_rates,
        turns_per_second=rates,
        ratios=ratios,
        median_ratio=median,
    )
    print(
        f"\n{label}: in process {_span(anchor_rates)} env-turns/s, {WORKERS} env workers "
        f"{_span(rates)}; ratio per round {', '.join(f'{r:.2f}' for r in ratios)}; "
        f"median {median:.2f}x (load average {os.getloadavg()[0]:.1f})"
    )


def _span(values: list[float]) -> str:
    return f"{min(values):.0f}-{max(values):.0f}"


TOOL_COSTS = {
    "10 ms": ({}, 8),  # primes below ~10,000 per call
    "40 ms": ({"low": 24_000, "high": 26_000}, 4),
}
"""Tool call cost -> the env's kwargs (the count's range sets the work of a call) and
episodes per env (a contender's round lasts 2-3 s)."""


@pytest.mark.parametrize("cost", sized(list(TOOL_COSTS), ["10 ms"]))
def test_cpu_bound_tool_env(benchmark: Any, cluster: Cluster, cost: str) -> None:
    kwargs, episodes = TOOL_COSTS[cost]
    benchmark.group = (
        f"env workers: CPU-bound tool env, {cost} a call (64 envs x {episodes} episodes)"
    )
    anchor, contender = (
        solver_rollout(
            "prime_tool", kwargs, envs=sized(64, 4), episodes_per_env=episodes, cluster=c
        )
        for c in (None, cluster)
    )
    _interleaved(benchmark, f"prime tool env ({cost} a call)", anchor, contender)


def test_webshop_100k_oracle(benchmark: Any, cluster: Cluster, webshop_cache: Path) -> None:
    benchmark.group = "env workers: WebShop 100k oracle (64 envs x 2 episodes)"
    kwargs = {"num_products": sized(100_000, 200), "split": "eval", "cache_dir": str(webshop_cache)}
    anchor, contender = (
        solver_rollout("webshop", kwargs, envs=sized(64, 4), episodes_per_env=2, cluster=c)
        for c in (None, cluster)
    )
    _interleaved(benchmark, "WebShop 100k oracle", anchor, contender, rounds=3)


@pytest.mark.parametrize("place", PLACES)
def test_manager_overhead_1024_envs(
    benchmark: Any, request: pytest.FixtureRequest, place: str
) -> None:
    benchmark.group = "env workers: manager overhead (1,024 envs x 8 turns)"
    envs = sized(1024, 8)
    manager, backend, chat = instant_manager(envs, _place(request, place))

    def run() -> int:
        result = asyncio.run(collect(manager, backend, chat, CONFIG))
        return sum(len(t.turns) for t in result.trajectories)

    try:
        _measure(benchmark, f"manager overhead, {place}", run)
    finally:
        manager.close()
    if benchmark.disabled:
        return
    ms = 1000 * benchmark.stats.stats.min / (envs * TURNS)
    benchmark.extra_info["ms_per_env_turn"] = ms
    print(f"manager overhead, {place}: {ms:.3f} ms per env-turn (best round)")
