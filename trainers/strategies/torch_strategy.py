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
    accumulated_step,
    frozen_reference,
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
    OptimizerConfig,
    build_optimizer,
    load_optimizer,
    optimizer_step,
    save_optimizer,
)
from agentgym.trainers.strategies.vocab import first_scored, next_token_logprobs
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
        vocab_start=0,
        vocab_size=logits.shape[-1],
        temperature=temperature,
        reduce_sum=_same,
        reduce_max=_same,
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


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor  # one device holds the whole vocabulary: a sum over it is the sum


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


class TorchStrategy:
    """Train a transformers causal LM with AdamW, a learning-rate schedule, gradient
    accumulation and gradient-norm clipping, in this process.

    Args:
        model_path: A local Hugging Face model folder.
        dtype: Parameter dtype of the policy and the reference (``float32``, ``bfloat16``).
        device: ``cpu`` or ``cuda``.
        gradient_checkpointing: Trade compute for activation memory.
        optimizer: AdamW, its schedule and gradient clipping.
        temperature: The sampling temperature; logits are divided by it.
        micro_batch_size: Rows per forward pass of :meth:`logprobs`.
        reference_path: The frozen reference model's folder (None: no reference). With
            ``lora``, the policy's own folder: the reference is the base under the
            adapter (:class:`~.lora.AdapterOff`), no second copy.
        attn_implementation: Passed to ``from_pretrained`` (None: transformers' default).
        lora: Train a LoRA adapter (:mod:`~agentgym.trainers.strategies.lora`) instead of
            every weight (None); the optimizer holds the adapter's parameters only.
    """

    collective_io: ClassVar[bool] = False
    """Data parallelism: rank 0 alone saves and exports (every rank holds the same state)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        gradient_checkpointing: bool = False,
        optimizer: OptimizerConfig = OptimizerConfig(),
        temperature: float = 1.0,
        micro_batch_size: int = 128,
        reference_path: str | Path | None = None,
        attn_implementation: str | None = None,
        lora: LoraSettings | None = None,
    ) -> None:
        optimizer.schedule()  # a bad schedule fails before the model is read
        if lora is not None and reference_path is not None:
            _check_lora_reference(model_path, reference_path)
        self.model_path = Path(model_path)
        self.lora = lora
        self.device = torch.device(device)
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm = optimizer.max_grad_norm
        self.model = self._load(model_path, dtype, attn_implementation)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.reference: Any = None
        if lora is not None:
            if gradient_checkpointing:  # the frozen embedding's output must carry a gradient
                self.model.enable_input_require_grads()
            self.model = add_adapter(self.model, lora)
            if reference_path is not None:
                self.reference = AdapterOff(self.model)
        elif reference_path is not None:
            self.reference = self._load(reference_path, dtype, attn_implementation)
            self.reference.eval().requires_grad_(False)
        self.optimizer, self.scheduler = build_optimizer(self.model, optimizer)

    def _load(self, path: str | Path, dtype: str, attn_implementation: str | None) -> Any:
        from transformers import AutoModelForCausalLM

        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=getattr(torch, dtype), **extra
        )
        return model.to(self.device)  # type: ignore[arg-type]

    def _to_device(self, batch: RolloutBatch) -> RolloutBatch:
        return to_device(batch, self.device)

    def train(self, mode: bool = True) -> None:
        """Training (dropout on) or evaluation mode of the policy."""
        self.model.train(mode)

    @torch.no_grad()
    def _logprobs(
        self, model: Any, batch: RolloutBatch, budget: TokenBudget | None
    ) -> torch.Tensor:
        width = batch.input_ids.shape[1]
        parts, order = cut(batch, self.micro_batch_size, budget)
        rows = [torch.zeros(0, width)]  # an empty share (more ranks than rows) is [0, T]
        for part in parts:
            out = forward(
                model, self._to_device(part), temperature=self.temperature, scored_only=True
            )
            rows.append(fit_width(out.logprobs.cpu(), width))
        return in_batch_order(torch.cat(rows), order)  # [B, T]

    def logprobs(self, batch: RolloutBatch, budget: TokenBudget | None = None) -> torch.Tensor:
        """``[B, T]`` log-probabilities under the current weights (eval mode, no gradient),
        0 off the loss mask, on ``budget``'s micro-batches (None: ``micro_batch_size``
        rows each)."""
        was_training = self.model.training
        self.model.eval()
        try:
            return self._logprobs(self.model, batch, budget)
        finally:
            self.model.train(was_training)

    def reference_logprobs(
        self, batch: RolloutBatch, budget: TokenBudget | None = None
    ) -> torch.Tensor:
        """``[B, T]`` log-probabilities under the frozen reference (``budget``: as
        :meth:`logprobs`).

        Raises:
            RuntimeError: If the strategy was built without a reference.
        """
        return self._logprobs(frozen_reference(self.reference), batch, budget)

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
        needs = loss_fn.needs
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        results = []
        for part in micro_batches:
            part = self._to_device(part)
            outputs = forward(
                self.model,
                part,
                temperature=self.temperature,
                with_entropy=needs.entropy,
                with_logits=needs.logits,
                scored_only=True,
            )
            if needs.ref_logits:
                if self.reference is None:
                    raise RuntimeError("the loss needs reference logits; build with reference_path")
                with torch.no_grad():
                    outputs.ref_logits = forward(
                        self.reference,
                        part,
                        temperature=self.temperature,
                        with_logits=True,
                        scored_only=True,
                    ).logits
            loss, metrics = loss_fn(outputs, part)
            loss.backward()
            results.append(metrics)
        return results

    def optimizer_step(self) -> dict[str, Metric]:
        """Sum the gradients over the data-parallel group (when ``torch.distributed`` is
        initialized), clip them and step the optimizer and the schedule.

        Returns:
            ``grad_norm`` (before clipping) and ``lr`` (of this step).
        """
        return optimizer_step(self.model, self.optimizer, self.scheduler, self.max_grad_norm)

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
