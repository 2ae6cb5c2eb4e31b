"""Dynamic batching (micro-batches by token budget): the cut by hand, the same update as
fixed-size micro-batches (float64: weights after an AdamW step to 1e-6 relative), the
same log-probabilities in the batch's order, fewer padded tokens on a ragged batch, and
the config's keys checked before any model work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agentgym.builders.recipe import default_grpo_config, grpo_config
from agentgym.errors import ConfigError
from agentgym.schema import TrainConfig, validate
from agentgym.trainers.ranks import GroupRank, StrategySpec
from agentgym.trainers.strategies import micro_batches
from agentgym.trainers.strategies.batching import (
    TokenBudget,
    cut,
    padded_tokens,
    plan,
    token_micro_batches,
)
from agentgym.trainers.strategies.torch_strategy import TorchStrategy
from agentgym.trainers.updates import minibatches, update_policy
from tests.trainers.test_update_path import ragged_batch

# ragged_batch's rows have lengths 14, 5, 9, 3, 12, 7
BUDGET = TokenBudget(max_tokens=24, round_to=4)


def test_rows_sorted_by_rounded_length_are_cut_greedily_by_hand() -> None:
    # rounded up to 4: 16, 8, 12, 4, 12, 8; sorted: row 3 (4), 1 (8), 5 (8), 2 (12), 4 (12),
    # 0 (16). Rows 3, 1, 5 take 3 × 8 = 24 tokens (a fourth: 4 × 12 > 24); rows 2, 4 take
    # 2 × 12; row 0 alone 16.
    cuts = plan(ragged_batch(), BUDGET)
    assert [(rows.tolist(), width) for rows, width in cuts] == [
        ([3, 1, 5], 8),
        ([2, 4], 12),
        ([0], 16),
    ]
    parts = token_micro_batches(ragged_batch(), BUDGET)
    assert [tuple(part.input_ids.shape) for part in parts] == [(3, 8), (2, 12), (1, 16)]
    # row 0 (14 tokens) is padded to 16 with no attention and no loss
    assert parts[2].attention_mask[0, 14:].tolist() == [0, 0]
    assert parts[2].loss_mask[0, 14:].tolist() == [0, 0]
    # padded tokens: 24 + 24 + 16 computed for 50 real ones, where micro-batches of 2 rows
    # trimmed to their longest compute 2 × 14 + 2 × 9 + 2 × 12 = 70
    assert padded_tokens(parts) == (14, 50)
    assert padded_tokens(list(micro_batches(ragged_batch(), 2))) == (20, 50)


def test_a_row_longer_than_the_budget_is_named() -> None:
    with pytest.raises(ValueError, match=r"a sample of 16 tokens .* max_tokens_per_microbatch=12"):
        plan(ragged_batch(), TokenBudget(max_tokens=12, round_to=4))


def test_cut_keeps_the_row_order_it_used() -> None:
    batch = ragged_batch()
    parts, order = cut(batch, 2, BUDGET)
    assert order.tolist() == [3, 1, 5, 2, 4, 0]
    rows = torch.cat([part.input_ids[:, :3] for part in parts])
    assert torch.equal(rows, batch.input_ids[order, :3])
    fixed, identity = cut(batch, 2, None)
    assert identity.tolist() == list(range(6)) and len(fixed) == 3


def float64_strategy(model_dir: Path) -> TorchStrategy:
    return TorchStrategy(model_dir, dtype="float64", temperature=0.7, micro_batch_size=2)


def parameters(strategy: TorchStrategy) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in strategy.model.named_parameters()}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_the_update_equals_fixed_size_micro_batches(tiny_model_dir: Path, mode: str) -> None:
    # one mini-batch of the six rows: 3 micro-batches of 2 rows, or the budget's 3 others
    config = default_grpo_config(
        micro_batch_size=2,
        gradient_accumulation_steps=3,
        loss_agg_mode=mode,
        entropy_loss_coef=0.01,
        clip_ratio_low=0.1,
        clip_ratio_high=0.1,
    )
    batch = ragged_batch()
    fixed, dynamic = float64_strategy(tiny_model_dir), float64_strategy(tiny_model_dir)
    before = parameters(fixed)
    logged_fixed = update_policy(config, fixed, batch, step=1)
    logged = update_policy(config.with_values(train_token_budget=BUDGET), dynamic, batch, step=1)

    after_fixed, after = parameters(fixed), parameters(dynamic)
    moved = max(float((after_fixed[n] - before[n]).abs().max()) for n in before)
    assert moved > 1e-4  # AdamW moved the weights: the comparison below is not vacuous
    for name, weight in after_fixed.items():
        torch.testing.assert_close(after[name], weight, rtol=1e-6, atol=1e-9)
    for key in ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert logged[key] == pytest.approx(logged_fixed[key], rel=1e-6), key
    assert logged["actor/ratio_max"] == pytest.approx(logged_fixed["actor/ratio_max"], rel=1e-6)
    # the padding the update computed: one mini-batch holds every row, the budget cuts it
    # as above whatever its order; fixed micro-batches pair its rows as shuffled
    (chunk,) = minibatches(config, batch, 1)
    assert logged["actor/padded_tokens"] == 14.0
    assert logged["actor/padded_tokens_fixed"] == padded_tokens(list(micro_batches(chunk, 2)))[0]
    assert "actor/padded_tokens" not in logged_fixed


def test_logprobs_on_budgeted_micro_batches_come_back_in_the_batchs_order(
    tiny_model_dir: Path,
) -> None:
    strategy = TorchStrategy(
        tiny_model_dir, temperature=0.7, micro_batch_size=2, reference_path=tiny_model_dir
    )
    batch = ragged_batch()
    expected = strategy.logprobs(batch)
    real = batch.attention_mask.bool()
    got = strategy.logprobs(batch, BUDGET)
    assert got.shape == expected.shape
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5)
    reference = strategy.reference_logprobs(batch, TokenBudget(max_tokens=64, round_to=8))
    torch.testing.assert_close(reference[real], expected[real], rtol=0, atol=1e-5)
    # through a trainer rank, as the worker group calls it
    rank = GroupRank(
        0, 1, StrategySpec("actor_train", "torch", tiny_model_dir, {}, {"temperature": 0.7})
    )
    rank.setup(None, None)
    through = rank.rows("logprobs", batch, BUDGET)
    torch.testing.assert_close(through[real], expected[real], rtol=0, atol=1e-5)


def checked(role: str, **keys: Any) -> TrainConfig:
    data = TrainConfig().model_dump()
    data[role] = {**data[role], **keys}
    return validate(data)


def test_the_roles_keys_become_the_recipes_token_budgets() -> None:
    config = checked(
        "actor_train",
        use_dynamic_batching_in_train=True,
        max_tokens_per_microbatch_in_train=1024,
        sequence_length_round_in_train=128,
        use_dynamic_batching_in_infer=True,
        max_tokens_per_microbatch_in_infer=2048,
    )
    schedule = grpo_config(config).schedule
    assert schedule.train_token_budget == TokenBudget(1024, 128)
    assert schedule.logprobs_token_budget == TokenBudget(2048, 4)  # ROLL's default round: 4
    assert schedule.reference_token_budget is None
    reference = checked(
        "reference", use_dynamic_batching_in_infer=True, max_tokens_per_microbatch_in_infer=512
    )
    assert grpo_config(reference).schedule.reference_token_budget == TokenBudget(512, 4)
    assert default_grpo_config().schedule.train_token_budget is None  # off by default


@pytest.mark.parametrize(
    ("role", "keys", "message"),
    [
        (
            "actor_train",
            {"use_dynamic_batching_in_train": True},
            "actor_train.max_tokens_per_microbatch_in_train=None cannot hold a sample of "
            "sequence_length=512 tokens (512 once rounded up to a multiple of "
            "sequence_length_round_in_train=4): set it to at least 512",
        ),
        (
            "actor_train",
            {
                "use_dynamic_batching_in_infer": True,
                "max_tokens_per_microbatch_in_infer": 600,
                "sequence_length_round_in_infer": 384,
            },
            "cannot hold a sample of sequence_length=512 tokens (768 once rounded up",
        ),
        (
            "actor_train",
            {"max_tokens_per_microbatch_in_train": 8192},
            "actor_train.max_tokens_per_microbatch_in_train=8192 applies only with "
            "actor_train.use_dynamic_batching_in_train=true",
        ),
        (
            "critic",
            {"use_dynamic_batching_in_train": True},
            "critic.use_dynamic_batching_in_train=True: dynamic batching does not apply to "
            "critic (the critic trains on micro-batches of per_device_train_batch_size rows",
        ),
        (
            "actor_infer",
            {"use_dynamic_batching_in_infer": True},
            "does not apply to actor_infer (the generation engine batches its requests itself",
        ),
        (
            "reference",
            {"sequence_length_round_in_train": 8},
            "reference.sequence_length_round_in_train=8: dynamic batching does not apply to "
            "reference (the reference is never trained)",
        ),
    ],
)
def test_bad_dynamic_batching_keys_are_named(role: str, keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        checked(role, **keys)
    assert message in str(error.value)
