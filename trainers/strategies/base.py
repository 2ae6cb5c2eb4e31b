"""The ``Strategy`` seam: what the recipe asks of whatever trains the policy.

A strategy owns the trained model, its optimizer, and the frozen reference
model; nothing outside a strategy (or a generation backend) touches a model
object. The recipe hands it :class:`~agentgym.trajectory.RolloutBatch` data
and a :class:`LossFunction`, and takes its weights by Hugging Face name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar, runtime_checkable

import torch

from agentgym.trajectory import RolloutBatch

if TYPE_CHECKING:
    from agentgym.trainers.strategies.batching import TokenBudget

Reduce = Literal["sum", "mean", "min", "max"]
"""How a metric combines over micro-batches: ``sum`` (each micro-batch holds a
share of the whole, normalized by the whole's counts), ``mean``, ``min``, ``max``."""


@dataclass(frozen=True)
class Metric:
    """A scalar a loss function reports, with how it combines over micro-batches."""

    value: float
    reduce: Reduce = "mean"


class MetricReducer:
    """Combine :class:`Metric` values by their declared reduction.

    ``sum`` metrics add up; ``mean`` metrics average over the values added;
    ``min``/``max`` keep the extreme. A key's reduction must not change.
    """

    def __init__(self) -> None:
        self._values: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._kinds: dict[str, Reduce] = {}

    def add(self, metrics: Mapping[str, Metric]) -> None:
        """Fold one micro-batch's (or one update's) metrics in."""
        for key, metric in metrics.items():
            kind = self._kinds.setdefault(key, metric.reduce)
            if kind != metric.reduce:
                raise ValueError(f"metric {key!r} changed its reduction: {kind} -> {metric.reduce}")
            value = float(metric.value)
            if key not in self._values:
                self._values[key], self._counts[key] = value, 1
                continue
            old = self._values[key]
            self._counts[key] += 1
            if kind in ("sum", "mean"):
                self._values[key] = old + value
            else:
                self._values[key] = min(old, value) if kind == "min" else max(old, value)

    def metrics(self) -> dict[str, Metric]:
        """The combined metrics, each keeping its reduction (to fold into a higher level)."""
        return {
            key: Metric(
                value / self._counts[key] if self._kinds[key] == "mean" else value,
                self._kinds[key],
            )
            for key, value in self._values.items()
        }

    def values(self) -> dict[str, float]:
        """The combined values."""
        return {key: metric.value for key, metric in self.metrics().items()}


@dataclass
class ModelOutputs:
    """What one forward pass gives the loss.

    Attributes:
        logprobs: ``[B, T]`` log p(input_ids[t] | input_ids[:t]) at the sampling
            temperature; 0 at t = 0.
        entropy: ``[B, T]`` entropy of the distribution that predicted token t
            (0 at t = 0); None unless the loss asks for it.
        logits: ``[B, T, V]`` the (temperature-scaled) logits that predicted
            token t; None unless the loss asks for them.
        ref_logits: ``[B, T, V]`` the frozen reference's logits, likewise.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    ref_logits: torch.Tensor | None = None


@dataclass(frozen=True)
class LossInputs:
    """What a loss function needs from the forward pass beyond log-probabilities."""

    entropy: bool = False
    logits: bool = False
    ref_logits: bool = False


class LossFunction(Protocol):
    """A per-micro-batch loss: ``(outputs, micro_batch) -> (loss, metrics)``.

    The loss of each micro-batch must be its share of the mini-batch loss (it
    is normalized by the mini-batch's counts), so the strategy adds the
    gradients up without rescaling; metrics declare how they combine.
    """

    needs: LossInputs

    def __call__(
        self, outputs: ModelOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, Metric]]:
        """The micro-batch's loss share and its metrics."""
        ...


@runtime_checkable
class Strategy(Protocol):
    """Trains the policy; owns the model, the optimizer and the frozen reference."""

    def logprobs(self, batch: RolloutBatch, budget: TokenBudget | None = None) -> torch.Tensor:
        """``[B, T]`` log-probabilities of ``batch`` under the current weights, at
        the sampling temperature, without gradient, 0 off the loss mask (no loss reads
        them there, and the LM head may skip the prompt); forward passes of ``budget``'s
        micro-batches (:mod:`~agentgym.trainers.strategies.batching`), or of the
        strategy's ``micro_batch_size`` rows without one."""
        ...

    def reference_logprobs(
        self, batch: RolloutBatch, budget: TokenBudget | None = None
    ) -> torch.Tensor:
        """``[B, T]`` log-probabilities under the frozen reference model (``budget``: as
        :meth:`logprobs`)."""
        ...

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> dict[str, Metric]:
        """One optimizer step over ``micro_batches`` (gradient accumulation).

        Returns:
            The loss function's metrics combined over micro-batches, plus
            ``grad_norm`` and ``lr``.
        """
        ...

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's tensors by Hugging Face name, one at a time (streamable)."""
        ...

    def save(self, directory: Path) -> None:
        """Write the model (a complete Hugging Face folder under ``model/``) and optimizer."""
        ...

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote."""
        ...

    def set_training(self, training: bool) -> None:
        """Switch the model to training (dropout on, ``True``) or evaluation mode."""
        ...


class ValueLossFunction(Protocol):
    """A critic's per-micro-batch loss: ``(values, micro_batch) -> (loss, metrics)``.

    ``values`` is ``[B, T]``, aligned like log-probabilities (see :class:`Critic`);
    the loss is the micro-batch's share of the mini-batch loss, as for
    :class:`LossFunction`.
    """

    def __call__(
        self, values: torch.Tensor, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, Metric]]:
        """The micro-batch's loss share and its metrics."""
        ...


@runtime_checkable
class Critic(Protocol):
    """Trains the value model of GAE (``adv_estimator: gae``); owns it and its optimizer.

    ``values[b, t]`` is the value of the prefix before ``input_ids[b, t]`` (the
    head's output at ``t - 1``; 0 at ``t = 0``), aligned with log-probabilities.
    """

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]`` values of ``batch`` under the current weights, without gradient."""
        ...

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: ValueLossFunction
    ) -> dict[str, Metric]:
        """One optimizer step over ``micro_batches``; the loss's metrics plus
        ``grad_norm`` and ``lr``."""
        ...

    def save(self, directory: Path) -> None:
        """Write the value model (a Hugging Face folder under ``model/``) and optimizer."""
        ...

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote."""
        ...


class RankStrategy(Protocol):
    """What a rank of a worker group calls on its strategy (policy or critic), besides
    the :class:`Strategy` or :class:`Critic` methods (:mod:`agentgym.trainers.ranks`).

    Attributes:
        collective_io: Whether every rank must take part in :meth:`save` and
            ``export_weights`` (Megatron: TP shards are gathered, PP stages
            broadcast) rather than rank 0 alone (data parallelism: every rank
            holds the same state).
    """

    collective_io: ClassVar[bool]

    def accumulate(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: Any
    ) -> list[dict[str, Metric]]:
        """Zero the gradients, then add up those of this rank's ``micro_batches``.

        Returns:
            Each micro-batch's metrics, in order (the group folds every rank's
            list in the mini-batch's order).
        """
        ...

    def optimizer_step(self) -> dict[str, Metric]:
        """Reduce the gradients over the group, clip, step; ``grad_norm`` and ``lr``."""
        ...

    def save(self, directory: Path) -> None:
        """Write the checkpoint (see :attr:`collective_io`)."""
        ...

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote."""
        ...

    def set_training(self, training: bool) -> None:
        """Training (``True``) or evaluation mode."""
        ...


def accumulated_step(
    strategy: RankStrategy, micro_batches: Sequence[RolloutBatch], loss_fn: Any
) -> dict[str, Metric]:
    """One optimizer step of ``strategy`` over ``micro_batches``: their gradients added
    up (each loss is its share of the whole), then the step; the micro-batches'
    metrics folded in order, plus ``grad_norm`` and ``lr``."""
    return step_metrics(strategy.accumulate(micro_batches, loss_fn), strategy.optimizer_step())


def step_metrics(
    per_micro_batch: Iterable[Mapping[str, Metric]], step: Mapping[str, Metric]
) -> dict[str, Metric]:
    """One optimizer step's metrics: each micro-batch's folded in the mini-batch's order,
    then the step's own (``grad_norm``, ``lr``)."""
    reducer = MetricReducer()
    for metrics in per_micro_batch:
        reducer.add(metrics)
    reducer.add(step)
    return reducer.metrics()


def micro_batches(batch: RolloutBatch, size: int) -> Iterator[RolloutBatch]:
    """Consecutive row slices of ``batch``, each trimmed to its longest sequence."""
    for start in range(0, len(batch), size):
        rows = slice(start, start + size)
        yield batch.rows(rows, width=int(batch.attention_mask[rows].sum(1).max()))


_Model = TypeVar("_Model")


def frozen_reference(reference: _Model | None) -> _Model:
    """A strategy's frozen reference model.

    Raises:
        RuntimeError: If the strategy was built without one, saying how to get one.
    """
    if reference is None:
        raise RuntimeError(
            "this strategy has no reference model: build it with reference_path "
            "(the recipe does when use_kl_loss or add_token_level_kl is set)"
        )
    return reference


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in evaluation mode (dropout off) for the block, then back in the mode
    it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


class PolicyBase(ABC):
    """What every policy strategy (torch, FSDP2, Megatron) shares: the members of
    :class:`Strategy` that read only the policy and its frozen reference. A strategy
    subclasses it once and says how it computes log-probabilities
    (:meth:`_logprobs`), trains, exports and saves.

    Attributes:
        model: The trained policy.
        reference: The frozen reference (None: built without ``reference_path``).
    """

    model: Any
    reference: Any

    @abstractmethod
    def _logprobs(
        self, model: Any, batch: RolloutBatch, budget: TokenBudget | None
    ) -> torch.Tensor:
        """``[B, T]`` log-probabilities of ``batch`` under ``model``, without gradient,
        0 off the loss mask, on ``budget``'s micro-batches (None: the strategy's
        ``micro_batch_size`` rows each)."""

    def set_training(self, training: bool) -> None:
        """Training (dropout on, ``True``) or evaluation mode of the policy."""
        self.model.train(training)

    def logprobs(self, batch: RolloutBatch, budget: TokenBudget | None = None) -> torch.Tensor:
        """``[B, T]`` log-probabilities of this rank's ``batch`` under the current weights
        (in eval mode, then back in the mode it was in; no gradient), 0 off the loss mask,
        on ``budget``'s micro-batches (None: ``micro_batch_size`` rows each). Collective
        where the strategy is (:attr:`RankStrategy.collective_io`)."""
        with evaluating(self.model):
            return self._logprobs(self.model, batch, budget)

    def reference_logprobs(
        self, batch: RolloutBatch, budget: TokenBudget | None = None
    ) -> torch.Tensor:
        """``[B, T]`` log-probabilities under the frozen reference (``budget``: as
        :meth:`logprobs`).

        Raises:
            RuntimeError: If the strategy was built without a reference.
        """
        return self._logprobs(frozen_reference(self.reference), batch, budget)
