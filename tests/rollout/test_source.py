"""The RolloutSource seam: the synchronous and the ahead-of-training source answer the
recipe's calls alike (batches by step, weight updates counted as versions, work run
while paused, the resume cursor); ratio 0 and k > 0 give the same first batch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentgym.rollout.async_rollout import WeightSyncTimeoutError
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.source import AheadSource, Rollout, RolloutSource, SyncSource
from tests.rollout.test_async_rollout import CONFIG, SlowScripted, manager


def make_source(envs: Any, backend: Any, chat: ChatTokenizer, ratio: float) -> RolloutSource:
    """The source the build floor picks for ``async_generation_ratio`` = ``ratio``."""
    rollout = Rollout(envs, backend, chat, CONFIG)
    return AheadSource(rollout, ratio=ratio) if ratio else SyncSource(rollout)


class Hanging(SlowScripted):
    """An engine whose weight update never returns."""

    async def update_weights(self, weights: Any) -> None:
        await asyncio.sleep(10)


def play(source: Any, steps: int) -> tuple[list[Any], list[dict[str, float]], dict[str, Any]]:
    """The recipe's calls on ``source``: each step's batch, an update, validation-like
    work while paused, and the state a checkpoint after the last step stores."""
    batches, syncs = [], []

    async def recipe() -> dict[str, Any]:
        source.start(0)
        try:
            for step in range(1, steps + 1):
                rollout = await source.next_batch(step)
                batches.append(rollout)

                syncs.append(await source.update_weights(list, timeout=5))
                assert await source.paused(lambda s=step: asyncio.sleep(0, result=s)) == step
            return source.state_dict(steps)
        finally:
            await source.close()

    return batches, syncs, asyncio.run(recipe())


@pytest.mark.parametrize("ratio", [0, 1])
def test_every_source_serves_the_recipe_the_same_calls(tiny_tokenizer: Any, ratio: float):
    envs = manager()
    source = make_source(envs, SlowScripted(tiny_tokenizer), ChatTokenizer(tiny_tokenizer), ratio)
    assert isinstance(source, AheadSource if ratio else SyncSource)
    batches, syncs, state = play(source, steps=3)
    envs.close()
    assert [len(b.trajectories) for b in batches] == [4, 4, 4]
    for step, batch in enumerate(batches, start=1):
        assert 0 <= batch.metrics["train/all/success"] <= 1
        assert {t.group_id for t in batch.trajectories} == {2 * step - 2, 2 * step - 1}
        lags = [step - 1 - t.policy_version for t in batch.trajectories]
        assert all(0 <= lag <= ratio for lag in lags)
    assert all(sync["time/weight_sync"] >= 0 for sync in syncs)
    if ratio:
        assert [s["async/policy_version"] for s in syncs] == [1.0, 2.0, 3.0]
        assert {"time/trainer_idle", "async/staleness_max"} <= batches[0].metrics.keys()
    assert state["cursor"] == 6  # the seed cursor after 3 batches of 2 groups


@pytest.mark.parametrize("ratio", [0, 1])
def test_a_hung_update_is_a_named_timeout_in_both_sources(tiny_tokenizer: Any, ratio: float):
    envs = manager()
    chat = ChatTokenizer(tiny_tokenizer)
    source = make_source(envs, Hanging(tiny_tokenizer), chat, ratio)

    async def hung() -> None:
        source.start(0)
        try:
            with pytest.raises(WeightSyncTimeoutError, match=r"rpc_timeout=0\.05"):
                await source.update_weights(list, timeout=0.05)
        finally:
            await source.close()

    asyncio.run(hung())
    envs.close()
