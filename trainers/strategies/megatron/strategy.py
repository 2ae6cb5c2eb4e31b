"""The Megatron strategy (``strategy_name: megatron_train``): megatron-core TP/PP/DP.

Every rank builds this strategy after joining ``torch.distributed`` (the
trainer worker group does; one process starts its own group of one). Each rank
is handed its share of the data, as the trainer worker group deals it out; the
strategy gathers the shares of all ranks and gives each data-parallel replica
(all its TP and PP ranks) the same contiguous share, so the result does not
depend on how the ranks were dealt.
"""

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
    step_metrics,
)
from agentgym.trainers.strategies.batching import TokenBudget, cut, fit_width, in_batch_order
from agentgym.trainers.strategies.megatron import parallel
from agentgym.trainers.strategies.megatron.cpu import device_mode
from agentgym.trainers.strategies.megatron.model import (
    HeadFrom,
    Parallelism,
    build_gpt_model,
    init_parallel,
    padded_vocab_size,
    transformer_config,
)
from agentgym.trainers.strategies.megatron.options import check_options
from agentgym.trainers.strategies.megatron.weights import (
    hf_tensors,
    load_hf_weights,
    local_rules,
    shapes_of,
)
from agentgym.trainers.strategies.settings import PolicySettings, load_reference
from agentgym.trainers.strategies.torch_strategy import to_device
from agentgym.trainers.strategies.vocab import VocabSlice, first_scored, next_token_logprobs
from agentgym.trajectory import RolloutBatch


class MegatronStrategy(PolicyBase):
    """Train a Hugging Face decoder as a megatron-core ``GPTModel``.

    Args:
        model_path: A local Hugging Face model folder (Qwen2/2.5, Llama, Qwen3).
        tensor_model_parallel_size, pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size, context_parallel_size,
        expert_model_parallel_size, sequence_parallel, recompute_granularity,
        use_distributed_optimizer, overlap_grad_reduce: ROLL's ``strategy_config``
            keys (see :func:`~agentgym.trainers.strategies.megatron.options.check_options`).
        seed: Seed of megatron-core's RNG tracker.
        **settings: :class:`~agentgym.trainers.strategies.settings.PolicySettings`:
            ``dtype`` is ``float32`` or ``bfloat16``; ``optimizer`` is megatron-core's
            Adam with these settings (its weight decay leaves biases and norms out),
            the schedule and gradient clipping; ``device``, ``gradient_checkpointing``
            and ``attn_implementation`` are accepted and unused: each rank runs on its
            own device (CUDA when available), recomputation is
            ``recompute_granularity``, attention is megatron-core's.
    """

    collective_io: ClassVar[bool] = True
    """``save`` and ``export_weights`` are collective: a rank group calls them on
    every rank (:class:`~agentgym.trainers.strategies.base.RankStrategy`)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        tensor_model_parallel_size: int = 1,
        pipeline_model_parallel_size: int = 1,
        virtual_pipeline_model_parallel_size: int | None = None,
        context_parallel_size: int = 1,
        expert_model_parallel_size: int = 1,
        sequence_parallel: bool = False,
        recompute_granularity: str | None = None,
        use_distributed_optimizer: bool = False,
        overlap_grad_reduce: bool = False,
        seed: int = 0,
        **settings: Any,
    ) -> None:
        from transformers import AutoConfig

        self.settings = PolicySettings(**settings)
        dtype = self.settings.dtype
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"the Megatron strategy trains in float32 or bfloat16, not dtype={dtype!r}: "
                "float16 needs megatron-core's loss scaling, which it does not set up; use "
                "bfloat16 (or strategy_name: torch)"
            )
        self.parallelism = Parallelism(
            tensor_model_parallel_size,
            pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size,
            context_parallel_size,
            expert_model_parallel_size,
        )
        overrides = check_options(
            self.parallelism,
            sequence_parallel=sequence_parallel,
            recompute_granularity=recompute_granularity,
        )
        self.model_path = Path(model_path)
        self.hf_config = AutoConfig.from_pretrained(str(model_path))
        self.schedule = self.settings.optimizer.schedule()
        self.step = 0
        self.tied = bool(self.hf_config.tie_word_embeddings)
        params_dtype = getattr(torch, dtype)
        with device_mode():
            init_parallel(self.parallelism, seed=seed)
            self.groups = parallel.Groups.current()
            self.config = transformer_config(
                self.hf_config, self.parallelism, params_dtype=params_dtype, **overrides
            )
            self.shapes = shapes_of(
                self.hf_config,
                padded_vocab_size(self.hf_config.vocab_size, self.groups.tp_size),
            )
            # The head starts at the first scored token (a forward pass's hidden states
            # are whole sequences without sequence or context parallelism only).
            self._head = HeadFrom()
            self._head_cuts = not self.config.sequence_parallel and context_parallel_size == 1
            self.model = self._build(self.model_path)
            self.reference = load_reference(self.settings.reference_path, self._build)
            self.ddp, self.optimizer = parallel.wrap_for_training(
                self.model,
                self.config,
                self.settings.optimizer,
                use_distributed_optimizer=use_distributed_optimizer,
                overlap_grad_reduce=overlap_grad_reduce,
            )
        self._pending: list[dict[str, Metric]] = []
        self._share: tuple[int, int] = (0, 0)

    def _build(self, path: Path) -> torch.nn.Module:
        from agentgym.trainers.strategies.hf_folder import StoredWeights

        model = build_gpt_model(self.hf_config, self.config)
        self._head.attach(model)
        state = StoredWeights(path)  # this rank's stage and shards are read, not all
        load_hf_weights(
            model,
            state,
            self.shapes,
            tp_rank=self.groups.tp_rank,
            tp_size=self.groups.tp_size,
            tied=self.tied,
        )
        # megatron-core's half-precision optimizer keeps the fp32 main copies of half
        # parameters only: its checkpoint maps every optimizer tensor to one of them.
        # The local spec's torch norms are built in fp32 whatever params_dtype says, so
        # cast them too, as megatron-core's Float16Module does. On a GPU every parameter
        # goes to it (megatron-core's optimizer takes CUDA tensors only there).
        return model.to(device=parallel.rank_device(), dtype=self.config.params_dtype)

    # Forward ------------------------------------------------------------------------

    def _outputs(
        self, logits: torch.Tensor, batch: RolloutBatch, *, with_entropy: bool, first: int
    ) -> ModelOutputs:
        """``[B, T]`` logprobs, 0 off the loss mask as the torch strategy's, from the last
        stage's ``[B, T - first + 1, V_local]`` logits of the positions from ``first - 1``
        on (:meth:`_forward`)."""
        vocab = VocabSlice(
            self.groups.tp_rank * logits.shape[-1],
            self.hf_config.vocab_size,
            reduce_sum=parallel.tp_sum,
            reduce_max=parallel.tp_max,
        )
        logprobs, entropy = next_token_logprobs(
            logits,
            batch.input_ids[:, first:],
            vocab,
            temperature=self.settings.temperature,
            with_entropy=with_entropy,
        )
        # the same zeros off the loss mask however the rows were cut into micro-batches
        logprobs = logprobs * batch.loss_mask[:, first:].to(logprobs.dtype)
        zeros = logprobs.new_zeros(logprobs.shape[0], first)
        return ModelOutputs(
            torch.cat([zeros, logprobs], 1),
            None if entropy is None else torch.cat([zeros, entropy], 1),
        )

    def _forward(self, model: torch.nn.Module, batch: RolloutBatch, first: int) -> torch.Tensor:
        """This stage's output for ``batch``: on the last stage the logits of positions
        ``first - 1`` on (:class:`~.model.HeadFrom`)."""
        self._head.start = first - 1
        try:
            # Right padding: causal attention keeps real tokens from seeing the padding.
            return model(batch.input_ids, batch.position_ids, None)
        finally:
            self._head.start = 0

    def _scored_from(self, batch: RolloutBatch) -> int:
        """Where a pass's logits may start: the batch's first scored token."""
        return first_scored(batch) if self._head_cuts else 1

    @torch.no_grad()
    def _logprobs(
        self, model: torch.nn.Module, batch: RolloutBatch, budget: TokenBudget | None
    ) -> torch.Tensor:
        shares = parallel.gather_world([batch])
        rows = [part for share in shares for part in share]
        full = parallel.concat_rows(rows)
        mine = parallel.data_share(len(full), self.groups)
        parts, order = cut(full.rows(slice(*mine)), self.settings.micro_batch_size, budget)
        width = full.input_ids.shape[1]

        def step(data: Iterator[RolloutBatch], module: torch.nn.Module) -> Any:
            part = on_rank_device(next(data))
            first = self._scored_from(part)
            output = self._forward(module, part, first)

            def finish(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
                logprobs = self._outputs(logits, part, with_entropy=False, first=first).logprobs
                padded = fit_width(logprobs, width)  # already 0 off the loss mask
                return padded.sum(), torch.tensor(1), {"logprobs": padded}

            return output, finish

        with device_mode():
            results = parallel.run_schedule(model, step, parts, forward_only=True)
        local = None  # [b, T]: this replica's rows, on its last stage
        if results:
            local = in_batch_order(torch.cat([r["logprobs"] for r in results]), order)
        merged = parallel.gather_results(local, mine, self.groups)  # [B_all, T]
        start = sum(len(share[0]) for share in shares[: self.groups.world_rank])
        return merged[start : start + len(batch), : batch.input_ids.shape[1]].cpu()

    def logprobs(self, batch: RolloutBatch, budget: TokenBudget | None = None) -> torch.Tensor:
        """``[B, T]`` log-probabilities of this rank's ``batch`` (0 off the loss mask), no
        gradient; each replica's rows on ``budget``'s micro-batches (None:
        ``micro_batch_size`` rows). The policy is in training mode after."""
        self.model.eval()
        try:
            return self._logprobs(self.model, batch, budget)
        finally:
            self.model.train()

    # Training -----------------------------------------------------------------------

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> dict[str, Metric]:
        """One optimizer step over every rank's ``micro_batches`` (this rank's share).

        Returns:
            The metrics of all ranks' micro-batches combined in order, plus
            ``grad_norm`` and ``lr``.
        """
        self.accumulate(micro_batches, loss_fn)
        return step_metrics(self._pending, self.optimizer_step())

    def accumulate(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> list[dict[str, Metric]]:
        """Gradients of the mini-batch (every rank's share) through megatron-core's
        ``forward_backward_func``.

        Returns:
            The metrics of this rank's own micro-batches, in order (the group
            folds the ranks' lists in the mini-batch's order; the masked fillers
            of :func:`~.parallel.even_micro_batches` have none).
        """
        shares = parallel.gather_world(list(micro_batches))
        real = [part for share in shares for part in share]
        everything = parallel.even_micro_batches(real, self.groups)
        start, stop = parallel.data_share(len(everything), self.groups)
        needs = loss_fn.needs
        if needs.logits or needs.ref_logits:
            raise ValueError(
                "the Megatron strategy never gathers the full vocabulary: pick a loss "
                "without full logits (kl_penalty other than 'full')"
            )

        def step(data: Iterator[RolloutBatch], module: torch.nn.Module) -> Any:
            part = on_rank_device(next(data))
            first = self._scored_from(part)
            output = self._forward(module, part, first)

            def finish(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
                outputs = self._outputs(logits, part, with_entropy=needs.entropy, first=first)
                loss, metrics = loss_fn(outputs, part)
                return loss, torch.tensor(1), {"metrics": metrics}

            return output, finish

        self.model.train()
        with device_mode():
            self.ddp.zero_grad_buffer()
            self.optimizer.zero_grad()
            results = parallel.run_schedule(self.ddp, step, everything[start:stop])
        per_micro = parallel.gather_metrics(
            [r["metrics"] for r in results], (start, stop), len(everything), self.groups
        )
        self._pending = per_micro[: len(real)]
        own = sum(len(share) for share in shares[: self.groups.world_rank])
        return per_micro[own : own + len(micro_batches)]

    def optimizer_step(self) -> dict[str, Metric]:
        """Clip and step (megatron-core's optimizer: gradients already reduced over DP).

        Returns:
            ``grad_norm`` (before clipping) and ``lr`` (of this step).
        """
        lr = self.settings.optimizer.learning_rate * self.schedule(self.step)
        with device_mode():
            norm = parallel.optimizer_step(self.optimizer, lr)
        self.step += 1
        return {"grad_norm": Metric(norm, "mean"), "lr": Metric(lr, "mean")}

    # Weights ------------------------------------------------------------------------

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight by Hugging Face name, full (TP shards gathered), stage by stage.

        Collective: every rank of the group iterates it at the same time; each
        yields the same tensors (the owning PP stage broadcasts them).
        """
        with device_mode():
            for stage in range(self.groups.pp_size):
                owned = self._stage_tensors() if stage == self.groups.pp_rank else None
                yield from parallel.broadcast_stage(owned, stage, self.groups)

    def _stage_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        params = dict(self.model.named_parameters())
        for name, rule, layer in local_rules(self.model):
            if self.tied and rule.megatron == "output_layer.weight":
                continue
            full = parallel.tp_gather(params[name].detach(), rule.layout, self.groups)
            yield from hf_tensors(rule, layer, full, self.shapes, self.tied)

    def save(self, directory: Path) -> None:
        """Write a Hugging Face folder under ``model/`` (rank 0) and the optimizer
        (megatron-core's distributed checkpoint, every rank). Collective."""
        from agentgym.trainers.strategies.megatron.checkpoint import save

        save(self, directory)

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote. Collective."""
        from agentgym.trainers.strategies.megatron.checkpoint import load

        load(self, directory)


def on_rank_device(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` on this rank's device: its CUDA device where there is one (batches come
    from the recipe on the CPU; megatron-core's model lives on the rank's GPU), else
    unchanged (CPU mode)."""
    if not torch.cuda.is_available():
        return batch
    return to_device(batch, parallel.rank_device())
