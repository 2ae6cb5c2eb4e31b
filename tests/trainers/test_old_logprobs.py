"""π_old in the PPO ratio: recomputed by the trainer, or the engine's own logprobs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import torch

from agentgym.builders.recipe import default_grpo_config
from agentgym.trainers.batch_prep import prepare_batch
from agentgym.trainers.grpo import GRPOConfig, TrainParts
from agentgym.trajectory import RolloutBatch, Trajectory, Turn


def config(old_logprobs: str) -> GRPOConfig:
    return default_grpo_config(
        micro_batch_size=2, gradient_accumulation_steps=1, drop_zero_variance_groups=False,
        step_advantage_weight=0.0, step_score="turn", old_logprobs=old_logprobs,
    )  # fmt: skip


class RecordingStrategy:
    """Stands in for the trainer's forward pass: a constant logprob, calls counted."""

    def __init__(self) -> None:
        self.calls = 0

    def logprobs(self, batch: RolloutBatch, budget: object = None) -> torch.Tensor:
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
