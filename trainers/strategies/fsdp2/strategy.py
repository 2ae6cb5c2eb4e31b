"""The FSDP2 strategy (``strategy_name: fsdp2_train``): a Hugging Face causal LM
sharded over the ranks with torch's ``fully_shard``; parameters, gradients and
optimizer state each live 1/N on a rank (N: the sharding group).

Every rank builds this strategy after joining ``torch.distributed`` (a rank group
does; one process joins a group of its own). Each rank is handed its own share of
rows or micro-batches, as the rank group deals them; every forward pass gathers
parameters across the ranks, so each rank runs as many forward passes as the rank
with the most, the missing ones on a one-token filler whose loss is zero.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from agentgym.trainers.strategies.base import LossFunction, Metric, PolicyBase, step_metrics
from agentgym.trainers.strategies.batching import TokenBudget, cut
from agentgym.trainers.strategies.fsdp2 import shard as sharding
from agentgym.trainers.strategies.fsdp2.options import parse_dtype
from agentgym.trainers.strategies.fsdp2.options import wrap_policy as parse_wrap_policy
from agentgym.trainers.strategies.optim import build_optimizer
from agentgym.trainers.strategies.settings import PolicySettings, load_reference
from agentgym.trainers.strategies.torch_strategy import cut_logprobs, micro_batch_loss, to_device
from agentgym.trajectory import RolloutBatch


class FSDP2Strategy(PolicyBase):
    """Train a transformers causal LM sharded with FSDP2: AdamW over the shards, a
    learning-rate schedule, gradient accumulation and global-norm clipping.

    Args:
        model_path: A local Hugging Face model folder.
        fsdp_size: Ranks of a sharding group (ROLL's key): <= 1 or >= the world size
            shard over all ranks; a divisor in between is hybrid sharding (replicas
            of ``fsdp_size``-way shards).
        param_dtype: The dtype parameters are gathered and computed in (None:
            ``dtype``). ROLL also stores them in it; here ``dtype`` does.
        reduce_dtype: The dtype gradients are reduced in (ROLL's default ``float32``).
        reshard_after_forward: Free gathered parameters after forward (True, ZeRO-3),
            keep them until backward (False, ZeRO-2); None: units True, root False.
        offload_policy: Keep sharded parameters, gradients and optimizer state in CPU
            memory (the optimizer steps there).
        wrap_policy: ROLL's ``wrap_policy`` (:func:`~.options.wrap_policy`).
        reduce_scatter_during_grad_accumulation: Reduce-scatter each micro-batch's
            gradients (sharded accumulation); False keeps whole gradients until the
            last micro-batch (one reduction, more memory).
        async_save_ckpt: Accepted as False only (checked before the model is built).
        **settings: :class:`~.settings.PolicySettings`, as
            :class:`~.torch_strategy.TorchStrategy` takes them, but: ``dtype`` is the
            parameters' storage dtype (``model_args.dtype``), which the optimizer
            updates them in; ``device`` is ``cpu`` (gloo) or ``cuda`` (NCCL; this
            rank's current device); ``gradient_checkpointing`` recomputes each layer's
            activations in backward.
    """

    collective_io: ClassVar[bool] = True
    """``save`` and ``export_weights`` gather shards: every rank calls them."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        fsdp_size: int = 1,
        param_dtype: str | None = None,
        reduce_dtype: str | None = "float32",
        reshard_after_forward: bool | None = None,
        offload_policy: bool = False,
        wrap_policy: Mapping[str, Any] | None = None,
        reduce_scatter_during_grad_accumulation: bool = True,
        async_save_ckpt: bool = False,
        **settings: Any,
    ) -> None:
        self.settings = PolicySettings(**settings)
        self.model_path = Path(model_path)
        self.device = _device(self.settings.device)
        self.reduce_each_micro_batch = reduce_scatter_during_grad_accumulation
        self.dtype = parse_dtype("dtype", self.settings.dtype)
        computed = parse_dtype("param_dtype", param_dtype)
        self._shard_options: dict[str, Any] = {
            "param_dtype": None if computed == self.dtype else computed,
            "reduce_dtype": parse_dtype("reduce_dtype", reduce_dtype),
            "reshard_after_forward": reshard_after_forward,
            "offload": bool(offload_policy),
        }
        self.policy = parse_wrap_policy(wrap_policy)
        sharding.ensure_process_group(self.device)
        self.mesh = sharding.device_mesh(fsdp_size, self.device)
        self.model = self._build(self.model_path, self.settings.gradient_checkpointing)
        self.reference = load_reference(
            self.settings.reference_path, lambda path: self._build(path, False)
        )
        self.optimizer, self.scheduler = build_optimizer(self.model, self.settings.optimizer)

    def _build(self, path: Path, gradient_checkpointing: bool) -> Any:
        """The model at ``path``, sharded. Rank 0 alone reads the checkpoint into host
        memory and broadcasts it tensor by tensor; the other ranks build the model
        with meta parameters and keep only their shards (verl's way). Under CPU
        offload every rank reads it (the broadcast would place shards on the GPU)."""
        from transformers import AutoConfig, AutoModelForCausalLM

        options = self.settings.attention()
        broadcast = dist.get_world_size() > 1 and not self._shard_options["offload"]
        full: dict[str, torch.Tensor] = {}
        if broadcast and dist.get_rank() != 0:
            with sharding.parameters_on_meta():
                config = AutoConfig.from_pretrained(str(path))
                model = AutoModelForCausalLM.from_config(config, dtype=self.dtype, **options)
            model.eval()  # as from_pretrained leaves it
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=self.dtype, **options)
            if broadcast:
                full = model.state_dict()
        if gradient_checkpointing:
            # the reentrant variant runs backward outside FSDP2's hooks
            model.gradient_checkpointing_enable({"use_reentrant": False})
        model = sharding.shard(model, self.mesh, self.policy, **self._shard_options)
        if broadcast:
            if dist.get_rank() != 0:  # real shards to copy into: ties and FSDP's views hold
                sharding.materialize(model, self.device)
            sharding.load_from_rank0(model, full)
            full.clear()
        return model

    # Forward passes, as many on every rank ---------------------------------------------

    def _most_over_ranks(self, count: int) -> int:
        """The largest ``count`` of any rank (every rank runs that many forward passes)."""
        if dist.get_world_size() == 1:
            return count
        most = torch.tensor([count], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most.item())

    def _filler_logits(self, model: Any) -> torch.Tensor:
        """A forward pass on one two-token row: this rank's part in the others' gathers."""
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        return model(input_ids=ids, use_cache=False).logits

    @torch.no_grad()
    def _logprobs(
        self, model: Any, batch: RolloutBatch, budget: TokenBudget | None
    ) -> torch.Tensor:
        parts, order = cut(batch, self.settings.micro_batch_size, budget)
        # one all-reduce on every rank before the passes, whose gathers must line up
        fillers = self._most_over_ranks(len(parts)) - len(parts)
        width = batch.input_ids.shape[1]
        rows = cut_logprobs(model, parts, order, width, self.settings.temperature, self.device)
        for _ in range(fillers):
            self._filler_logits(model)
        sharding.reshard(model)
        return rows  # [B, T]

    # Training ---------------------------------------------------------------------------

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> dict[str, Metric]:
        """One optimizer step over every rank's ``micro_batches`` (this rank's share).

        Returns:
            The metrics of all ranks' micro-batches folded in rank order (as a rank
            group folds them), plus ``grad_norm`` and ``lr``.
        """
        own = self.accumulate(micro_batches, loss_fn)
        shares: list[Any] = [own]
        if dist.get_world_size() > 1:
            shares = [None] * dist.get_world_size()
            dist.all_gather_object(shares, own)
        return step_metrics([m for share in shares for m in share], self.optimizer_step())

    def accumulate(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> list[dict[str, Metric]]:
        """Zero the gradients, then add up those of this rank's ``micro_batches``
        (summed over the ranks by FSDP2's reduction). Collective.

        Returns:
            Each of this rank's micro-batches' metrics, in order.
        """
        needs = loss_fn.needs
        if needs.ref_logits and self.reference is None:
            raise RuntimeError("the loss needs reference logits; build with reference_path")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        count = self._most_over_ranks(len(micro_batches))
        results = []
        for index in range(count):
            if not self.reduce_each_micro_batch:
                self.model.set_requires_gradient_sync(index == count - 1)
            if index >= len(micro_batches):
                if needs.ref_logits:
                    with torch.no_grad():
                        self._filler_logits(self.reference)
                (self._filler_logits(self.model).float().sum() * 0.0).backward()
                continue
            part = to_device(micro_batches[index], self.device)
            loss, metrics = micro_batch_loss(
                self.model, self.reference, part, loss_fn, temperature=self.settings.temperature
            )
            loss.backward()
            results.append(metrics)
        if self.reference is not None and needs.ref_logits:
            sharding.reshard(self.reference)
        return results

    def optimizer_step(self) -> dict[str, Metric]:
        """Clip the global gradient norm (over the shards) and step. Collective.

        Returns:
            ``grad_norm`` (before clipping) and ``lr`` (of this step).
        """
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        for p in parameters:
            if p.grad is None:  # no micro-batch on any rank
                p.grad = torch.zeros_like(p)
        local = [_local(p.grad) for p in parameters if p.grad is not None]
        squares = torch.stack([g.detach().float().pow(2).sum() for g in local]).sum()
        squares = squares.to(self.device)
        dist.all_reduce(squares, group=self.mesh["fsdp"].get_group())  # replicas agree
        norm = squares.sqrt()
        max_grad_norm = self.settings.optimizer.max_grad_norm
        if max_grad_norm is not None:
            # torch.nn.utils.clip_grad_norm_'s rule, on the local shards
            scale = torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0)
            for grad in local:
                grad.mul_(scale.to(grad.device, grad.dtype))
        metrics = {
            "grad_norm": Metric(float(norm), "mean"),
            "lr": Metric(float(self.scheduler.get_last_lr()[0]), "mean"),
        }
        self.optimizer.step()
        self.scheduler.step()
        return metrics

    # Weights ----------------------------------------------------------------------------

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor by Hugging Face name, full, gathered one at a time (a rank
        never holds more than one whole tensor beyond its shards). Collective: every
        rank iterates it at the same time and yields the same tensors."""
        for name, tensor in self.model.state_dict().items():
            yield name, self._full(tensor)

    def _full(self, tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, DTensor):
            return tensor
        if tensor.device.type != self.device.type:  # offloaded: gather on the device
            return tensor.to(self.device).full_tensor()  # type: ignore[attr-defined]
        return tensor.full_tensor()

    def save(self, directory: Path) -> None:
        """Write each rank's shards of the model and optimizer (``fsdp2/``, reshardable
        to any rank count) and a complete Hugging Face folder under ``model/``. Collective."""
        from agentgym.trainers.strategies.fsdp2.checkpoint import save

        save(self, Path(directory))

    def load(self, directory: Path) -> None:
        """Restore what :meth:`save` wrote, on any number of ranks. Collective."""
        from agentgym.trainers.strategies.fsdp2.checkpoint import load

        load(self, Path(directory))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
