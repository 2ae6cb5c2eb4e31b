"""The torch strategy: a Hugging Face causal LM trained in this process (CPU or one GPU)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from agentgym.trainers.strategies.base import (
    LossFunction,
    Metric,
    ModelOutputs,
    PolicyBase,
    accumulated_step,
)
from agentgym.trainers.strategies.batching import TokenBudget, cut, fit_width, in_batch_order
from agentgym.trainers.strategies.hf_folder import load_weights, save_model, write_streamed
from agentgym.trainers.strategies.lora import (
    ADAPTER_DIR,
    AdapterOff,
    LoraSettings,
    add_adapter,
    load_adapter,
    merged_weights,
    save_adapter,
)
from agentgym.trainers.strategies.optim import (
    build_optimizer,
    load_optimizer,
    optimizer_step,
    save_optimizer,
)
from agentgym.trainers.strategies.settings import PolicySettings, load_reference
from agentgym.trainers.strategies.vocab import VocabSlice, first_scored, next_token_logprobs
from agentgym.trajectory import RolloutBatch


def forward(
    model: Any,
    batch: RolloutBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    with_logits: bool = False,
    scored_only: bool = False,
) -> ModelOutputs:
    """Token log-probabilities of ``batch`` under ``model``, aligned with ``input_ids``.

    The logits are divided by ``temperature`` first (when it is > 0), so the
    log-probabilities are those of the distribution the engine sampled from.
    ``scored_only``: the log-probabilities are 0 off the loss mask, and the LM head runs
    from the batch's first loss-masked token on (the prompt before it is scored by no
    loss; TRL's ``logits_to_keep``) for models whose ``forward`` takes
    ``logits_to_keep``; entropy and logits are 0 before that token.
    """
    width = batch.input_ids.shape[1]
    first = first_scored(batch) if scored_only and _takes_logits_to_keep(model) else 1
    extra = {"logits_to_keep": width - first + 1} if first > 1 else {}
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        **extra,
    ).logits  # [B, T-first+1, V]: position t predicts token t + 1
    # One fp32 copy of the logits, worked in place (vocab.py).
    picked, token_entropy = next_token_logprobs(
        logits,
        batch.input_ids[:, first:],
        VocabSlice.whole(logits.shape[-1]),
        temperature=temperature,
        with_entropy=with_entropy,
    )  # [B, T-first]
    zeros = picked.new_zeros(picked.shape[0], first)
    entropy = None if token_entropy is None else torch.cat([zeros, token_entropy], 1)  # [B, T]
    full_logits = None
    if with_logits:  # the tempered logits themselves
        tempered = logits[:, :-1].float()
        if temperature > 0 and temperature != 1.0:
            tempered = tempered / temperature
        pad = tempered.new_zeros(tempered.shape[0], first, tempered.shape[2])
        full_logits = torch.cat([pad, tempered], 1)  # [B, T, V]
    if scored_only:  # the same zeros off the loss mask however the rows were cut
        picked = picked * batch.loss_mask[:, first:].to(picked.dtype)
    return ModelOutputs(torch.cat([zeros, picked], 1), entropy, full_logits)


def cut_logprobs(
    model: Any,
    parts: Sequence[RolloutBatch],
    order: torch.Tensor,
    width: int,
    temperature: float,
    device: torch.device,
) -> torch.Tensor:
    """``[B, T]`` log-probabilities (``T``: ``width``) of a batch :func:`~.batching.cut`
    into ``parts`` in ``order``, one forward pass per part on ``device``, on the CPU."""
    rows = [torch.zeros(0, width)]  # an empty share (more ranks than rows) is [0, T]
    for part in parts:
        out = forward(model, to_device(part, device), temperature=temperature, scored_only=True)
        rows.append(fit_width(out.logprobs.cpu(), width))
    return in_batch_order(torch.cat(rows), order)  # [B, T]


def micro_batch_loss(
    model: Any, reference: Any, batch: RolloutBatch, loss_fn: LossFunction, *, temperature: float
) -> tuple[torch.Tensor, dict[str, Metric]]:
    """``loss_fn`` on ``model``'s :func:`forward` of ``batch`` with what the loss needs
    (entropy, logits, and the reference's logits, without gradient).

    Raises:
        RuntimeError: If the loss needs reference logits and ``reference`` is None.
    """
    needs = loss_fn.needs
    outputs = forward(
        model,
        batch,
        temperature=temperature,
        with_entropy=needs.entropy,
        with_logits=needs.logits,
        scored_only=True,
    )
    if needs.ref_logits:
        if reference is None:
            raise RuntimeError("the loss needs reference logits; build with reference_path")
        with torch.no_grad():
            outputs.ref_logits = forward(
                reference, batch, temperature=temperature, with_logits=True, scored_only=True
            ).logits
    return loss_fn(outputs, batch)


_KEEPS: dict[type, bool] = {}


def _takes_logits_to_keep(model: Any) -> bool:
    """Whether the model's class takes ``logits_to_keep``: under a LoRA wrapper, its
    base's; under a wrapper that is no module (the adapter-off reference), its model's."""
    import inspect

    base = model
    for _ in range(4):
        if hasattr(base, "get_base_model"):
            base = base.get_base_model()
        elif not isinstance(base, torch.nn.Module) and hasattr(base, "model"):
            base = base.model
        else:
            break
    kind = type(base)
    if kind not in _KEEPS:
        method = getattr(kind, "forward", None)
        _KEEPS[kind] = (
            method is not None and "logits_to_keep" in inspect.signature(method).parameters
        )
    return _KEEPS[kind]


class TorchStrategy(PolicyBase):
    """Train a transformers causal LM with AdamW, a learning-rate schedule, gradient
    accumulation and gradient-norm clipping, in this process.

    Args:
        model_path: A local Hugging Face model folder.
        lora: Train a LoRA adapter (:mod:`~agentgym.trainers.strategies.lora`) instead of
            every weight (None); the optimizer holds the adapter's parameters only. With
            a ``reference_path``, it must be the policy's own folder: the reference is
            the base under the adapter (:class:`~.lora.AdapterOff`), no second copy.
        **settings: :class:`~.settings.PolicySettings` (dtype, device, optimizer,
            temperature, ``micro_batch_size`` rows per forward pass of :meth:`logprobs`,
            the reference's folder, ...).
    """

    collective_io: ClassVar[bool] = False
    """Data parallelism: rank 0 alone saves and exports (every rank holds the same state)."""

    def __init__(
        self, model_path: str | Path, *, lora: LoraSettings | None = None, **settings: Any
    ) -> None:
        self.settings = PolicySettings(**settings)
        reference_path = self.settings.reference_path
        if lora is not None and reference_path is not None:
            _check_lora_reference(model_path, reference_path)
        self.model_path = Path(model_path)
        self.lora = lora
        self.device = torch.device(self.settings.device)
        self.model = self._load(self.model_path)
        if self.settings.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        if lora is None:
            self.reference = load_reference(reference_path, self._load)
        else:
            if self.settings.gradient_checkpointing:
                # the frozen embedding's output must carry a gradient
                self.model.enable_input_require_grads()
            self.model = add_adapter(self.model, lora)
            self.reference = None if reference_path is None else AdapterOff(self.model)
        self.optimizer, self.scheduler = build_optimizer(self.model, self.settings.optimizer)

    def _load(self, path: Path) -> Any:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=getattr(torch, self.settings.dtype), **self.settings.attention()
        )
        return model.to(self.device)  # type: ignore[arg-type]

    def _to_device(self, batch: RolloutBatch) -> RolloutBatch:
        return to_device(batch, self.device)

    @torch.no_grad()
    def _logprobs(
        self, model: Any, batch: RolloutBatch, budget: TokenBudget | None
    ) -> torch.Tensor:
        parts, order = cut(batch, self.settings.micro_batch_size, budget)
        width = batch.input_ids.shape[1]
        return cut_logprobs(model, parts, order, width, self.settings.temperature, self.device)

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> dict[str, Metric]:
        """One optimizer step over ``micro_batches`` with gradient accumulation.

        Each micro-batch's loss is already its share of the whole (see
        :class:`~agentgym.trainers.strategies.base.LossFunction`), so the
        gradients add up without rescaling.
        """
        return accumulated_step(self, micro_batches, loss_fn)

    def accumulate(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> list[dict[str, Metric]]:
        """Zero the gradients, then add up those of ``micro_batches``.

        Returns:
            Each micro-batch's metrics, in order (a data-parallel group folds
            all ranks' lists in the mini-batch's order).
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        results = []
        for part in micro_batches:
            part = self._to_device(part)
            loss, metrics = micro_batch_loss(
                self.model, self.reference, part, loss_fn, temperature=self.settings.temperature
            )
            loss.backward()
            results.append(metrics)
        return results

    def optimizer_step(self) -> dict[str, Metric]:
        """Sum the gradients over the data-parallel group (when ``torch.distributed`` is
        initialized), clip them and step the optimizer and the schedule.

        Returns:
            ``grad_norm`` (before clipping) and ``lr`` (of this step).
        """
        max_grad_norm = self.settings.optimizer.max_grad_norm
        return optimizer_step(self.model, self.optimizer, self.scheduler, max_grad_norm)

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's parameters and buffers by Hugging Face name (the live tensors);
        with LoRA, the base's names with each adapted weight merged, computed one at
        a time (:func:`~.lora.merged_weights`)."""
        if self.lora is not None:
            yield from merged_weights(self.model)
        else:
            yield from self.model.state_dict().items()

    def save(self, directory: Path) -> None:
        """Write a complete Hugging Face folder (weights, sharded past
        :data:`~agentgym.trainers.strategies.hf_folder.MAX_SHARD_SIZE`, config,
        tokenizer, chat template) under ``model/``, and the optimizer and scheduler states.
        With LoRA, also the adapter under :data:`~.lora.ADAPTER_DIR` (what :meth:`load`
        reads); ``model/`` holds the merged weights, written tensor by tensor."""
        if self.lora is not None:
            save_adapter(self.model, directory / ADAPTER_DIR)
            write_streamed(
                directory / "model",
                merged_weights(self.model),
                model=self.model.get_base_model(),
                tokenizer_from=self.model_path,
            )
        else:
            save_model(self.model, directory / "model", tokenizer_from=self.model_path)
        save_optimizer(self.optimizer, self.scheduler, directory)

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote, in place (any shard layout, tied weights;
        with LoRA, the adapter on the base this strategy was built from)."""
        if self.lora is not None:
            load_adapter(self.model, directory / ADAPTER_DIR)
        else:
            load_weights(self.model, directory / "model", device=self.device)
        load_optimizer(self.optimizer, self.scheduler, directory)


def _check_lora_reference(model_path: str | Path, reference_path: str | Path) -> None:
    if Path(reference_path).resolve() != Path(model_path).resolve():
        raise ValueError(
            f"with LoRA the reference is the policy's base ({model_path}) under the adapter; "
            f"reference_path={str(reference_path)!r} differs: pass the policy's folder, or "
            "train without LoRA to use another reference"
        )


def to_device(batch: RolloutBatch, device: torch.device) -> RolloutBatch:
    """``batch`` with its tensors on ``device`` (itself on the CPU)."""
    if device.type == "cpu":
        return batch
    moved: dict[str, Any] = {
        key: value.to(device) if isinstance(value, torch.Tensor) else value
        for key, value in vars(batch).items()
    }
    return RolloutBatch(**moved)
