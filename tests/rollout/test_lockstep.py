"""generate_opt_level: 0 (lockstep batches, ROLL's batch generation) against level 1."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from agentgym.config_checks import check_scheduling
from agentgym.errors import ConfigError
from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.lockstep import Lockstep
from agentgym.schema import TrainConfig, validate
from agentgym.trajectory import Trajectory
from tests.rollout.test_loop import run
from tests.test_config import composed


class Recording(ScriptedBackend):
    """A seeded random scripted policy that logs when each request starts and ends."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer, "random", seed=5)
        self.log: list[str] = []

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        self.log.append("start")
        await asyncio.sleep(0)  # a request of the same batch gets to start meanwhile
        generation = await super().generate(prompt_ids, params, env=env)
        self.log.append("end")
        return generation


def play(
    tokenizer: Any, level: int, max_traj_per_env: int = 1
) -> tuple[list[Trajectory], Recording]:
    backend = Recording(tokenizer)
    manager = EnvManager(
        tags=["sokoban", "frozen_lake"],
        env_groups=4,
        group_size=2,
        seed=11,
        max_traj_per_env=max_traj_per_env,
    )
    result, _ = run(manager, backend, tokenizer, max_turns=6, generate_opt_level=level)
    return result.trajectories, backend


def summary(trajectories: list[Trajectory]) -> list[tuple[Any, ...]]:
    return [
        (t.group_id, t.env_index, t.seed, [turn.response_ids for turn in t.turns], t.score)
        for t in trajectories
    ]


def blocks(log: list[str]) -> list[int]:
    """The log as runs of starts each followed by as many ends (a batch each), or []."""
    sizes, i = [], 0
    while i < len(log):
        starts = next((j for j in range(i, len(log)) if log[j] != "start"), len(log)) - i
        if starts == 0 or log[i + starts : i + 2 * starts] != ["end"] * starts:
            return []
        sizes.append(starts)
        i += 2 * starts
    return sizes


def test_level_0_plays_the_same_trajectories_in_one_batch_per_turn(tiny_tokenizer: Any) -> None:
    lockstep, backend = play(tiny_tokenizer, level=0)
    scheduled, _ = play(tiny_tokenizer, level=1)
    assert summary(lockstep) == summary(scheduled)
    turns = [len(t.turns) for t in lockstep]
    assert len(set(turns)) > 1  # random actions: episodes end at different turns
    # turn k's batch holds every episode still running at turn k, all sent before any answer
    running = [sum(n > k for n in turns) for k in range(max(turns))]
    assert blocks(backend.log) == running
    assert running[0] == 8


def test_level_0_with_several_episodes_per_env(tiny_tokenizer: Any) -> None:
    lockstep, backend = play(tiny_tokenizer, level=0, max_traj_per_env=2)
    scheduled, _ = play(tiny_tokenizer, level=1, max_traj_per_env=2)
    assert summary(lockstep) == summary(scheduled)
    sizes = blocks(backend.log)
    assert sum(sizes) == sum(len(t.turns) for t in lockstep)
    assert sizes[0] == 8 and max(sizes) == 8  # one request per env at a time


def test_a_member_that_leaves_releases_the_batch() -> None:
    class Echo:
        async def generate(self, prompt_ids: Sequence[int], params: Any, *, env: Any = None) -> Any:
            return list(prompt_ids)

    async def main() -> tuple[list[Any], list[int]]:
        lockstep = Lockstep(Echo(), members=3)  # type: ignore[arg-type]
        first = asyncio.ensure_future(lockstep.generate([1], SamplingParams()))
        second = asyncio.ensure_future(lockstep.generate([2], SamplingParams()))
        await asyncio.sleep(0)
        assert not first.done() and lockstep.batches == []  # the third member has not asked
        lockstep.leave()
        return list(await asyncio.gather(first, second)), lockstep.batches

    answers, batches = asyncio.run(main())
    assert answers == [[1], [2]] and batches == [2]


def test_generate_opt_level_0_is_accepted_without_async_generation() -> None:
    assert validate(composed("generate_opt_level=0")).generate_opt_level == 0
    both = TrainConfig(generate_opt_level=0, async_generation_ratio=0.5)
    with pytest.raises(
        ConfigError, match=r"async_generation_ratio=0\.5 needs generate_opt_level=1"
    ):
        check_scheduling(both)  # as ROLL asserts
