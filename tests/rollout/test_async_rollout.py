"""Async generation's scheduler: the admission bound, staleness of consumed batches
with a slow trainer, ratio 0 against the synchronous collect, pause (drain and abort),
a hung weight sync."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from agentgym.rollout.async_rollout import (
    AdmissionControl,
    AdmissionError,
    AsyncRollout,
    PausableBackend,
    WeightSyncTimeoutError,
    paused_update,
    staleness_bound,
)
from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, collect
from agentgym.trajectory import Trajectory

CONFIG = RolloutConfig(
    mode="trajectory", max_turns=3, sequence_length=4096, prefix_check="off",
    sampling=SamplingParams(max_new_tokens=24),
)  # fmt: skip


def manager() -> EnvManager:
    # 2 groups × 2 envs: a batch of 4 episodes
    return EnvManager(tags=["sokoban"], env_groups=2, group_size=2, seed=3)


class SlowScripted(ScriptedBackend):
    """The scripted solver, each request taking ``delay`` seconds of (simulated) generation."""

    def __init__(self, tokenizer: Any, delay: float = 0.002) -> None:
        super().__init__(tokenizer)
        self.delay = delay

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        await asyncio.sleep(self.delay)
        return await super().generate(prompt_ids, params, env=env)


def test_the_bound_by_hand() -> None:
    assert staleness_bound(1, 0, 8) == 16  # (1 + 0 + 1) × 8
    assert staleness_bound(2, 3, 4) == 24  # (2 + 3 + 1) × 4
    assert staleness_bound(0.5, 2, 4) == 14  # ⌊3.5 × 4⌋
    control = AdmissionControl(batch_size=4, ratio=1)
    for index in range(8):
        control.start(index, version=0)
    assert not control.admits(8, version=0) and control.admits(8, version=1)
    with pytest.raises(AdmissionError, match="episode 8 at version 0"):
        control.start(8, version=0)
    control.finish()
    assert (control.accepted, control.running) == (1, 7)


def run_pipeline(
    tokenizer: Any, ratio: float, steps: int
) -> tuple[list[list[Trajectory]], AsyncRollout]:
    """Consume ``steps`` batches with a deliberately slow trainer: each step lasts until
    every episode the bound admits has finished (the envs idle), then syncs."""
    backend = SlowScripted(tokenizer)
    envs = manager()
    pipeline = AsyncRollout(
        envs, PausableBackend(backend), ChatTokenizer(tokenizer), CONFIG, ratio=ratio
    )
    batches = []

    async def trainer() -> None:
        pipeline.start()
        try:
            for step in range(steps):
                result = await pipeline.next_batch(step)
                batches.append(result.trajectories)
                control = pipeline.admission
                bound = staleness_bound(ratio, pipeline.client.version, control.batch_size)
                while control.running or control.accepted < bound:
                    await asyncio.sleep(0.005)

                async def update() -> None:
                    await asyncio.sleep(0.001)

                await pipeline.sync(update, timeout=5)
        finally:
            await pipeline.close()

    asyncio.run(trainer())
    envs.close()
    return batches, pipeline


@pytest.mark.parametrize("ratio", [1, 2])
def test_a_slow_trainer_gets_batches_exactly_k_versions_stale_never_more(
    tiny_tokenizer: Any, ratio: int
) -> None:
    batches, pipeline = run_pipeline(tiny_tokenizer, ratio, steps=5)
    # step b + 1 updates version b; its batch was admitted as soon as version b - k
    # allowed it (the trainer is the bottleneck), so its first turns are k behind
    first = [{t.policy_version for t in batch} for batch in batches]
    assert first == [{max(0, b - ratio)} for b in range(5)]
    for b, batch in enumerate(batches):
        assert all(b - t.policy_version <= ratio for t in batch)
        assert all(t.last_policy_version >= t.policy_version for t in batch)
        assert [t.group_id for t in batch] == [2 * b, 2 * b, 2 * b + 1, 2 * b + 1]
    # admission control (AdmissionControl.start raises past the bound): no episode ever
    # started beyond (k + version + 1) × batch, and the count never passed it
    assert pipeline.admission.peak <= 0
    # the envs ran ahead to the bound: k batches beyond the last consumed were started
    assert pipeline.admission.highest_started == 4 * (5 + ratio) - 1


def held_items(pipeline: AsyncRollout) -> int:
    """Entries in the pipeline's own lists, dicts and sets (what could grow with the run)."""
    return sum(
        len(value) for value in vars(pipeline).values() if isinstance(value, list | dict | set)
    )


def test_the_pipeline_holds_no_more_after_many_steps_than_after_a_few(tiny_tokenizer: Any):
    """A run of any length keeps bounded state (a log of every episode started grew by
    one entry per episode for the whole run)."""
    _, short = run_pipeline(tiny_tokenizer, 1, steps=2)
    _, long = run_pipeline(tiny_tokenizer, 1, steps=8)
    assert long.admission.highest_started > short.admission.highest_started
    assert held_items(long) == held_items(short)


def test_ratio_0_plays_the_batches_of_the_synchronous_collect(tiny_tokenizer: Any) -> None:
    batches, pipeline = run_pipeline(tiny_tokenizer, 0, steps=3)
    envs = manager()
    backend = SlowScripted(tiny_tokenizer)
    chat = ChatTokenizer(tiny_tokenizer)
    synchronous = [
        asyncio.run(collect(envs, backend, chat, CONFIG, policy_version=step)).trajectories
        for step in range(3)
    ]
    envs.close()

    def view(batch: list[Trajectory]) -> list[Any]:
        return [
            (t.group_id, t.seed, t.env_index, t.policy_version, t.score,
             [(turn.response_ids, turn.policy_version) for turn in t.turns])
            for t in batch
        ]  # fmt: skip

    assert [view(batch) for batch in batches] == [view(batch) for batch in synchronous]
    assert pipeline.admission.highest_started == 4 * 3 - 1  # none ahead


class GatedBackend:
    """Answers [1, 2, 3] once ``release`` is set; counts calls and cancellations."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls: list[list[int]] = []
        self.cancelled = 0

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        self.calls.append(list(prompt_ids))
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return Generation([1, 2, 3], [-0.5] * 3, "stop")

    async def update_weights(self, weights: Any) -> None:
        await asyncio.Event().wait()  # hangs

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("abort", [False, True])
def test_pause_drains_or_aborts_and_an_aborted_turn_is_regenerated(abort: bool) -> None:
    async def main() -> tuple[Generation, GatedBackend, PausableBackend]:
        gated = GatedBackend()
        client = PausableBackend(gated, version=4)
        request = asyncio.ensure_future(client.generate([7, 8], SamplingParams()))
        await asyncio.sleep(0.01)  # in flight
        if not abort:
            gated.release.set()  # drained: it finishes on version 4 before the pause returns
        await client.pause(abort=abort)
        assert client.paused
        if abort:
            assert not request.done()  # waiting to be generated again
        client.version += 1  # the sync
        client.resume()
        gated.release.set()
        return await request, gated, client

    generation, gated, client = asyncio.run(main())
    assert generation.token_ids == [1, 2, 3]
    if abort:  # the partial output is dropped; the same prompt is generated anew on version 5
        assert gated.calls == [[7, 8], [7, 8]] and gated.cancelled == 1
        assert generation.policy_version == 5 and client.aborted == 1
    else:
        assert gated.calls == [[7, 8]] and gated.cancelled == 0
        assert generation.policy_version == 4 and client.aborted == 0


def test_a_hung_weight_sync_fails_by_name_and_generation_resumes() -> None:
    async def main() -> tuple[PausableBackend, Generation]:
        gated = GatedBackend()
        client = PausableBackend(gated, version=2)
        with pytest.raises(WeightSyncTimeoutError, match=r"rpc_timeout=0\.05 s"):
            await paused_update(client, lambda: gated.update_weights([]), timeout=0.05)
        assert not client.paused
        gated.release.set()
        return client, await asyncio.wait_for(client.generate([1], SamplingParams()), 5)

    client, generation = asyncio.run(main())
    assert client.version == 2  # the failed sync did not move the version
    assert generation.policy_version == 2
    assert issubclass(WeightSyncTimeoutError, TimeoutError)
