"""Per-step overhead of the GEM adapter (``env=gem``) against GEM called directly.

64 concurrent episodes of one GEM id: the anchor steps 64 envs made by ``gem.make``,
the contender 64 made as the rollout makes them (``make_text_env("gem", ...)``), each
on the same seeds and the same scripted actions (as the fidelity test's). Three ways to
run them:

- ``loop``: every env stepped in turn in one thread, nothing between the calls (the
  adapter's own cost, on the smallest base);
- ``threads``: each env's episode in a thread of a 64-wide pool (a runner with a thread
  per env, as ROLL's env managers are);
- ``rollout``: the 64 episodes on one event loop, each reset and step sent to the
  rollout's env pool (``env_pool(env_workers)``, 16 threads), as the rollout's
  ``LocalEnv`` sends the calls of an env without ``inline_calls``, GEM's among them.

Rounds alternate anchor and contender; the ratio of each pair and the median are
reported, in wall time (the goal's figure) and in the process's CPU time (which other
processes' load hardly moves, on a shared machine the steadier of the two).

    python benchmarks/gem_bench.py [--rounds 7] [--episodes 64] [--modes loop,threads,rollout]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

IDS = ("game:GuessTheNumber-v0", "rg:letter_counting")
MODES = ("loop", "threads", "rollout")


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


async def episode_in_pool(env: Any, env_id: str, index: int, round_: int, pool: Executor) -> int:
    """One episode with each call sent to ``pool`` from the event loop; returns its steps."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(pool, partial(env.reset, seed=index + 1000 * round_))
    steps = 0
    for action in scripted(env_id, index, round_):
        steps += 1
        *_, terminated, truncated, _ = await loop.run_in_executor(pool, env.step, action)
        if terminated or truncated:
            break
    return steps


async def episodes_in_pool(envs: list[Any], env_id: str, round_: int, pool: Executor) -> int:
    """The envs' episodes of one seed round, concurrent on this event loop; their steps."""
    plays = (episode_in_pool(env, env_id, i, round_, pool) for i, env in enumerate(envs))
    return sum(await asyncio.gather(*plays))


REPEATS = 8
"""Episodes per env in a round (a round is ``REPEATS × episodes`` episodes)."""


def timed_round(
    envs: list[Any], env_id: str, round_: int, mode: str, pool: Executor | None
) -> tuple[float, float]:
    """Wall and CPU seconds per step (resets included) of one round."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    steps = 0
    for repeat in range(REPEATS):
        seed_round = round_ * REPEATS + repeat
        if mode == "loop":
            steps += sum(episode(env, env_id, i, seed_round) for i, env in enumerate(envs))
        elif mode == "threads":
            assert pool is not None
            futures = [
                pool.submit(episode, env, env_id, i, seed_round) for i, env in enumerate(envs)
            ]
            steps += sum(f.result() for f in futures)
        else:
            assert pool is not None
            steps += asyncio.run(episodes_in_pool(envs, env_id, seed_round, pool))
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def measure(env_id: str, episodes: int, rounds: int, mode: str) -> tuple[list[float], list[float]]:
    """Wall seconds per step of each round: GEM direct's, the adapter's."""
    anchor, contender = measure_with_cpu(env_id, episodes, rounds, mode)
    return [wall for wall, _ in anchor], [wall for wall, _ in contender]


def mode_pool(mode: str, episodes: int) -> Executor | None:
    """The threads a mode's calls run in (None: the caller's thread)."""
    if mode == "threads":
        return ThreadPoolExecutor(max_workers=episodes)
    if mode == "rollout":
        from agentgym.rollout.loop import RolloutConfig, env_pool

        return env_pool(RolloutConfig().env_workers)  # the rollout's, kept for the process
    return None


def measure_with_cpu(
    env_id: str, episodes: int, rounds: int, mode: str
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Wall and CPU seconds per step of each round: GEM direct's, the adapter's."""
    import gem

    from agentgym.envs.adapter import make_text_env
    from agentgym.envs.gem.ids import gem_registry

    gem_registry()
    make_direct: Callable[[], Any] = lambda: gem.make(env_id)  # noqa: E731
    direct = [make_direct() for _ in range(episodes)]
    ours = [make_text_env("gem", {"env_id": env_id}) for _ in range(episodes)]
    pool = mode_pool(mode, episodes)
    for envs in (direct, ours):
        timed_round(envs, env_id, rounds, mode, pool)  # warm-up
    anchor, contender = [], []
    for round_ in range(rounds):
        anchor.append(timed_round(direct, env_id, round_, mode, pool))
        contender.append(timed_round(ours, env_id, round_, mode, pool))
    if mode == "threads" and pool is not None:
        pool.shutdown()
    return anchor, contender


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--modes", default=",".join(MODES), help="of " + ", ".join(MODES))
    args = parser.parse_args()
    print("| id | run | GEM direct, µs/step | adapter, µs/step | added, µs/step ", end="")
    print("| ratio per pair | median | CPU: added, µs/step | CPU: median |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for env_id in IDS:
        for mode in args.modes.split(","):
            pairs = measure_with_cpu(env_id, args.episodes, args.rounds, mode)
            anchor, contender = ([wall for wall, _ in side] for side in pairs)
            anchor_cpu, contender_cpu = ([cpu for _, cpu in side] for side in pairs)
            ratios = [c / a for a, c in zip(anchor, contender, strict=True)]
            cpu_ratios = [c / a for a, c in zip(anchor_cpu, contender_cpu, strict=True)]
            cpu_added = statistics.median(
                c - a for a, c in zip(anchor_cpu, contender_cpu, strict=True)
            )
            added = statistics.median(c - a for a, c in zip(anchor, contender, strict=True))
            print(
                f"| `{env_id}` | {mode} "
                f"| {min(anchor) * 1e6:.0f}–{max(anchor) * 1e6:.0f} "
                f"| {min(contender) * 1e6:.0f}–{max(contender) * 1e6:.0f} | {added * 1e6:.1f} "
                f"| {', '.join(f'{r:.2f}' for r in ratios)} "
                f"| **{statistics.median(ratios):.2f}×** "
                f"| {cpu_added * 1e6:.1f} | {statistics.median(cpu_ratios):.2f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
