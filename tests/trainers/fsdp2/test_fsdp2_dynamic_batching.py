"""Dynamic batching on the FSDP2 strategy over two gloo ranks: the ranks' shares cut by a
token budget into different numbers of micro-batches (3 and 2: the short rank runs a
filler forward pass in the others' gathers) give the fixed-size log-probabilities, of
the policy and of the sharded reference, in the batch's order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agentgym.trainers.strategies.batching import TokenBudget
from tests.trainers.megatron.launch import Dealt, model_dir, spawn
from tests.trainers.test_update_path import ragged_batch

# rank 0's rows (14, 5, 9 tokens) -> 3 micro-batches, rank 1's (3, 12, 7) -> 2
BUDGET = TokenBudget(max_tokens=16, round_to=4)


def with_and_without_budget(rank: int, world: int, path: Path) -> dict[str, Any]:
    from agentgym.trainers.strategies.fsdp2.strategy import FSDP2Strategy

    strategy: Any = Dealt(
        FSDP2Strategy(path, temperature=0.7, micro_batch_size=2, reference_path=path), rank, world
    )
    batch = ragged_batch(0)
    return {
        "fixed": strategy.logprobs(batch),
        "budget": strategy.logprobs(batch, BUDGET),
        "reference": strategy.reference_logprobs(batch, BUDGET),
    }


@pytest.mark.slow
def test_budgeted_micro_batches_give_fsdp2s_fixed_size_logprobs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    got = spawn(2, with_and_without_budget, model_dir(tmp_path_factory.mktemp("fsdp2-db")))
    real = ragged_batch(0).attention_mask.bool()
    torch.testing.assert_close(got["budget"][real], got["fixed"][real], rtol=0, atol=1e-6)
    # the reference starts as the policy's weights
    torch.testing.assert_close(got["reference"][real], got["fixed"][real], rtol=0, atol=1e-6)
