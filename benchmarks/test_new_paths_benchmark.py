"""The paths that bring agents and envs from elsewhere, each against its anchor in one run
(pytest-benchmark), so that one command gives the three ratios side by side:

- ``the proxy``: a step's rollout (16 groups × 8, 5 turns, the tiny model on HF) through
  the OpenAI-compatible proxy against the in-process env manager: episodes/s, rounds
  alternating (:func:`proxy_bench.episode_rate`);
- ``GEM``: 64 concurrent episodes of each of GEM's two fidelity ids through the adapter
  (``env=gem``) against ``gem.make``'s envs stepped directly: seconds per step, rounds
  alternating, in a loop and as the rollout sends the calls (:func:`gem_bench.measure`;
  skipped without the ``gem`` extra);
- ``HTTP``: 64 concurrent Sokoban episodes through the http env on an env server in its
  own process against the env in process: milliseconds per step
  (:func:`http_env_bench.main`).

pytest-benchmark times each contender's whole measurement once; the figures (each
round's anchor and contender, the ratio of their medians) are in ``extra_info`` and
printed.

    python -m pytest benchmarks/test_new_paths_benchmark.py --benchmark-only \
        -p no:cacheprovider -s
"""

from __future__ import annotations

import importlib.util
import statistics
from typing import Any

import pytest
from dry import DRY, sized

GEM_IDS = ("game:GuessTheNumber-v0", "rg:letter_counting")


def _once(benchmark: Any, measure: Any) -> Any:
    return benchmark.pedantic(measure, rounds=1, iterations=1)


@pytest.mark.skipif(DRY, reason="CI runs proxy_bench.py --dry-run: tests/proxy/test_proxy_bench.py")
@pytest.mark.benchmark(group="new paths: the proxy against the env manager")
def test_proxy_episodes_per_second(benchmark: Any) -> None:
    from proxy_bench import episode_rate

    rate = _once(benchmark, lambda: episode_rate(rounds=3, groups=16, group_size=8, turns=5))
    benchmark.extra_info.update(own=rate.own, proxy=rate.proxy, ratio=rate.ratio)
    print(f"\nproxy ÷ in process, episodes/s: {rate.ratio:.2f} (goal >= 0.80)")
    assert rate.own
    assert rate.proxy


@pytest.mark.skipif(importlib.util.find_spec("gem") is None, reason="the gem extra")
@pytest.mark.benchmark(group="new paths: the GEM adapter against GEM")
@pytest.mark.parametrize("mode", ["loop", "rollout"])
@pytest.mark.parametrize("env_id", GEM_IDS)
def test_gem_adapter_seconds_per_step(benchmark: Any, env_id: str, mode: str) -> None:
    from gem_bench import measure

    anchor, contender = _once(
        benchmark, lambda: measure(env_id, episodes=sized(64, 4), rounds=sized(7, 1), mode=mode)
    )
    ratio = statistics.median(c / a for a, c in zip(anchor, contender, strict=True))
    benchmark.extra_info.update(direct=anchor, adapter=contender, ratio=ratio)
    print(f"\n{env_id}, {mode}: adapter ÷ GEM per step {ratio:.2f} (goal <= 1.1)")


@pytest.mark.skipif(DRY, reason="CI runs http_env_bench.py --dry-run: tests/envs/test_http_env.py")
@pytest.mark.benchmark(group="new paths: the http env against the env in process")
def test_http_env_milliseconds_per_step(benchmark: Any) -> None:
    from http_env_bench import main

    result = _once(benchmark, lambda: main(["--episodes", "64", "--rounds", "5"]))
    benchmark.extra_info.update(result)
    print(f"\nhttp overhead {result['overhead_ms_per_step']:.3f} ms/step (goal <= 2)")
