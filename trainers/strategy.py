"""The torch training strategy: a Hugging Face causal LM on CPU or one GPU.

A strategy owns the trained model and its optimizer. The recipe asks it for
log-probabilities, hands it micro-batches and a loss function for each update,
and takes its weights to the generation backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym.trajectory import RolloutBatch


@dataclass
class ModelOutputs:
    """What one forward pass gives the loss.

    Attributes:
        logprobs: ``[B, T]`` log p(input_ids[t] | input_ids[:t]); 0 at t = 0.
        entropy: ``[B, T]`` entropy of the distribution that predicted token t
            (0 at t = 0); None unless asked for.
        logits: ``[B, T, V]`` the logits that predicted token t; None unless asked for.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    logits: torch.Tensor | None = None


LossFunction = Callable[[ModelOutputs, RolloutBatch], tuple[torch.Tensor, dict[str, float]]]


def forward(
    model: Any, batch: RolloutBatch, *, with_entropy: bool = False, with_logits: bool = False
) -> ModelOutputs:
    """Token log-probabilities of ``batch`` under ``model``, aligned with ``input_ids``."""
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits.float()[:, :-1]  # [B, T-1, V]: position t predicts token t + 1
    logprobs = torch.log_softmax(logits, -1)
    picked = logprobs.gather(-1, batch.input_ids[:, 1:, None])[..., 0]  # [B, T-1]
    zeros = picked.new_zeros(picked.shape[0], 1)
    entropy = None
    if with_entropy:
        entropy = torch.cat([zeros, -(logprobs.exp() * logprobs).sum(-1)], 1)  # [B, T]
    full_logits = None
    if with_logits:
        full_logits = torch.cat([logits.new_zeros(logits.shape[0], 1, logits.shape[2]), logits], 1)
    return ModelOutputs(torch.cat([zeros, picked], 1), entropy, full_logits)


def micro_batches(batch: RolloutBatch, size: int) -> Iterator[RolloutBatch]:
    """Consecutive row slices of ``batch``, each trimmed to its longest sequence."""
    for start in range(0, len(batch), size):
        rows = slice(start, start + size)
        yield batch.rows(rows, width=int(batch.attention_mask[rows].sum(1).max()))


class TorchStrategy:
    """Train a transformers causal LM with AdamW, linear warmup, gradient
    accumulation and gradient-norm clipping.

    Args:
        model_path: A local model folder.
        dtype: Parameter dtype (``float32``, ``bfloat16``).
        device: ``cpu`` or ``cuda``.
        gradient_checkpointing: Trade compute for activation memory.
        learning_rate: AdamW learning rate after warmup.
        weight_decay: AdamW weight decay.
        warmup_steps: Optimizer steps of linear warmup from 0.
        max_grad_norm: Clip the global gradient norm to this (None: no clipping).
        betas: AdamW betas.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        gradient_checkpointing: bool = False,
        learning_rate: float = 1e-6,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        max_grad_norm: float | None = 1.0,
        betas: Sequence[float] = (0.9, 0.999),
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_path), dtype=getattr(torch, dtype)
        ).to(self.device)  # type: ignore[arg-type]
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=learning_rate,
            weight_decay=weight_decay,
            betas=(float(betas[0]), float(betas[1])),
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / (warmup_steps + 1))
        )

    def to_device(self, batch: RolloutBatch) -> RolloutBatch:
        """Move ``batch``'s tensors to the model's device."""
        if self.device.type == "cpu":
            return batch
        moved: dict[str, Any] = {
            key: value.to(self.device) if isinstance(value, torch.Tensor) else value
            for key, value in vars(batch).items()
        }
        return RolloutBatch(**moved)

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
        """``[B, T]`` log-probabilities of ``batch`` under the current weights (no gradient)."""
        self.model.eval()
        width = batch.input_ids.shape[1]
        parts = []
        for part in micro_batches(batch, micro_batch_size):
            values = forward(self.model, self.to_device(part)).logprobs.cpu()
            parts.append(torch.nn.functional.pad(values, (0, width - values.shape[1])))
        return torch.cat(parts)

    def train_step(
        self,
        parts: Sequence[RolloutBatch],
        loss_fn: LossFunction,
        *,
        with_entropy: bool = False,
        with_logits: bool = False,
        sum_parts: bool = False,
    ) -> dict[str, float]:
        """One optimizer step over ``parts`` with gradient accumulation.

        Each part's loss is divided by ``len(parts)``, unless ``sum_parts``
        says the losses are already shares of the whole (normalized by its counts).

        Returns:
            The loss function's metrics averaged over parts, plus ``grad_norm`` and ``lr``.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        for part in parts:
            part = self.to_device(part)
            outputs = forward(self.model, part, with_entropy=with_entropy, with_logits=with_logits)
            loss, metrics = loss_fn(outputs, part)
            (loss if sum_parts else loss / len(parts)).backward()
            for key, value in metrics.items():  # loss-like metrics add up when sum_parts
                share = 1.0 if sum_parts and "loss" in key else 1.0 / len(parts)
                totals[key] = totals.get(key, 0.0) + float(value) * share
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(parameters, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters]))
        totals["grad_norm"] = float(norm)
        totals["lr"] = float(self.scheduler.get_last_lr()[0])
        self.optimizer.step()
        self.scheduler.step()
        return totals

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's parameters and buffers by Hugging Face name."""
        yield from self.model.state_dict().items()

    def save(self, directory: Path) -> None:
        """Write the model (as a Hugging Face folder), optimizer and scheduler."""
        self.model.save_pretrained(directory / "model")
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), directory / "scheduler.pt")

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote, in place (a backend sharing the model sees it)."""
        from safetensors.torch import load_file

        weights = load_file(str(directory / "model" / "model.safetensors"), device=str(self.device))
        self.model.load_state_dict(weights)
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=True))
        self.scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=True))
