"""π_old in the PPO ratio: recomputed by the trainer, or the engine's own logprobs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import torch

from agentgym.trainers.grpo import GRPOConfig, TrainParts, prepare_batch
from agentgym.trajectory import RolloutBatch, Trajectory, Turn


def config(old_logprobs: str) -> GRPOConfig:
    return GRPOConfig(
        max_steps=1, save_steps=1, logging_steps=1, eval_steps=0, ppo_epochs=1,
        micro_batch_size=2, gradient_accumulation_steps=1, adv_estimator="grpo", gamma=1.0,
        whiten_advantages=False, reward_clip=None, advantage_clip=None, grouping="state",
        normalization="mean_std", drop_zero_variance_groups=False, clip_ratio_low=0.2,
        clip_ratio_high=0.2, dual_clip_ratio_c=None, loss_agg_mode="token-mean",
        use_kl_loss=False, kl_loss_coef=0.0, kl_penalty="kl", add_token_level_kl=False,
        init_kl_coef=0.0, entropy_loss_coef=0.0, tis_cap=None, val_renders=0, seed=0,
        old_logprobs=old_logprobs,
    )  # fmt: skip


class RecordingStrategy:
    """Stands in for the trainer's forward pass: a constant logprob, calls counted."""

    def __init__(self) -> None:
        self.calls = 0

    def logprobs(self, batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
        self.calls += 1
        return torch.full(batch.input_ids.shape, -0.5)


def trajectories() -> list[Trajectory]:
    """One group of two episodes, two- and one-token responses with distinct engine logprobs."""
    return [
        Trajectory(
            "sokoban", "tag", group_id=0, seed=0,
            turns=[Turn([5, 6], [7, 8], [-0.25, -1.5], "", "stop", reward=1.0)], score=1.0,
        ),
        Trajectory(
            "sokoban", "tag", group_id=0, seed=0,
            turns=[Turn([5, 6], [9], [-2.0], "", "stop", reward=0.0)], score=0.0,
        ),
    ]  # fmt: skip


def prepared(old_logprobs: str) -> tuple[RolloutBatch, RecordingStrategy, dict[str, float]]:
    strategy = RecordingStrategy()
    parts = cast(TrainParts, SimpleNamespace(strategy=strategy, reference=None, pad_token_id=0))
    metrics: dict[str, float] = {}
    batch = prepare_batch(config(old_logprobs), parts, trajectories(), metrics)
    assert batch is not None
    return batch, strategy, metrics


def test_engine_old_logprobs_are_the_sampling_logprobs_without_a_forward_pass() -> None:
    batch, strategy, metrics = prepared("engine")
    assert strategy.calls == 0
    assert batch.old_logprobs is not None
    mask = batch.loss_mask.bool()
    assert batch.old_logprobs[mask].tolist() == [-0.25, -1.5, -2.0]
    assert batch.old_logprobs[~mask].abs().sum() == 0
    assert not any(key.startswith("actor/engine_") for key in metrics)


def test_trainer_old_logprobs_are_recomputed_and_compared_with_the_engine() -> None:
    batch, strategy, metrics = prepared("trainer")
    assert strategy.calls == 1
    assert batch.old_logprobs is not None
    mask = batch.loss_mask.bool()
    assert batch.old_logprobs[mask].tolist() == [-0.5, -0.5, -0.5]
    gaps = [key for key in metrics if key.startswith("actor/engine_")]
    assert gaps and max(abs(metrics[key]) for key in gaps) > 0


def test_advantages_do_not_depend_on_the_old_logprob_source() -> None:
    engine, _, _ = prepared("engine")
    trainer, _, _ = prepared("trainer")
    assert engine.advantages is not None and trainer.advantages is not None
    assert engine.advantages.abs().sum() > 0
    assert torch.equal(engine.advantages, trainer.advantages)
