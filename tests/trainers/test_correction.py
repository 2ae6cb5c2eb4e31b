"""The off-policy correction module against hand-computed values: truncated importance
weights at each granularity, ROLL's filters, decoupled PPO, the bypass mode, the
train–inference metrics, the staleness summary, and the schema's keys."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from agentgym.errors import ConfigError
from agentgym.schema import TrainConfig, validate
from agentgym.trainers.correction import (
    CorrectionConfig,
    ISWeight,
    RatioFilter,
    correction_config,
    correction_terms,
    filter_mask,
    importance_weights,
    level_log_ratio,
)
from agentgym.trainers.losses import policy_loss, truncated_is_weights

E = math.e
OFF = CorrectionConfig(None, ())


def test_token_ratios_truncated_at_two() -> None:
    # ratios [e, 1, e^-1] truncated at 2 give [2, 1, e^-1]; only the first is clipped
    weights, clipped = importance_weights(
        torch.tensor([[1.0, 0.0, -1.0]]), torch.ones(1, 3), "token", 2.0
    )
    assert torch.allclose(weights, torch.tensor([[2.0, 1.0, 1 / E]]))
    assert clipped.tolist() == [[True, False, False]]


def test_sequence_weight_is_the_product_and_off_mask_tokens_do_not_count() -> None:
    log_ratio = torch.tensor([[9.0, 0.5, 0.5], [9.0, -0.25, -0.25]])  # column 0 is the prompt
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]])
    weights, _ = importance_weights(log_ratio, mask, "sequence", None)
    assert torch.allclose(weights[:, 1:], torch.tensor([[E, E], [E**-0.5, E**-0.5]]))
    assert weights[:, 0].tolist() == [1.0, 1.0]  # neutral off the mask
    truncated, clipped = importance_weights(log_ratio, mask, "sequence", 2.0)
    assert torch.allclose(truncated[:, 1:], torch.tensor([[2.0, 2.0], [E**-0.5, E**-0.5]]))
    assert clipped.tolist() == [[False, True, True], [False, False, False]]


def test_geometric_and_segment_levels_average_the_log_ratio() -> None:
    # two turns in one row: tokens 1-2 (ratios 2 and 8) and token 4 (ratio 1)
    log_ratio = torch.log(torch.tensor([[5.0, 2.0, 8.0, 5.0, 1.0]]))
    mask = torch.tensor([[0, 1, 1, 0, 1]])
    segment = level_log_ratio(log_ratio, mask, "segment").exp()
    assert torch.allclose(segment[mask.bool()], torch.tensor([4.0, 4.0, 1.0]))
    geometric = level_log_ratio(log_ratio, mask, "geometric").exp()
    assert torch.allclose(geometric[mask.bool()], torch.full((3,), 16 ** (1 / 3)))
    sequence = level_log_ratio(log_ratio, mask, "sequence").exp()
    assert torch.allclose(sequence[mask.bool()], torch.full((3,), 16.0))


def test_unknown_level_names_the_options() -> None:
    with pytest.raises(ValueError, match="Did you mean 'token'"):
        level_log_ratio(torch.zeros(1, 2), torch.ones(1, 2), "tokens")


def test_token_filter_masks_extreme_ratios_and_a_sequence_filter_masks_the_row() -> None:
    behaviour = torch.zeros(2, 3)
    proximal = torch.tensor([[1.0, 0.0, -1.0], [0.5, 0.5, 0.0]])  # ratios [e, 1, 1/e], [√e, √e, 1]
    mask = torch.ones(2, 3)
    token = filter_mask(proximal, behaviour, mask, [RatioFilter("token", (0.5, 2.0), None)])
    assert token.tolist() == [[False, True, False], [True, True, True]]
    # sequence ratios: e^0 = 1 (kept) and e^1 (dropped, every token of the row)
    sequence = filter_mask(proximal, behaviour, mask, [RatioFilter("sequence", (0.5, 2.0), None)])
    assert sequence.tolist() == [[True, True, True], [False, False, False]]


def test_diff_filter_bounds_the_probability_difference() -> None:
    # probabilities: proximal 0.5 vs behaviour 0.25 (diff 0.25), and 0.5 vs 0.45 (0.05)
    proximal = torch.log(torch.tensor([[0.5, 0.5]]))
    behaviour = torch.log(torch.tensor([[0.25, 0.45]]))
    kept = filter_mask(
        proximal, behaviour, torch.ones(1, 2), [RatioFilter("token", None, (-0.2, 0.2))]
    )
    assert kept.tolist() == [[False, True]]


def test_bypass_uses_the_engine_logprobs_and_changes_nothing() -> None:
    behaviour = torch.tensor([[7.0, -0.5, -1.5]])
    mask = torch.tensor([[0, 1, 1]])
    terms = correction_terms(mask, behaviour, None, OFF)
    assert terms.old_logprobs.tolist() == [[0.0, -0.5, -1.5]]
    assert terms.is_weights is None and terms.keep is None and terms.metrics == {}
    weighted = CorrectionConfig(ISWeight("token", 2.0), ())
    with pytest.raises(ValueError, match="set old_logprobs=trainer"):
        correction_terms(mask, behaviour, None, weighted)


def test_decoupled_terms_and_metrics_by_hand() -> None:
    # log(π_prox/μ) on the generated tokens: [1, 0, -1]; the prompt token differs wildly
    behaviour = torch.tensor([[0.0, -2.0, -1.0, -1.0]])
    proximal = torch.tensor([[-30.0, -1.0, -1.0, -2.0]])
    mask = torch.tensor([[0, 1, 1, 1]])
    config = CorrectionConfig(ISWeight("token", 2.0), (RatioFilter("token", (0.5, 2.0), None),))
    terms = correction_terms(mask, behaviour, proximal, config)
    assert terms.old_logprobs.tolist() == [[0.0, -1.0, -1.0, -2.0]]
    assert terms.is_weights is not None and terms.keep is not None
    assert torch.allclose(terms.is_weights, torch.tensor([[1.0, 2.0, 1.0, 1 / E]]))
    assert terms.keep.tolist() == [[1, 0, 1, 0]]  # the mask's dtype, 1 off the mask
    m = terms.metrics
    assert m["engine_logprob_abs_diff_mean"] == pytest.approx(2 / 3)
    assert m["engine_logprob_abs_diff_max"] == pytest.approx(1.0)
    assert m["engine_kl_k1"] == pytest.approx(0.0)  # mean of μ - π_prox: -1, 0, 1
    assert m["engine_kl_k3"] == pytest.approx(((E - 2) + 0 + (1 / E)) / 3)  # r - log r - 1
    assert m["is_weight_clipfrac"] == pytest.approx(1 / 3)
    assert m["is_weight_mean"] == pytest.approx((2 + 1 + 1 / E) / 3)
    assert m["train_infer_token_ratio_mask_mean"] == pytest.approx(1 / 3)
    assert m["train_infer_mask_fraction"] == pytest.approx(2 / 3)
    assert m["train_infer_ratio_token_mean"] == pytest.approx((E + 1 + 1 / E) / 3)
    assert m["train_infer_ratio_sequence_mean"] == pytest.approx(1.0)


def test_decoupled_loss_is_the_ppo_loss_against_proximal_weighted_by_proximal_over_behaviour() -> (
    None
):
    # one token, A = 1: π_θ/π_prox = e^0.1 (inside the clip), π_prox/μ = e^0.5 untruncated
    behaviour, proximal, current = (
        torch.tensor([[-1.5]]),
        torch.tensor([[-1.0]]),
        torch.tensor([[-0.9]]),
    )
    mask, advantages = torch.ones(1, 1), torch.ones(1, 1)
    terms = correction_terms(
        mask, behaviour, proximal, CorrectionConfig(ISWeight("token", None), ())
    )
    loss, _ = policy_loss(
        current, terms.old_logprobs, advantages, mask, is_weights=terms.is_weights
    )
    assert loss.item() == pytest.approx(-math.exp(0.5) * math.exp(0.1))
    # AReaL's objective: clipped at 1 + 0.2 before the weight multiplies it
    far = torch.tensor([[0.0]])  # π_θ/π_prox = e > 1.2
    loss, _ = policy_loss(far, terms.old_logprobs, advantages, mask, is_weights=terms.is_weights)
    assert loss.item() == pytest.approx(-math.exp(0.5) * 1.2)


def test_the_default_config_leaves_the_loss_bit_identical() -> None:
    # the recipe today (old_logprobs=engine): π_old = engine logprobs × mask, no weights
    generator = torch.Generator().manual_seed(0)
    engine = -torch.rand(4, 6, generator=generator)
    current = engine + 0.3 * torch.randn(4, 6, generator=generator)
    advantages = torch.randn(4, 6, generator=generator)
    mask = (torch.rand(4, 6, generator=generator) > 0.3).long()
    before, _ = policy_loss(current, engine * mask, advantages, mask.float())
    terms = correction_terms(
        mask, engine, None, correction_config(TrainConfig().train_infer_correction)
    )
    after, _ = policy_loss(
        current, terms.old_logprobs, advantages, mask.float(), is_weights=terms.is_weights
    )
    assert torch.equal(before, after)


def test_token_weights_are_the_older_tis_cap() -> None:
    generator = torch.Generator().manual_seed(1)
    trainer, engine = (
        -torch.rand(3, 5, generator=generator) * 3,
        -torch.rand(3, 5, generator=generator) * 3,
    )
    mask = torch.ones(3, 5)
    ours, _ = importance_weights(trainer - engine, mask, "token", 2.0)
    assert torch.equal(ours, truncated_is_weights(trainer, engine, mask, 2.0))


def test_schema_keys_are_rolls_and_default_off() -> None:
    assert not correction_config(TrainConfig().train_infer_correction).enabled
    assert correction_config(
        TrainConfig().train_infer_correction, tis_cap=3.0
    ).is_weight == ISWeight("token", 3.0)
    raw = {
        "old_logprobs": "trainer",
        "train_infer_correction": {
            "is_weight": {"enabled": True, "weight_type": "sequence", "upper_bound": None},
            "filters": [{"enabled": True, "agg_type": "segment", "diff_enabled": True}],
        },
    }
    config = correction_config(validate(raw).train_infer_correction)
    assert config.is_weight == ISWeight("sequence", None)
    assert config.filters == (RatioFilter("segment", (0.8, 1.2), (-0.2, 0.2)),)  # ROLL's defaults
    with pytest.raises(ConfigError, match="set old_logprobs=trainer"):
        validate({**raw, "old_logprobs": "engine"})
    with pytest.raises(ConfigError, match="not supported yet"):
        validate({"train_infer_correction": {"is_weight": {"detach": False}}})
    with pytest.raises(ConfigError, match="Did you mean 'geometric'"):
        validate({"train_infer_correction": {"is_weight": {"weight_type": "geometrc"}}})


class ProximalPolicy:
    """The trainer's π_old for prepare_batch: log π_prox = -1 on every token."""

    def logprobs(self, batch: object, budget: object = None) -> torch.Tensor:
        return torch.full(batch.input_ids.shape, -1.0)  # type: ignore[attr-defined]


def filtered_episodes() -> list[Any]:
    """One group of two episodes; engine logprobs -2, -1, -0.5: ratios e, 1, e^-0.5 to
    :class:`ProximalPolicy`."""
    from agentgym.trajectory import Trajectory, Turn

    return [
        Trajectory("sokoban", "tag", group_id=0, seed=0, score=1.0,
                   turns=[Turn([5, 6], [7, 8], [-2.0, -1.0], "", "stop", reward=1.0)]),
        Trajectory("sokoban", "tag", group_id=0, seed=0, score=0.0,
                   turns=[Turn([5, 6], [9], [-0.5], "", "stop", reward=0.0)]),
    ]  # fmt: skip


def test_prepare_batch_applies_the_correction_after_the_advantages() -> None:
    # the recipe's wiring: decoupled π_old, token weights, a token filter on the loss mask
    from types import SimpleNamespace
    from typing import cast

    from agentgym.builders.recipe import default_grpo_config
    from agentgym.trainers.batch_prep import prepare_batch
    from agentgym.trainers.grpo import TrainParts

    episodes = filtered_episodes()
    config = default_grpo_config(
        drop_zero_variance_groups=False, step_advantage_weight=0.0, step_score="turn",
        old_logprobs="trainer",
        train_infer_correction=CorrectionConfig(
            ISWeight("token", 2.0), (RatioFilter("token", (0.5, 2.0), None),)
        ),
    )  # fmt: skip
    parts = cast(TrainParts, SimpleNamespace(strategy=ProximalPolicy(), pad_token_id=0))
    metrics: dict[str, float] = {}
    batch = prepare_batch(config, parts, episodes, metrics)
    assert batch is not None and batch.is_weights is not None and batch.advantages is not None
    generated = batch.engine_logprobs != 0
    assert batch.is_weights[generated].tolist() == pytest.approx([2.0, 1.0, math.exp(-0.5)])
    assert batch.loss_mask[generated].tolist() == [0, 1, 1]  # ratio e left the loss
    assert batch.advantages[generated].abs().min() > 0  # computed before the filter
    assert metrics["actor/train_infer_mask_fraction"] == pytest.approx(1 / 3)
    assert metrics["actor/is_weight_clipfrac"] == pytest.approx(1 / 3)


def test_the_critic_learns_from_the_tokens_the_filter_takes_out_of_the_policys_loss() -> None:
    # GAE with a token filter: the policy's loss mask loses the token of ratio e, the
    # critic's value mask keeps every response token (ROLL filters the actor's loss only)
    from types import SimpleNamespace
    from typing import cast

    from agentgym.builders.recipe import default_grpo_config
    from agentgym.trainers.batch_prep import prepare_batch
    from agentgym.trainers.grpo import TrainParts
    from agentgym.trainers.rewards import RunningMoments

    class Critic:  # values 0.5 everywhere
        def values(self, batch: object) -> torch.Tensor:
            return torch.full(batch.input_ids.shape, 0.5)  # type: ignore[attr-defined]

    episodes = filtered_episodes()
    config = default_grpo_config(
        adv_estimator="gae", drop_zero_variance_groups=False, step_advantage_weight=0.0,
        old_logprobs="trainer",
        train_infer_correction=CorrectionConfig(None, (RatioFilter("token", (0.5, 2.0), None),)),
    )  # fmt: skip
    parts = cast(
        TrainParts,
        SimpleNamespace(
            strategy=ProximalPolicy(),
            critic=Critic(),
            pad_token_id=0,
            reward_moments=RunningMoments(),
        ),
    )
    batch = prepare_batch(config, parts, episodes, {})
    assert batch is not None and batch.value_mask is not None
    generated = batch.engine_logprobs != 0
    assert batch.loss_mask[generated].tolist() == [0, 1, 1]
    assert batch.value_mask[generated].tolist() == [1, 1, 1]
