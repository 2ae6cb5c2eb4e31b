"""The garbage collector's youngest threshold is raised while episodes are played and put
back when the last rollout ends (a rollout inside another, or in another thread, keeps it
raised until both end)."""

from __future__ import annotations

import asyncio
import gc

from agentgym.rollout.collection_gc import YOUNG_THRESHOLD, FewerCollections
from agentgym.rollout.loop import RolloutConfig, collect
from tests.rollout.test_async_rollout import GatedBackend


def test_the_threshold_is_raised_while_held_and_put_back_by_the_last_holder() -> None:
    before = gc.get_threshold()
    outer, inner = FewerCollections(), FewerCollections()
    with outer:
        assert gc.get_threshold() == (max(YOUNG_THRESHOLD, before[0]), *before[1:])
        inner.hold()
        outer_raised = gc.get_threshold()
    assert gc.get_threshold() == outer_raised  # the inner holder still plays
    inner.release()
    assert gc.get_threshold() == before


def test_a_collection_plays_with_the_threshold_raised(tiny_tokenizer: object) -> None:
    from agentgym.rollout.chat import ChatTokenizer
    from agentgym.rollout.env_manager import EnvManager

    seen: list[tuple[int, ...]] = []
    backend = GatedBackend()
    backend.release.set()
    generate = backend.generate

    async def watching(*args: object, **kwargs: object) -> object:
        seen.append(gc.get_threshold())
        return await generate(*args, **kwargs)  # type: ignore[arg-type]

    backend.generate = watching  # type: ignore[method-assign, assignment]
    before = gc.get_threshold()
    manager = EnvManager(tags=["sokoban"], env_groups=1, group_size=2, seed=0)
    config = RolloutConfig(mode="trajectory", max_turns=2, sequence_length=4096)
    asyncio.run(collect(manager, backend, ChatTokenizer(tiny_tokenizer), config))
    manager.close()
    assert seen and all(threshold[0] >= YOUNG_THRESHOLD for threshold in seen)
    assert gc.get_threshold() == before
