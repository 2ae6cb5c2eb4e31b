"""Per-step overhead of the GEM adapter (``env=gem``) against GEM called directly.

64 concurrent episodes of one GEM id: the anchor steps 64 envs made by ``gem.make``,
the contender 64 made as the rollout makes them (``make_text_env("gem", ...)``), each
on the same seeds and the same scripted actions (as the fidelity test's). Two ways to
run them: ``loop`` (every env stepped in turn in one thread, as the rollout does with an
env whose calls are inline) and ``threads`` (each env's episode in a thread of a
64-wide pool, as the rollout's env pool runs them). Rounds alternate anchor and
contender; the ratio of each pair and the median are reported, in wall time (the goal's
figure) and in the process's CPU time (which other processes' load hardly moves, on a
shared machine the steadier of the two).

    python benchmarks/gem_bench.py [--rounds 7] [--episodes 64]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

IDS = ("game:GuessTheNumber-v0", "rg:letter_counting")


def scripted(env_id: str, episode: int, round_: int) -> list[str]:
    rng = np.random.default_rng(episode + 1000 * round_)
    if env_id.startswith("rg:"):
        return [f"\\boxed{{{int(rng.integers(0, 4))}}}"]
    return [f"\\boxed{{{int(n)}}}" for n in rng.permutation(np.arange(1, 21))[:10]]


def episode(env: Any, env_id: str, index: int, round_: int) -> int:
    """One episode; returns its steps."""
    env.reset(seed=index + 1000 * round_)
    steps = 0
    for action in scripted(env_id, index, round_):
        steps += 1
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            break
    return steps


REPEATS = 8
"""Episodes per env in a round (a round is ``REPEATS × episodes`` episodes)."""


def timed_round(
    envs: list[Any], env_id: str, round_: int, pool: ThreadPoolExecutor | None
) -> tuple[float, float]:
    """Wall and CPU seconds per step (resets included) of one round."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    steps = 0
    for repeat in range(REPEATS):
        seed_round = round_ * REPEATS + repeat
        if pool is None:
            steps += sum(episode(env, env_id, i, seed_round) for i, env in enumerate(envs))
        else:
            futures = [
                pool.submit(episode, env, env_id, i, seed_round) for i, env in enumerate(envs)
            ]
            steps += sum(f.result() for f in futures)
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def measure(
    env_id: str, episodes: int, rounds: int, threads: bool
) -> tuple[list[float], list[float]]:
    """Wall seconds per step of each round: GEM direct's, the adapter's."""
    anchor, contender = measure_with_cpu(env_id, episodes, rounds, threads)
    return [wall for wall, _ in anchor], [wall for wall, _ in contender]


def measure_with_cpu(
    env_id: str, episodes: int, rounds: int, threads: bool
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Wall and CPU seconds per step of each round: GEM direct's, the adapter's."""
    import gem

    from agentgym.envs.adapter import make_text_env
    from agentgym.envs.gem.ids import gem_registry

    gem_registry()
    make_direct: Callable[[], Any] = lambda: gem.make(env_id)  # noqa: E731
    direct = [make_direct() for _ in range(episodes)]
    ours = [make_text_env("gem", {"env_id": env_id}) for _ in range(episodes)]
    pool = ThreadPoolExecutor(max_workers=episodes) if threads else None
    timed_round(direct, env_id, rounds, pool), timed_round(ours, env_id, rounds, pool)  # warm-up
    anchor, contender = [], []
    for round_ in range(rounds):
        anchor.append(timed_round(direct, env_id, round_, pool))
        contender.append(timed_round(ours, env_id, round_, pool))
    if pool is not None:
        pool.shutdown()
    return anchor, contender


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=64)
    args = parser.parse_args()
    print("| id | run | GEM direct, µs/step | adapter, µs/step | added, µs/step ", end="")
    print("| ratio per pair | median | CPU: added, µs/step | CPU: median |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for env_id in IDS:
        for threads in (False, True):
            pairs = measure_with_cpu(env_id, args.episodes, args.rounds, threads)
            anchor, contender = ([wall for wall, _ in side] for side in pairs)
            anchor_cpu, contender_cpu = ([cpu for _, cpu in side] for side in pairs)
            ratios = [c / a for a, c in zip(anchor, contender, strict=True)]
            cpu_ratios = [c / a for a, c in zip(anchor_cpu, contender_cpu, strict=True)]
            cpu_added = statistics.median(
                c - a for a, c in zip(anchor_cpu, contender_cpu, strict=True)
            )
            added = statistics.median(c - a for a, c in zip(anchor, contender, strict=True))
            print(
                f"| `{env_id}` | {'threads' if threads else 'loop'} "
                f"| {min(anchor) * 1e6:.0f}–{max(anchor) * 1e6:.0f} "
                f"| {min(contender) * 1e6:.0f}–{max(contender) * 1e6:.0f} | {added * 1e6:.1f} "
                f"| {', '.join(f'{r:.2f}' for r in ratios)} "
                f"| **{statistics.median(ratios):.2f}×** "
                f"| {cpu_added * 1e6:.1f} | {statistics.median(cpu_ratios):.2f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
