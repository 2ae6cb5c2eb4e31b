"""What an env behind HTTP costs per step: the ``http`` env against the same env in process.

Sokoban as ``env=sokoban`` plays it (``configs/env/sokoban.yaml``), 64 episodes at once,
driven as the rollout drives its envs: each episode a task on one event loop, its env
calls through :class:`~agentgym.rollout.workers.LocalEnv` (Sokoban in process runs on
the loop itself, ``inline_calls``; the ``http`` client in the rollout's thread pool of
64). No model: each episode plays a fixed list of moves from its seed, up to 10 steps.
The server is ``agentgym serve-env sokoban`` in a process of its own on loopback.

Reported per mode (median of the rounds, which alternate between the modes):

* **wall ms/step**: the batch's wall time over the steps it played (64 at once);
* **latency p50/p99 ms**: one step as its episode awaits it;
* **client CPU ms/step**: this process's CPU over the steps;
* **server CPU ms/step**: the server process's (http only; from ``/proc``).

The overhead is the http wall ms/step less the in-process one (goal ≤ 2 ms on loopback),
and the ratio their quotient. Usage::

    python benchmarks/http_env_bench.py [--episodes 64] [--rounds 5] [--dry-run]

``--dry-run``: 4 episodes, 1 round (tests/envs/test_http_env.py runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tables import print_table

from agentgym.envs.adapter import make_text_env
from agentgym.envs.http import HttpEnv
from agentgym.envs.http.server import env_config_kwargs, listening_socket
from agentgym.rollout.loop import env_pool
from agentgym.rollout.workers import LocalEnv

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10


def moves(seed: int) -> list[str]:
    """The moves episode ``seed`` plays (a seeded random walk)."""
    names = ["Up", "Down", "Left", "Right"]
    rng = np.random.default_rng(seed)
    return [f"<answer>{names[int(i)]}</answer>" for i in rng.integers(4, size=STEPS)]


async def episode(client: LocalEnv, seed: int, latencies: list[float]) -> int:
    """Reset and play ``moves(seed)``; the steps played."""
    await client.reset(seed)
    played = 0
    for move in moves(seed):
        started = time.perf_counter()
        outcome = await client.step(move)
        latencies.append(time.perf_counter() - started)
        played += 1
        if outcome.terminated or outcome.truncated:
            break
    return played


def process_cpu(pid: int | None) -> float:
    """Seconds of CPU process ``pid`` has used (0 for None)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch(clients: list[LocalEnv], first_seed: int, server: int | None) -> dict[str, float]:
    """All the clients' episodes at once; the figures of this round (``server``: the
    server's process id, for its CPU)."""
    latencies: list[float] = []

    async def run() -> int:
        played = await asyncio.gather(
            *(episode(c, first_seed + i, latencies) for i, c in enumerate(clients))
        )
        return sum(played)

    cpu, wall, served = time.process_time(), time.perf_counter(), process_cpu(server)
    steps = asyncio.run(run())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    served = process_cpu(server) - served
    latencies.sort()
    return {
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall / steps,
        "latency_p50_ms": 1e3 * latencies[len(latencies) // 2],
        "latency_p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)],
        "cpu_ms_per_step": 1e3 * cpu / steps,
        "server_cpu_ms_per_step": 1e3 * served / steps,
    }


def start_server() -> tuple[subprocess.Popen[str], str]:
    """``agentgym serve-env sokoban`` on a free loopback port, once it serves."""
    probe = listening_socket("127.0.0.1", 0)
    port = probe.getsockname()[1]
    probe.close()
    process = subprocess.Popen(
        [sys.executable, "-m", "agentgym.envs.http.serve", "sokoban", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("serving"):
        process.kill()
        raise RuntimeError(f"the env server did not start: {line!r}")
    return process, f"http://127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark and print its table (and JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    episodes, rounds = (4, 1) if args.dry_run else (args.episodes, args.rounds)
    kwargs = env_config_kwargs("sokoban")
    pool = env_pool(episodes)
    process, url = start_server()
    try:
        modes = {
            "in process": [
                LocalEnv(make_text_env("sokoban", kwargs), pool) for _ in range(episodes)
            ],
            "http": [LocalEnv(HttpEnv(base_url=url), pool) for _ in range(episodes)],
        }
        pids = {"in process": None, "http": process.pid}
        for mode, clients in modes.items():  # warm-up: connections, first rooms
            batch(clients, 10_000, pids[mode])
        figures: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for r in range(rounds):
            for mode, clients in modes.items():
                figures[mode].append(batch(clients, r * episodes, pids[mode]))
        for client in modes["http"]:
            client.env.close()
    finally:
        process.kill()
        process.wait()
    medians = {
        mode: {key: statistics.median(f[key] for f in rows) for key in rows[0]}
        for mode, rows in figures.items()
    }
    local, remote = medians["in process"], medians["http"]
    result = {
        "episodes": episodes,
        "rounds": rounds,
        "medians": medians,
        "overhead_ms_per_step": remote["wall_ms_per_step"] - local["wall_ms_per_step"],
        "ratio": remote["wall_ms_per_step"] / local["wall_ms_per_step"],
    }
    print(f"{episodes} concurrent episodes, {rounds} rounds (medians)")
    print_table(
        (
            "mode",
            "wall ms/step",
            "latency p50 / p99 ms",
            "client CPU ms/step",
            "server CPU ms/step",
        ),
        [
            (
                mode,
                f"{m['wall_ms_per_step']:.3f}",
                f"{m['latency_p50_ms']:.2f} / {m['latency_p99_ms']:.2f}",
                f"{m['cpu_ms_per_step']:.3f}",
                f"{m['server_cpu_ms_per_step']:.3f}",
            )
            for mode, m in medians.items()
        ],
    )
    print(
        f"overhead {result['overhead_ms_per_step']:.3f} ms/step (goal <= 2), "
        f"ratio {result['ratio']:.1f}x"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
