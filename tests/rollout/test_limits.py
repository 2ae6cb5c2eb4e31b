"""Scheduling: extra groups close a step early, a cap on requests per engine, the keys."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from agentgym.errors import ConfigError
from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.limits import BatchCloser, RequestCap
from agentgym.rollout.loop import RolloutConfig, collect
from agentgym.rollout.router import Router
from agentgym.schema import validate
from agentgym.trajectory import Trajectory
from tests.rollout.test_loop import run
from tests.test_config import composed


def _trajectory(group_id: int) -> Trajectory:
    return Trajectory(env_name="e", tag="e", group_id=group_id, seed=0, env_index=0, mode="step")


def test_the_batch_is_the_first_groups_to_complete() -> None:
    closer = BatchCloser(needed=2, group_size=2)
    done = [closer.add(_trajectory(group)) for group in (5, 3, 5, 7, 3, 7)]
    # 5 completes at the 3rd, 3 at the 5th: the batch is complete there
    assert done == [False, False, False, False, True, True]
    assert closer.complete == [5, 3]  # 7 completed too late to be counted
    assert [t.group_id for t in closer.batch()] == [5, 5, 3, 3]
    assert closer.finished == 6


def test_extra_groups_play_the_batch_tags_in_turn() -> None:
    manager = EnvManager(
        tags=["sokoban", "frozen_lake"],
        n_groups=[2, 1],
        env_groups=3,
        group_size=1,
        additional_groups=4,
    )
    batch = ["sokoban", "sokoban", "frozen_lake"]
    assert manager.group_tags == batch + batch + ["sokoban"]
    assert len(manager.slots) == 7
    assert manager.batch_size == 3
    assert [episodes[0].group_id for episodes in manager.assignments()] == list(range(7))
    assert manager.cursor == 7  # the extra groups' seeds are used up too


class GatedBackend(ScriptedBackend):
    """A scripted solver: requests from the envs in ``hang`` never return; those from
    the envs in ``gated`` wait until ``release`` is set."""

    def __init__(self, tokenizer: Any, hang: set[int], gated: set[int]) -> None:
        super().__init__(tokenizer)
        self.hang, self.gated = hang, gated
        self.release = asyncio.Event()
        self.cancelled = 0

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        try:
            if id(env) in self.hang:
                await asyncio.Event().wait()
            if id(env) in self.gated:
                await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return await super().generate(prompt_ids, params, env=env)


def _collect(manager: EnvManager, backend: GatedBackend, tokenizer: Any) -> tuple[Any, list[int]]:
    order: list[int] = []

    def finished(trajectory: Trajectory) -> None:
        order.append(trajectory.group_id)
        backend.release.set()  # the others go on once one episode has finished

    async def main() -> Any:
        backend.release = asyncio.Event()
        return await collect(
            manager,
            backend,
            ChatTokenizer(tokenizer),
            RolloutConfig(max_turns=40, sampling=SamplingParams(max_new_tokens=12)),
            on_trajectory=finished,
        )

    return asyncio.run(main()), order


def test_a_step_with_extra_groups_ends_without_the_slowest_group(tiny_tokenizer: Any) -> None:
    manager = EnvManager(tags=["sokoban"], env_groups=2, group_size=2, additional_groups=1)
    envs = [id(slot.env) for slot in manager.slots]
    # group 0: member 0 finishes first, member 1 hangs; groups 1 and 2 go on after member 0
    backend = GatedBackend(tiny_tokenizer, hang={envs[1]}, gated=set(envs[2:]))
    result, order = _collect(manager, backend, tiny_tokenizer)
    assert [t.group_id for t in result.trajectories] == [1, 1, 2, 2]
    assert all(t.success for t in result.trajectories)
    assert result.metrics["scheduling/cancelled_episodes"] == 1.0  # the hung one
    assert result.metrics["scheduling/dropped_episodes"] == 1.0  # its finished partner
    assert result.metrics["all/trajectories"] == 4.0
    assert order[0] == 0 and sorted(order) == [0, 1, 1, 2, 2]
    assert backend.cancelled == 1
    # the env of the cancelled episode plays the next step
    backend.hang.clear()
    again, _ = _collect(manager, backend, tiny_tokenizer)
    assert len(again.trajectories) == 4
    assert {t.group_id for t in again.trajectories} <= {3, 4, 5}
    assert (
        again.metrics["scheduling/cancelled_episodes"]
        + len(again.trajectories)
        + (again.metrics["scheduling/dropped_episodes"])
        == 6
    )


def test_without_extra_groups_every_group_is_kept(tiny_tokenizer: Any) -> None:
    manager = EnvManager(tags=["sokoban"], env_groups=2, group_size=2)
    result, _ = run(manager, ScriptedBackend(tiny_tokenizer), tiny_tokenizer, max_turns=40)
    assert [t.group_id for t in result.trajectories] == [0, 0, 1, 1]
    assert "scheduling/cancelled_episodes" not in result.metrics


class CountingBackend:
    """Records the most requests it ever had in flight."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.served = 0

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        self.running += 1
        self.peak = max(self.peak, self.running)
        for _ in range(3):  # let every other request in that may come in
            await asyncio.sleep(0)
        self.running -= 1
        self.served += 1
        return Generation([1], [0.0], "stop")

    async def update_weights(self, weights: Any) -> None: ...

    async def close(self) -> None: ...


async def _requests(backend: Any, count: int) -> None:
    await asyncio.gather(*(backend.generate([1], SamplingParams()) for _ in range(count)))


def test_request_cap_holds_requests_in_flight_to_the_limit() -> None:
    free, capped = CountingBackend(), CountingBackend()
    asyncio.run(_requests(free, 5))
    asyncio.run(_requests(RequestCap(capped, 2), 5))
    assert (free.peak, capped.peak) == (5, 2)
    assert capped.served == 5
    assert RequestCap(capped, 2).served == 5  # the rest is the backend's
    with pytest.raises(ValueError, match="max_running_requests must be >= 1"):
        RequestCap(capped, 0)


def test_router_caps_the_requests_of_each_engine() -> None:
    engines = [CountingBackend(), CountingBackend()]
    asyncio.run(_requests(Router(engines, max_running_requests=1), 6))
    assert [e.peak for e in engines] == [1, 1]
    assert sum(e.served for e in engines) == 6
    free = [CountingBackend(), CountingBackend()]
    asyncio.run(_requests(Router(free), 6))
    assert [e.peak for e in free] == [3, 3]


def test_num_return_sequences_in_group_is_the_group_size() -> None:
    config = validate(
        composed("num_return_sequences_in_group=4", "rollout_batch_size=64", "eval_steps=0")
    )
    assert config.train_env_manager.group_size == 4
    with pytest.raises(ConfigError, match="num_return_sequences_in_group=4 is the group size"):
        validate(composed("num_return_sequences_in_group=4", "train_env_manager.group_size=2"))


def test_scheduling_keys_are_checked() -> None:
    with pytest.raises(ConfigError, match="max_additional_running_prompts=0: set it >= 1"):
        validate(composed("is_use_additional_prompts=true", "max_additional_running_prompts=0"))
    config = validate(
        composed(
            "is_use_additional_prompts=true",
            "max_running_requests=8",
            "is_num_return_sequences_expand=true",
        )
    )
    assert (config.max_additional_running_prompts, config.max_running_requests) == (16, 8)


def test_extra_groups_with_async_generation_fail_before_any_model_work() -> None:
    with pytest.raises(ConfigError, match="order their episodes were admitted"):
        validate(composed("is_use_additional_prompts=true", "async_generation_ratio=1"))
