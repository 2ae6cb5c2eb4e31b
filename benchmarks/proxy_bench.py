"""The OpenAI-compatible proxy's own cost, and a training step's episodes/s through it.

Two measurements in one run (``python benchmarks/proxy_bench.py``; figures in
benchmarks/README.md):

1. **Cost per request** at 1, 64 and 256 concurrent sessions against an instant
   backend. The agents (a trajectory-mode conversation each, its history growing by a
   reply and an observation per request) run in a separate process, so this process
   does only the proxy's work: uvicorn's HTTP, FastAPI's routing, the chat template,
   the recording, the JSON. Reported: the server process's CPU time per request (the
   proxy's cost), and p50/p99 of each request's time inside the app (from the ASGI
   call to the response's last byte); the agents' latency, which at 64 sessions is
   mostly waiting behind the other sessions' requests, beside it.
2. **Episodes/s** of the rollout of a training step (the HF engine on the tiny model,
   16 groups × 8 Sokoban episodes, 5 turns of 32 tokens) through the proxy with the
   built-in env runner against the env manager's own loop, rounds interleaved; the
   ratio is the median of the rounds'.

``--dry-run``: tiny sizes, one round, to check that what is timed works.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.proxy import server as proxy_server
from agentgym.proxy.players import AgentSettings, ProxyPlayers
from agentgym.proxy.recorder import SessionRecorder
from agentgym.rollout.backends.base import SamplingParams
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, collect

sys.path.insert(0, str(Path(__file__).parent))
from rollout_bench import InstantEnv, build_model, setup, timed_config

OBSERVATION = "value 12"


@dataclass(frozen=True)
class RequestCost:
    sessions: int
    requests: int
    cpu_ms_per_request: float
    app_p50_ms: float
    app_p99_ms: float
    latency_p50_ms: float
    latency_p99_ms: float


def _agents(url_token: tuple[list[str], str], requests: int, out: Any) -> None:
    """The agents' process: one conversation per session, ``requests`` requests each."""
    import httpx

    urls, token = url_token

    async def session(client: httpx.AsyncClient, url: str) -> list[float]:
        messages = [
            {"role": "system", "content": InstantEnv().instructions},
            {"role": "user", "content": OBSERVATION},
        ]
        latencies = []
        for _ in range(requests):
            started = time.perf_counter()
            answer = await client.post(url, json={"model": "p", "messages": messages})
            latencies.append(time.perf_counter() - started)
            reply = answer.json()["choices"][0]["message"]
            messages += [reply, {"role": "user", "content": OBSERVATION}]
        return latencies

    async def main() -> list[float]:
        # one client per agent, as separate agents have: one pool of hundreds of
        # connections costs the client more than the proxy's work (its bookkeeping grows
        # with the square of its connections)
        headers = {"Authorization": f"Bearer {token}"}
        clients = [httpx.AsyncClient(headers=headers, timeout=600) for _ in urls]
        warm_up = {"model": "p", "messages": [{"role": "user", "content": "hi"}]}
        await clients[0].post(urls[0], json=warm_up)
        per_session = await asyncio.gather(
            *(session(client, url) for client, url in zip(clients[1:], urls[1:], strict=True))
        )
        for client in clients:
            await client.aclose()
        return [latency for latencies in per_session for latency in latencies]

    out.put(asyncio.run(main()))


def request_cost(sessions: int, requests: int) -> RequestCost:
    """The proxy's cost per request with ``sessions`` agents at once (see the module doc)."""
    _, backend, chat = setup(1)
    config = RolloutConfig(mode="trajectory", max_turns=10**6, sequence_length=10**6)
    spans: list[float] = []
    build = proxy_server.build_app

    def timed_app(proxy: Any) -> Any:
        app = build(proxy)

        async def wrapper(scope: Any, receive: Any, send: Any) -> None:
            started = time.perf_counter()
            await app(scope, receive, send)
            spans.append(time.perf_counter() - started)

        return wrapper

    async def main() -> tuple[list[float], float]:
        proxy_server.build_app = timed_app
        try:
            server = proxy_server.ProxyServer()
            await server.start()
        finally:
            proxy_server.build_app = build
        urls = [
            server.open(SessionRecorder(backend, chat, config)).base_url + "/chat/completions"
            for _ in range(sessions + 1)  # the first warms up
        ]
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        agents = context.Process(target=_agents, args=((urls, server.token), requests, out))
        agents.start()
        while not spans:  # the warm-up request (the agents send the others after it)
            await asyncio.sleep(0.01)
        cpu = time.process_time()
        latencies = await asyncio.to_thread(out.get)
        cpu = time.process_time() - cpu
        agents.join()
        await server.stop()
        return latencies, cpu

    latencies, cpu = asyncio.run(main())
    total = sessions * requests
    app = sorted(spans[1:])  # not the warm-up (clearing the list raced the agents' requests)
    waits = sorted(latencies)
    return RequestCost(
        sessions,
        total,
        1000 * cpu / total,
        1000 * _quantile(app, 0.5),
        1000 * _quantile(app, 0.99),
        1000 * _quantile(waits, 0.5),
        1000 * _quantile(waits, 0.99),
    )


def _quantile(values: Sequence[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


@dataclass(frozen=True)
class EpisodeRate:
    own: list[float]
    proxy: list[float]

    @property
    def ratio(self) -> float:
        return statistics.median(p / o for p, o in zip(self.proxy, self.own, strict=True))


def episode_rate(
    rounds: int, groups: int, group_size: int, turns: int, engine: str = "hf"
) -> EpisodeRate:
    """Episodes/s of a step's rollout on ``engine`` (``hf`` or ``vllm``), in process and
    through the proxy."""
    from transformers import AutoTokenizer

    from agentgym.rollout.backends import make_backend

    folder = build_model(tempfile.mkdtemp(prefix="proxy-bench-"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    backend = make_backend(engine, str(folder), max_model_len=4096)
    chat = ChatTokenizer(tokenizer)
    config = timed_config(turns, sampling=SamplingParams(max_new_tokens=32, seed=0))
    players = ProxyPlayers(AgentSettings())
    own: list[float] = []
    proxy: list[float] = []

    async def main() -> None:
        manager = EnvManager(tags=["sokoban"], env_groups=groups, group_size=group_size, seed=0)
        await collect(manager, backend, chat, config)  # warm-up: both ways
        await collect(manager, backend, chat, config, players=players)
        for round_index in range(rounds):
            order = [(own, None), (proxy, players)]
            for rates, who in order if round_index % 2 == 0 else order[::-1]:
                started = time.perf_counter()
                result = await collect(manager, backend, chat, config, players=who)
                assert not any(t.failed for t in result.trajectories)
                rates.append(len(result.trajectories) / (time.perf_counter() - started))
        manager.close()
        await backend.close()

    asyncio.run(main())
    return EpisodeRate(own, proxy)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="episodes/s on")
    parser.add_argument("--rates-only", action="store_true", help="skip the request costs")
    args = parser.parse_args(argv)
    dry = args.dry_run
    sizes = [(1, 5), (4, 3)] if dry else [(1, 400), (64, 20), (256, 8)]
    costs = [] if args.rates_only else [request_cost(*size) for size in sizes]
    rounds, groups, group_size, turns = (1, 1, 2, 2) if dry else (args.rounds, 16, 8, 5)
    rate = episode_rate(rounds, groups, group_size, turns, engine=args.engine)
    print(
        "| sessions | requests | proxy CPU ms/request | in-app p50 ms | in-app p99 ms "
        "| agent latency p50 ms | p99 ms |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for c in costs:
        print(
            f"| {c.sessions} | {c.requests} | {c.cpu_ms_per_request:.2f} | {c.app_p50_ms:.2f} | "
            f"{c.app_p99_ms:.2f} | {c.latency_p50_ms:.2f} | {c.latency_p99_ms:.2f} |"
        )
    own = ", ".join(f"{r:.1f}" for r in rate.own)
    proxy = ", ".join(f"{r:.1f}" for r in rate.proxy)
    print(f"\nepisodes/s, in process: {own}; through the proxy: {proxy}; ratio {rate.ratio:.2f}")
    figures = {
        "request_cost": [vars(c) for c in costs],
        "episodes_per_second": {"own": rate.own, "proxy": rate.proxy, "ratio": rate.ratio},
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
