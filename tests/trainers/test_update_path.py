"""The update path is exact: micro-batches (trimmed to their longest row, as the
recipe cuts them) give the whole mini-batch's gradient and metrics, for every
``loss_agg_mode``, with the KL and entropy terms on, and ROLL's extra terms:
the SFT/TOPR term mixed with ``rl_loss_coef``, length sample weights and dual-clip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentgym.builders.recipe import default_grpo_config
from agentgym.trainers.loss_terms import sample_weights
from agentgym.trainers.losses import LOSS_AGG_MODES
from agentgym.trainers.objectives import PolicyLoss
from agentgym.trainers.strategies import micro_batches
from agentgym.trainers.strategies.optim import OptimizerConfig
from agentgym.trainers.strategies.torch_strategy import TorchStrategy
from agentgym.trainers.updates import update_policy
from agentgym.trajectory import RolloutBatch

ROWS, WIDTH, VOCAB_IDS = 6, 14, 50


def ragged_batch(seed: int = 0) -> RolloutBatch:
    """Six rows of lengths 14, 5, 9, 3, 12, 7 with generated tokens at random places;
    row 3 has none (its sequence does not count)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([14, 5, 9, 3, 12, 7])
    columns = torch.arange(WIDTH)[None, :]
    attention = (columns < lengths[:, None]).long()  # [B, T]
    loss_mask = (torch.rand(ROWS, WIDTH, generator=generator) < 0.6).long() * attention
    loss_mask[:, 0] = 0
    loss_mask[3] = 0
    input_ids = torch.randint(3, VOCAB_IDS, (ROWS, WIDTH), generator=generator) * attention
    old = -torch.rand(ROWS, WIDTH, generator=generator) * 3 * loss_mask
    batch = RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=columns * attention,
        loss_mask=loss_mask,
        engine_logprobs=old,
        token_rewards=torch.zeros(ROWS, WIDTH),
        scores=torch.zeros(ROWS),
        group_ids=torch.zeros(ROWS, dtype=torch.long),
        tags=["t"] * ROWS,
    )
    batch.old_logprobs = old
    batch.ref_logprobs = (old - 0.3 * torch.rand(ROWS, WIDTH, generator=generator)) * loss_mask
    batch.advantages = torch.randn(ROWS, 1, generator=generator).expand(ROWS, WIDTH) * loss_mask
    return batch


def strategy(model_dir: Path) -> TorchStrategy:
    torch.manual_seed(0)
    return TorchStrategy(
        model_dir,
        optimizer=OptimizerConfig(learning_rate=0.0, max_grad_norm=None),
        temperature=0.7,
        micro_batch_size=2,
    )


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


ISSUE_19_TERMS = {
    "sft_loss_coef": 0.3,
    "use_topr_loss": True,
    "rl_loss_coef": 0.7,
    "length_loss_weight": True,
    "dual_clip_ratio_c": 1.2,  # ROLL's dual_clip_loss at pg_clip 0.1
}


@pytest.mark.parametrize("terms", [{}, ISSUE_19_TERMS], ids=["ppo_kl_entropy", "issue_19_terms"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_give_the_whole_mini_batch_gradient_and_metrics(
    tiny_model_dir: Path, mode: str, terms: dict[str, object]
) -> None:
    config = default_grpo_config(
        loss_agg_mode=mode,
        loss_scale_factor=64,
        use_kl_loss=True,
        kl_penalty="low_var_kl",
        entropy_loss_coef=0.01,
        clip_ratio_low=0.1,
        clip_ratio_high=0.1,
        **terms,
    )
    batch = ragged_batch()
    if terms:
        batch.scores = torch.tensor([1.0, 0.0, 2.0, 1.0, -1.0, 0.0])  # both TOPR branches
        batch.sample_weights = sample_weights(batch.loss_mask, length_loss_weight=True)
    counts = {
        "num_tokens": batch.loss_mask.sum(),
        "num_seqs": (batch.loss_mask.sum(1) > 0).sum(),
    }
    whole, split = strategy(tiny_model_dir), strategy(tiny_model_dir)
    full = whole.train_step([batch], PolicyLoss(config.loss, **counts))
    parts = list(micro_batches(batch, 2))
    assert [p.input_ids.shape[1] for p in parts] == [14, 9, 12]  # trimmed: the real cut
    accumulated = split.train_step(parts, PolicyLoss(config.loss, **counts))

    for name, grad in gradients(whole.model).items():
        torch.testing.assert_close(gradients(split.model)[name], grad, atol=1e-6, rtol=1e-5)
    assert set(accumulated) == set(full)
    keys = ["loss", "pg_loss", "kl", "entropy", "clipfrac", "clipfrac_low", "clipfrac_high",
            "approx_kl", "ratio_mean", "ratio_min", "ratio_max", "grad_norm"]  # fmt: skip
    if terms:
        keys += ["sft_loss", "dual_clipfrac"]
    for key in keys:
        assert accumulated[key].value == pytest.approx(full[key].value, rel=1e-5, abs=1e-6), key
    assert full["ratio_max"].value > full["ratio_min"].value  # the temperature moved the ratios


def test_update_policy_averages_updates_and_keeps_the_extremes(tiny_model_dir: Path) -> None:
    # two mini-batches of 3 rows: each metric is the mean of the two mini-batch values,
    # except ratio_min/ratio_max, the extremes over both
    config = default_grpo_config(
        micro_batch_size=1, gradient_accumulation_steps=3, entropy_loss_coef=0.01
    )
    batch = ragged_batch(seed=1)
    logged = update_policy(config, strategy(tiny_model_dir), batch, step=1)
    order = torch.randperm(
        ROWS, generator=torch.Generator().manual_seed(config.schedule.seed * 100_003 + 1)
    )
    probe = strategy(tiny_model_dir)
    values: dict[str, list[float]] = {}
    for rows in (order[:3], order[3:]):
        chunk = batch.rows(rows, width=int(batch.attention_mask[rows].sum(1).max()))
        counts = {
            "num_tokens": chunk.loss_mask.sum().clamp(min=1),
            "num_seqs": (chunk.loss_mask.sum(1) > 0).sum().clamp(min=1),
        }
        for key, metric in probe.train_step([chunk], PolicyLoss(config.loss, **counts)).items():
            values.setdefault(key, []).append(metric.value)
    assert logged["actor/updates"] == 2.0
    assert logged["actor/entropy"] == pytest.approx(sum(values["entropy"]) / 2, rel=1e-5)
    assert logged["actor/loss"] == pytest.approx(sum(values["loss"]) / 2, rel=1e-5, abs=1e-7)
    assert logged["actor/ratio_min"] == pytest.approx(min(values["ratio_min"]), rel=1e-6)
    assert logged["actor/ratio_max"] == pytest.approx(max(values["ratio_max"]), rel=1e-6)


def test_trainer_logprobs_are_at_the_sampling_temperature(tiny_model_dir: Path) -> None:
    batch = ragged_batch()
    trainer = strategy(tiny_model_dir)
    with torch.no_grad():
        logits = trainer.model(input_ids=batch.input_ids).logits.float()[:, :-1] / 0.7
    expected = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    got = trainer.logprobs(batch)[:, 1:]
    scored = batch.loss_mask[:, 1:].bool()  # the trainer's log-probabilities: 0 off the mask
    torch.testing.assert_close(got[scored], expected[scored], atol=1e-5, rtol=1e-5)
    assert torch.all(got[~scored] == 0)
