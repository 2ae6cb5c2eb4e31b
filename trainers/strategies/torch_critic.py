"""The torch critic: the policy's architecture with a one-output value head, in this process.

The value model is ``AutoModelForTokenClassification`` with one label,
initialised from a causal LM folder (the policy's): the transformer body loads
its weights, the head (``score``, hidden size → 1) starts fresh, as ROLL's
``auto_token_classification`` critic and verl's critic. Dropout before the head
is off (``classifier_dropout: 0``, as verl sets it): a regression target gains
nothing from it, and with it the values of one batch would vary per call.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from agentgym.trainers.strategies.base import (
    Metric,
    ValueLossFunction,
    accumulated_step,
    evaluating,
    micro_batches,
)
from agentgym.trainers.strategies.hf_folder import load_weights, save_model
from agentgym.trainers.strategies.optim import (
    build_optimizer,
    load_optimizer,
    optimizer_step,
    save_optimizer,
)
from agentgym.trainers.strategies.settings import ModelSettings
from agentgym.trainers.strategies.torch_strategy import to_device
from agentgym.trajectory import RolloutBatch


def value_forward(model: Any, batch: RolloutBatch) -> torch.Tensor:
    """``[B, T]`` values aligned with ``input_ids``: position ``t`` holds the head's
    output at ``t - 1`` (the value of the prefix before token ``t``), 0 at ``t = 0``."""
    head = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits.float()[..., 0]  # [B, T]
    return torch.cat([head.new_zeros(head.shape[0], 1), head[:, :-1]], 1)  # [B, T]


class TorchCritic:
    """Train a value model with AdamW, a learning-rate schedule, gradient accumulation and
    gradient-norm clipping, in this process.

    Args:
        model_path: A causal LM folder (the policy's) or a saved value model.
        seed: Seeds the fresh value head's initialization (the global RNG is left as it was),
            so that a run repeats.
        **settings: :class:`~.settings.ModelSettings` (``optimizer``'s ``total_steps``:
            the critic's optimizer steps over the run; ROLL's count has no ``ppo_epochs``;
            ``micro_batch_size``: rows per forward pass of :meth:`values`).
    """

    collective_io: ClassVar[bool] = False
    """Data parallelism: rank 0 alone saves and exports (every rank holds the same state)."""

    def __init__(self, model_path: str | Path, *, seed: int = 0, **settings: Any) -> None:
        from transformers import AutoConfig, AutoModelForTokenClassification

        self.settings = ModelSettings(**settings)
        self.device = torch.device(self.settings.device)
        config = AutoConfig.from_pretrained(str(model_path), num_labels=1)
        config.classifier_dropout = 0.0  # set after loading: from_pretrained drops unknown keys
        with torch.random.fork_rng(devices=[]):  # the CPU's RNG only, restored after
            torch.default_generator.manual_seed(seed)  # the head is initialised on the CPU
            model = AutoModelForTokenClassification.from_pretrained(
                str(model_path),
                config=config,
                dtype=getattr(torch, self.settings.dtype),
                **self.settings.attention(),
            )
        self.model = model.to(self.device)
        if self.settings.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.optimizer, self.scheduler = build_optimizer(self.model, self.settings.optimizer)

    def set_training(self, training: bool) -> None:
        """Training (``True``) or evaluation mode of the value model."""
        self.model.train(training)

    @torch.no_grad()
    def values(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]`` values under the current weights (eval mode, no gradient)."""
        width = batch.input_ids.shape[1]
        parts = [torch.zeros(0, width)]  # an empty share (more ranks than rows) is [0, T]
        with evaluating(self.model):
            for part in micro_batches(batch, self.settings.micro_batch_size):
                values = value_forward(self.model, to_device(part, self.device)).cpu()
                parts.append(torch.nn.functional.pad(values, (0, width - values.shape[1])))
        return torch.cat(parts)  # [B, T]

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: ValueLossFunction
    ) -> dict[str, Metric]:
        """One optimizer step over ``micro_batches`` (each loss is its share of the whole)."""
        return accumulated_step(self, micro_batches, loss_fn)

    def accumulate(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: ValueLossFunction
    ) -> list[dict[str, Metric]]:
        """Zero the gradients, then add up those of ``micro_batches``; each one's metrics."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        results = []
        for part in micro_batches:
            part = to_device(part, self.device)
            loss, metrics = loss_fn(value_forward(self.model, part), part)
            loss.backward()
            results.append(metrics)
        return results

    def optimizer_step(self) -> dict[str, Metric]:
        """Sum the gradients over the data-parallel group, clip, step; ``grad_norm``, ``lr``."""
        max_grad_norm = self.settings.optimizer.max_grad_norm
        return optimizer_step(self.model, self.optimizer, self.scheduler, max_grad_norm)

    def save(self, directory: Path) -> None:
        """Write the value model under ``model/`` and the optimizer and scheduler states."""
        save_model(self.model, directory / "model")
        save_optimizer(self.optimizer, self.scheduler, directory)

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote, in place (any shard layout, tied weights)."""
        load_weights(self.model, directory / "model", device=self.device)
        load_optimizer(self.optimizer, self.scheduler, directory)
