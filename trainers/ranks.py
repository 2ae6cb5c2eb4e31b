"""Rank groups: N ranks of one role (the policy's ``actor_train`` or GAE's ``critic``)
with ``torch.distributed`` across them, and the driver's side of them.

Each :class:`GroupRank` builds its strategy in its own process (a Ray actor, or
this process behind a local handle) after joining the process group (gloo on
CPU, NCCL on GPU). :class:`RankGroup` is the driver's side; :class:`PolicyGroup`
(a :class:`~agentgym.trainers.strategies.Strategy`) and :class:`CriticGroup` (a
:class:`~agentgym.trainers.strategies.Critic`) add only the calls their seam
names, so the recipe does not know how many ranks there are or where they run.

Data parallelism: every rank holds the whole model and optimizer; rows are
split over the ranks for log-probabilities and values, the mini-batch's
micro-batches are dealt out for a train step, each rank adds up its
micro-batches' gradients, and the gradients are summed over the ranks before
clipping and the optimizer step (each micro-batch's loss is already its share of
the mini-batch), so DP=N takes the same step as one process. Every rank is
called every time, with an empty share when there are fewer rows or
micro-batches than ranks: a collective strategy's ranks (Megatron) all take part
in its gathers, and a rank left out would hang the others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym.cluster.handles import WorkerHandle
from agentgym.trainers.strategies.base import Metric, step_metrics
from agentgym.trainers.strategies.batching import TokenBudget
from agentgym.trajectory import RolloutBatch

WEIGHT_BUCKET_BYTES = 256 << 20
"""Bytes of weights fetched from rank 0 per call when exporting."""

GROUP_TIMEOUT = datetime.timedelta(minutes=30)
"""How long a rank waits in a collective: gloo's default, for NCCL too (its own is 10
minutes, which rank 0 writing a large checkpoint while the others wait in a barrier
can pass)."""

ROW_METHODS = frozenset({"logprobs", "reference_logprobs", "values"})
"""The strategy methods a group calls on rows split over its ranks."""


def _build_policy(name: str, path: Path, config: Mapping[str, Any], **settings: Any) -> Any:
    from agentgym.trainers.strategies import build_strategy

    return build_strategy(name, path, config, **settings)


def _build_critic(name: str, path: Path, config: Mapping[str, Any], **settings: Any) -> Any:
    from agentgym.trainers.strategies import build_critic

    return build_critic(name, path, config, **settings)


BUILDERS = {"actor_train": _build_policy, "critic": _build_critic}
"""Role -> what its ranks build: ``(strategy_name, model_path, strategy_config, **settings)``."""


@dataclass(frozen=True)
class StrategySpec:
    """A training role's strategy as each of its ranks builds it (or this process, for
    ``distributed=local``).

    Args:
        role: A key of :data:`BUILDERS`.
        strategy_name: The strategy to build.
        model_path: The model's Hugging Face folder (readable on every node).
        strategy_config: ROLL's ``strategy_config`` for the strategy.
        settings: The role's settings (keyword arguments of the builder: dtype,
            learning rate, ...).
    """

    role: str
    strategy_name: str
    model_path: Path
    strategy_config: Mapping[str, Any]
    settings: Mapping[str, Any]

    def build(self) -> Any:
        """The role's strategy, built in this process."""
        build = BUILDERS[self.role]
        return build(self.strategy_name, self.model_path, self.strategy_config, **self.settings)


def group_backend(strategy_name: str, settings: Mapping[str, Any]) -> str:
    """The process group's backend for ranks that build ``strategy_name`` with
    ``settings``: NCCL where they train on CUDA, else gloo. The Megatron strategy trains
    on the rank's GPU wherever there is one; the others on their ``device`` (a CPU run on
    a machine with GPUs, as Ray's CPU-only ranks see them all, stays on gloo)."""
    if strategy_name == "megatron_train":
        cuda = torch.cuda.is_available()
    else:
        cuda = torch.device(str(settings.get("device", "cpu"))).type == "cuda"
    return "nccl" if cuda else "gloo"


class GroupRank:
    """One rank of a group: joins the process group (:meth:`setup`), then builds the
    role's strategy (:meth:`StrategySpec.build`); answers the group's calls.

    Args:
        rank: This rank.
        world_size: Ranks in the group.
        spec: The strategy every rank builds.
        backend: ``gloo`` or ``nccl`` (None: :func:`group_backend`'s choice).
    """

    def __init__(
        self, rank: int, world_size: int, spec: StrategySpec, *, backend: str | None = None
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.spec = spec
        self.backend = backend
        self.strategy: Any = None
        self._export: Iterator[dict[str, torch.Tensor]] = iter(())

    def free_port(self) -> int:
        """A TCP port free on this rank's machine (rank 0 hosts the process group)."""
        return free_port()

    def setup(self, master_address: str | None, master_port: int | None) -> None:
        """Join the process group at rank 0's address (several ranks), then build
        the strategy; every rank calls this at the same time."""
        if self.world_size > 1:
            if master_address is None or master_port is None:
                raise ValueError("a group of several ranks needs master_address and master_port")
            import torch.distributed as dist

            backend = self.backend or group_backend(self.spec.strategy_name, self.spec.settings)
            dist.init_process_group(
                backend,
                init_method=f"tcp://{master_address}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
                timeout=GROUP_TIMEOUT,
            )
        self.strategy = self.spec.build()

    def pid(self) -> int:
        """This rank's process id."""
        return os.getpid()

    def collective(self) -> bool:
        """See :attr:`~agentgym.trainers.strategies.base.RankStrategy.collective_io`."""
        return bool(getattr(type(self.strategy), "collective_io", False))

    def rows(
        self, method: str, batch: RolloutBatch, budget: TokenBudget | None = None
    ) -> torch.Tensor:
        """``[b, T]``: the strategy's ``method`` (one of :data:`ROW_METHODS`) on this
        rank's share of rows (with ``budget``'s micro-batches when given)."""
        if method not in ROW_METHODS:
            raise ValueError(f"{method!r} is not a row method; valid: {sorted(ROW_METHODS)}")
        extra = {} if budget is None else {"budget": budget}
        return getattr(self.strategy, method)(batch, **extra)

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: Any
    ) -> tuple[list[dict[str, Metric]], dict[str, Metric]]:
        """Accumulate this rank's micro-batches, then the group's optimizer step.

        Returns:
            Each micro-batch's metrics in order, and the step's metrics
            (``grad_norm``, ``lr``), which are the same on every rank.
        """
        per_micro = self.strategy.accumulate(micro_batches, loss_fn)
        return per_micro, self.strategy.optimizer_step()

    def open_export(self, bucket_bytes: int) -> None:
        """Start streaming the weights in buckets of about ``bucket_bytes``
        (:meth:`next_bucket` takes them in order)."""
        keep = self.rank == 0  # the others take part in a collective export, and send nothing
        self._export = _buckets(self.strategy.export_weights(), bucket_bytes, keep=keep)

    def next_bucket(self) -> dict[str, torch.Tensor] | None:
        """The next bucket of the export :meth:`open_export` started (detached CPU
        copies by Hugging Face name; empty on ranks other than 0), or None after the last."""
        return next(self._export, None)

    def save(self, directory: str) -> None:
        """Write the checkpoint: rank 0 alone (every rank holds the same state), or
        every rank for a collective strategy."""
        if self.rank == 0 or self.collective():
            self.strategy.save(Path(directory))

    def load(self, directory: str) -> None:
        """Every rank restores the checkpoint."""
        self.strategy.load(Path(directory))

    def set_training(self, training: bool) -> None:
        """The model to training (``True``) or evaluation mode."""
        self.strategy.set_training(training)

    def close(self) -> None:
        """Leave the process group."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


class RankGroup:
    """The driver's side of N rank handles: rows split, micro-batches dealt, every
    rank called at once.

    Args:
        handles: The ranks (:class:`GroupRank` workers), rank 0 first.
        rpc_timeout: Seconds a call to the ranks may take (None: the handles' default).
    """

    def __init__(self, handles: Sequence[WorkerHandle], *, rpc_timeout: float | None = None):
        if not handles:
            raise ValueError("a rank group needs at least one rank")
        self.handles = list(handles)
        self.rpc_timeout = rpc_timeout
        self._collective: bool | None = None

    @property
    def world_size(self) -> int:
        """Ranks in the group."""
        return len(self.handles)

    def call_each(self, method: str, args: Sequence[Sequence[Any]]) -> list[Any]:
        """Call ``method`` on every rank, rank ``r`` with ``args[r]``, at the same time;
        their results in rank order."""

        async def gather() -> list[Any]:
            calls = (
                handle.call(method, *arguments, timeout=self.rpc_timeout)
                for handle, arguments in zip(self.handles, args, strict=True)
            )
            return list(await asyncio.gather(*calls))

        return _run(gather())

    def call_all(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` with the same ``args`` on every rank at the same time."""
        return self.call_each(method, [args] * self.world_size)

    def call_on_rows(
        self, method: str, batch: RolloutBatch, budget: TokenBudget | None = None
    ) -> torch.Tensor:
        """``[B, T]``: the strategy's ``method`` on the batch's rows split over the
        ranks (:func:`split_rows`; every rank is called, each cutting its share by
        ``budget`` when given), concatenated."""
        parts = split_rows(batch, self.world_size)
        results = self.call_each("rows", [(method, part, budget) for part in parts])
        width = batch.input_ids.shape[1]
        padded = [torch.nn.functional.pad(r, (0, width - r.shape[1])) for r in results]
        return torch.cat(padded)  # [B, T]

    def train_step(self, micro_batches: Sequence[RolloutBatch], loss_fn: Any) -> dict[str, Metric]:
        """Deal the micro-batches out (rank ``r`` takes a contiguous share), step together.

        The metrics are folded in the micro-batches' order, as one process folds them.
        """
        shares = deal(list(micro_batches), self.world_size)
        results = self.call_each("train_step", [(share, loss_fn) for share in shares])
        return step_metrics([m for per_micro, _ in results for m in per_micro], results[0][1])

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Rank 0's weights by Hugging Face name, fetched a bucket at a time (every
        rank streams along when the strategy's export is collective)."""
        if self._collective is None:
            self._collective = bool(self.handles[0].call_sync("collective"))
        handles = self.handles if self._collective else self.handles[:1]
        streaming = RankGroup(handles, rpc_timeout=self.rpc_timeout)
        streaming.call_all("open_export", WEIGHT_BUCKET_BYTES)
        while (bucket := streaming.call_all("next_bucket")[0]) is not None:
            yield from bucket.items()

    def save(self, directory: Path) -> None:
        """Rank 0 writes the checkpoint (every rank, for a collective strategy)."""
        self.call_all("save", str(directory))

    def load(self, directory: Path) -> None:
        """Every rank loads the checkpoint."""
        self.call_all("load", str(directory))

    def set_training(self, training: bool) -> None:
        """Every rank's model to training (``True``) or evaluation mode."""
        self.call_all("set_training", training)

    def close(self) -> None:
        """Every rank leaves the process group."""
        self.call_all("close")


class PolicyGroup(RankGroup):
    """The policy's ranks as a :class:`~agentgym.trainers.strategies.Strategy`."""

    def logprobs(self, batch: RolloutBatch, budget: TokenBudget | None = None) -> torch.Tensor:
        """``[B, T]``: the batch's rows split over the ranks."""
        return self.call_on_rows("logprobs", batch, budget)

    def reference_logprobs(
        self, batch: RolloutBatch, budget: TokenBudget | None = None
    ) -> torch.Tensor:
        """``[B, T]`` under the reference, rows split over the ranks."""
        return self.call_on_rows("reference_logprobs", batch, budget)


class CriticGroup(RankGroup):
    """GAE's critic ranks as a :class:`~agentgym.trainers.strategies.Critic`."""

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]``: the batch's rows split over the ranks."""
        return self.call_on_rows("values", batch)


GROUPS: dict[str, type[RankGroup]] = {"actor_train": PolicyGroup, "critic": CriticGroup}
"""Role -> the driver's side of its ranks."""


def start_rank_group(
    cluster: Any,
    placements: Sequence[Any],
    spec: StrategySpec,
    *,
    rpc_timeout: float | None = None,
) -> Any:
    """Spawn one :class:`GroupRank` per placement, named ``role[rank]``, join them in a
    process group (rank 0 hosts it) and build ``spec`` on each.

    Args:
        cluster: The :class:`~agentgym.cluster.Cluster` to spawn on.
        placements: The role's :class:`~agentgym.cluster.WorkerPlacement`\\ s, rank order.
        spec: What every rank builds; its role ``actor_train`` gives back a
            :class:`PolicyGroup`, ``critic`` a :class:`CriticGroup`.
        rpc_timeout: Seconds a call to the ranks may take.
    """
    world = len(placements)
    handles = [
        cluster.spawn(placement.spec(), GroupRank, placement.rank, world, spec)
        for placement in placements
    ]
    group = GROUPS[spec.role](handles, rpc_timeout=rpc_timeout)
    address = port = None
    if world > 1:
        address = cluster.node_address(placements[0].node)
        port = handles[0].call_sync("free_port", timeout=rpc_timeout)
    group.call_all("setup", address, port)
    return group


def free_port() -> int:
    """A TCP port free on this machine now (for rank 0's process group)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def share_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``parts`` contiguous shares of ``count`` items,
    larger shares first."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (index < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def deal(items: list[Any], parts: int) -> list[list[Any]]:
    """Contiguous shares of ``items`` for ``parts`` ranks, larger shares first
    (some empty when there are fewer items than ranks)."""
    return [items[start:stop] for start, stop in share_bounds(len(items), parts)]


def split_rows(batch: RolloutBatch, parts: int) -> list[RolloutBatch]:
    """``parts`` contiguous row shares of ``batch`` (as :func:`deal`), each cut to its
    longest sequence; a share with no rows is a ``[0, 1]`` batch."""
    shares = []
    for start, stop in share_bounds(len(batch), parts):
        rows = slice(start, stop)
        width = int(batch.attention_mask[rows].sum(1).max()) if stop > start else 1
        shares.append(batch.rows(rows, width=max(width, 1)))
    return shares


def _buckets(
    weights: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int, *, keep: bool = True
) -> Iterator[dict[str, torch.Tensor]]:
    """``weights`` in dicts of about ``bucket_bytes``, as detached CPU copies; with
    ``keep`` false the same buckets empty (a rank that iterates a collective export for
    its collectives: only rank 0's copies travel to the driver)."""
    bucket: dict[str, torch.Tensor] = {}
    size = count = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if count and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size, count = {}, 0, 0
        if keep:
            bucket[name] = tensor.detach().to("cpu", copy=True)
        size, count = size + nbytes, count + 1
    if count:
        yield bucket


def _run(coroutine: Any) -> Any:
    """Run ``coroutine`` to completion from synchronous code (on a private loop when
    this thread already runs one: the recipe calls the strategy from its loop's thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
