"""Dynamic batching on the Megatron strategy at PP=2 (two gloo ranks, micro-batches of
varying rows and lengths through the pipeline): log-probabilities on token-budget
micro-batches equal the fixed-size ones in the batch's order, and one update on them
equals the torch strategy's fixed-size update (1e-5, as the other Megatron comparisons)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from agentgym.builders.recipe import default_grpo_config
from agentgym.trainers.strategies.batching import TokenBudget
from agentgym.trainers.strategies.torch_strategy import TorchStrategy
from agentgym.trainers.updates import update_policy
from tests.trainers.megatron.launch import Dealt, model_dir, spawn
from tests.trainers.test_update_path import ragged_batch

BUDGET = TokenBudget(max_tokens=24, round_to=4)  # micro-batches of 3, 2 and 1 rows
CONFIG = default_grpo_config(micro_batch_size=2, gradient_accumulation_steps=3)


def pp2_with_and_without_budget(rank: int, world: int, path: Path) -> Any:
    from agentgym.trainers.strategies.megatron.strategy import MegatronStrategy

    megatron = Dealt(
        MegatronStrategy(path, temperature=0.7, micro_batch_size=2, pipeline_model_parallel_size=2),
        rank,
        world,
    )  # each rank its share of rows and micro-batches, as the worker group deals them
    batch = ragged_batch(0)
    fixed, budgeted = megatron.logprobs(batch), megatron.logprobs(batch, BUDGET)
    metrics = update_policy(CONFIG.with_values(train_token_budget=BUDGET), megatron, batch, 1)
    weights = {key: value.clone() for key, value in megatron.export_weights()}
    return fixed, budgeted, metrics, weights


@pytest.mark.slow
def test_budgeted_micro_batches_give_megatrons_fixed_size_results_at_pp2(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = model_dir(tmp_path_factory.mktemp("pp2"))
    fixed, budgeted, metrics, weights = spawn(2, pp2_with_and_without_budget, path)
    real = ragged_batch(0).attention_mask.bool()
    torch.testing.assert_close(budgeted[real], fixed[real], rtol=0, atol=1e-6)
    # the update on the budget's micro-batches (3, 2 and 1 rows, through the pipeline)
    # against the torch strategy's on fixed ones (which equals its own budgeted update,
    # tests/trainers/test_dynamic_batching.py), to the Megatron tests' 1e-5
    single = TorchStrategy(path, temperature=0.7, micro_batch_size=2)
    expected = update_policy(CONFIG, single, ragged_batch(0), 1)
    assert metrics["actor/padded_tokens"] == 14.0
    for key in ("actor/loss", "actor/pg_loss", "actor/grad_norm"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
    for name, tensor in single.export_weights():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("variables", "backend"),
    [
        ({}, "auto"),
        ({"NVTE_FLASH_ATTN": "1", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"}, "flash"),
        ({"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "0"}, "local"),
        ({"NVTE_FUSED_ATTN": "1", "NVTE_FLASH_ATTN": "0"}, "fused"),
        ({"NVTE_UNFUSED_ATTN": "1", "NVTE_FUSED_ATTN": "0"}, "unfused"),
        ({"NVTE_FLASH_ATTN": "1"}, "auto"),
    ],
)
def test_transformer_engines_variables_pick_the_attention_backend_as_roll(
    variables: dict[str, str], backend: str
) -> None:
    # ROLL's dynamic-batching file sets the first three in actor_train.system_envs;
    # megatron-core asserts that they agree with its attention_backend
    from agentgym.trainers.strategies.megatron.model import attention_backend

    assert attention_backend(variables) == backend
