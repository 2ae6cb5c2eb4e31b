"""``partial_rollout``: a response generated in pieces, cut by a weight sync at a piece's
end and continued on the new weights with its tokens kept (the tiny model on the HF
engine): each piece's prompt is the prompt and the tokens so far, each token's
log-probability is that of the weights that made it, and each token's version is
recorded; without a sync, the pieces make the response that one request makes."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentgym.errors import ConfigError
from agentgym.rollout.async_rollout import PausableBackend, paused_update
from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.rollout.backends.hf import HFBackend
from agentgym.rollout.metrics import staleness_metrics
from agentgym.schema import validate
from agentgym.trajectory import Trajectory, Turn
from tests.rollout.test_backends import TEMPERATURE, TOLERANCE, forward_logprobs
from tests.test_config import composed

PROMPT = [5, 17, 42, 9, 100, 7]


class HeldAfterFirst:
    """The engine, its first request held once answered until :attr:`hold` is set (so
    that a weight sync starts while it is in flight); every prompt recorded."""

    def __init__(self, engine: HFBackend) -> None:
        self.engine = engine
        self.prompts: list[list[int]] = []
        self.first_done = asyncio.Event()
        self.hold = asyncio.Event()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        self.prompts.append(list(prompt_ids))
        generation = await self.engine.generate(prompt_ids, params, env=env)
        if len(self.prompts) == 1:
            self.first_done.set()
            await self.hold.wait()
        return generation

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        await self.engine.update_weights(weights)

    async def close(self) -> None:
        await self.engine.close()


@pytest.fixture
def model(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def sampling(seed: int = 3) -> SamplingParams:
    return SamplingParams(temperature=TEMPERATURE, max_new_tokens=10, seed=seed)


def test_a_response_cut_by_a_sync_goes_on_on_the_new_weights_with_its_tokens(
    model: Any, tiny_tokenizer: Any
) -> None:
    old = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    new = {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in model.state_dict().items()
    }
    engine = HeldAfterFirst(HFBackend(model, pad_token_id=tiny_tokenizer.pad_token_id))

    async def main() -> tuple[Generation, PausableBackend]:
        client = PausableBackend(engine, version=4, chunk=4)
        response = asyncio.ensure_future(client.generate(PROMPT, sampling()))
        await engine.first_done.wait()
        sync = asyncio.ensure_future(
            paused_update(client, lambda: engine.update_weights(new.items()), timeout=60)
        )
        await asyncio.sleep(0.05)
        assert not sync.done()  # the pause waits for the piece in flight, and no longer
        engine.hold.set()
        await sync
        return await response, client

    generation, client = asyncio.run(main())
    ids = generation.token_ids
    assert len(ids) > 4 and generation.finish_reason in ("stop", "length")
    assert engine.prompts == [PROMPT, PROMPT + ids[:4], PROMPT + ids[:8]][: len(engine.prompts)]
    assert len(engine.prompts) == 1 + (len(ids) - 1) // 4
    assert generation.token_versions == [4] * 4 + [5] * (len(ids) - 4)
    assert generation.policy_version == 4 and client.continued == 1
    # each token's log-probability is that of the weights that generated it
    old_logprobs = forward_logprobs(old, PROMPT + ids)[len(PROMPT) :]
    new_logprobs = forward_logprobs(model, PROMPT + ids)[len(PROMPT) :]
    expected = old_logprobs[:4] + new_logprobs[4:]
    assert max(abs(a - b) for a, b in zip(generation.logprobs, expected, strict=True)) < TOLERANCE
    assert max(abs(a - b) for a, b in zip(old_logprobs[4:], new_logprobs[4:], strict=True)) > 1e-3


def test_without_a_sync_the_pieces_make_the_response_one_request_makes(
    model: Any, tiny_tokenizer: Any
) -> None:
    engine = HFBackend(model, pad_token_id=tiny_tokenizer.pad_token_id)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)

    async def main() -> tuple[Generation, Generation]:
        whole = await PausableBackend(engine, version=2).generate(PROMPT, greedy)
        pieces = await PausableBackend(engine, version=2, chunk=3).generate(PROMPT, greedy)
        return whole, pieces

    whole, pieces = asyncio.run(main())
    assert pieces.token_ids == whole.token_ids and pieces.finish_reason == whole.finish_reason
    assert pieces.token_versions == [2] * len(whole.token_ids) and whole.token_versions is None


def test_token_staleness_counts_each_token_at_its_own_version() -> None:
    def turn(versions: list[int] | None, first: int) -> Turn:
        count = len(versions) if versions else 3
        return Turn([1], [2] * count, [-0.1] * count, "", "stop", policy_version=first,
                    token_versions=versions)  # fmt: skip

    played = [
        Trajectory("sokoban", "sokoban", 0, 0, turns=[turn([3, 3, 4, 4], 3)], policy_version=3),
        Trajectory("sokoban", "sokoban", 1, 1, turns=[turn(None, 4)], policy_version=4),
    ]
    metrics = staleness_metrics(played, version=4, ratio=1)
    assert metrics["async/staleness_max"] == 1.0  # the first token's version bounds a sample
    assert metrics["async/token_staleness_mean"] == pytest.approx(2 / 7)  # 1, 1, 0, 0 + 0, 0, 0
    assert metrics["async/continued_turns"] == 1.0


def test_partial_rollout_without_async_generation_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="partial_rollout=8 continues turns across"):
        validate(composed("env=sokoban", "partial_rollout=8"))
