"""Step time with and without extra groups (ROLL's ``is_use_additional_prompts``)
against a simulated backend whose episodes have long-tailed durations.

Each episode draws a slowness factor from a log-normal distribution (σ = 1) when
it starts; each of its requests then takes ``BASE_SECONDS × factor`` (an
``asyncio.sleep``: the backend uses no CPU, so the figures are the scheduling's).
A step keeps ``GROUPS`` groups of ``GROUP_SIZE``; with extra groups it ends when
the first ``GROUPS`` groups are complete and cancels the rest.

Run: ``python -m pytest benchmarks/test_extra_prompts_benchmark.py --benchmark-only -s``.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from dry import sized
from rollout_bench import InstantEnv, timed_config

import agentgym
from agentgym.models.tiny import build_tokenizer
from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import collect

GROUPS = sized(16, 2)
GROUP_SIZE = 4
TURNS = 4
BASE_SECONDS = 0.02
SIGMA = 1.0
STEPS = 8


class LongTailBackend:
    """Answers after ``base × factor`` seconds; ``factor`` is log-normal, drawn per episode."""

    def __init__(self, response_ids: Sequence[int], base: float, sigma: float, seed: int) -> None:
        self.response_ids = list(response_ids)
        self.base = base
        self.sigma = sigma
        self.random = random.Random(seed)
        self.factors: dict[int, float] = {}

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        if env.num_steps == 0:  # the episode's first request
            self.factors[id(env)] = math.exp(self.random.gauss(0.0, self.sigma))
        await asyncio.sleep(self.base * self.factors[id(env)])
        return Generation(self.response_ids, [0.0] * len(self.response_ids), "stop")

    async def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        return None

    async def close(self) -> None:
        return None


def _setup(extra: int) -> tuple[EnvManager, LongTailBackend, ChatTokenizer]:
    if "instant_bench" not in agentgym.list_envs():
        agentgym.register("instant_bench", InstantEnv)
    tokenizer = build_tokenizer(
        [InstantEnv().instructions, "value 12", "<answer>Up</answer>"] * 4, 300, "chatml"
    )
    manager = EnvManager(
        tags=["instant_bench"], env_groups=GROUPS, group_size=GROUP_SIZE, additional_groups=extra
    )
    response = [*tokenizer.encode("<answer>Up</answer>"), tokenizer.eos_token_id]
    return manager, LongTailBackend(response, BASE_SECONDS, SIGMA, seed=0), ChatTokenizer(tokenizer)


@pytest.mark.parametrize("extra", sized([0, 2, 4, 8, 16], [0, 2]))
def test_step_time_with_extra_groups(benchmark: Any, extra: int) -> None:
    manager, backend, chat = _setup(extra)
    config = timed_config(TURNS)
    cancelled: list[float] = []

    def step() -> None:
        result = asyncio.run(collect(manager, backend, chat, config))
        assert len(result.trajectories) == GROUPS * GROUP_SIZE
        cancelled.append(result.metrics.get("scheduling/cancelled_episodes", 0.0))

    benchmark.pedantic(step, rounds=STEPS, iterations=1)
    benchmark.extra_info["extra_groups"] = extra
    benchmark.extra_info["cancelled_per_step"] = sum(cancelled) / len(cancelled)
    if benchmark.disabled:  # --benchmark-disable: one untimed round, no stats
        return
    print(
        f"\nextra groups {extra:2d}: step {benchmark.stats.stats.mean:.3f} s mean, "
        f"{benchmark.stats.stats.median:.3f} s median; "
        f"{sum(cancelled) / len(cancelled):.1f} episodes cancelled per step"
    )
