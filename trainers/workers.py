"""The trainer worker group: N ranks with ``torch.distributed`` across them.

Each :class:`TrainerRank` builds the strategy in its own process (a Ray actor,
or this process behind a local handle) after joining the process group (gloo
on CPU, NCCL on GPU). :class:`TrainerGroup` is the driver's side: it is a
:class:`~agentgym.trainers.strategies.Strategy`, so the recipe does not know
how many ranks there are or where they run. Data parallelism: every rank holds
the whole model and optimizer; the mini-batch's micro-batches are dealt out to
the ranks, each rank adds up its micro-batches' gradients, and the gradients
are summed over the ranks before clipping and the optimizer step (each
micro-batch's loss is already its share of the mini-batch), so DP=N takes the
same step as one process.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentgym.cluster.handles import WorkerHandle
from agentgym.trainers.strategies.base import LossFunction, Metric, MetricReducer
from agentgym.trajectory import RolloutBatch

WEIGHT_BUCKET_BYTES = 256 << 20
"""Bytes of weights fetched from rank 0 per call when exporting."""


def is_collective(strategy: Any) -> bool:
    """Whether every rank must take part in the strategy's ``save`` and
    ``export_weights`` (Megatron: TP shards are gathered, PP stages broadcast)
    rather than rank 0 alone (data parallelism: every rank holds the same state)."""
    return bool(getattr(type(strategy), "collective_io", False))


class GroupRank:
    """One rank of a worker group: joins the process group (:meth:`setup`), then
    builds what :meth:`build` returns (``strategy``); saves, loads and leaves.

    Args:
        rank: This rank.
        world_size: Ranks in the group.
        strategy_name: A key of the strategies :meth:`build` chooses from.
        model_path: The model's Hugging Face folder.
        strategy_config: ROLL's ``strategy_config`` for the strategy.
        settings: The role's settings (keyword arguments of :meth:`build`'s builder).
        backend: ``gloo`` or ``nccl`` (None: NCCL when CUDA is available, else gloo).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        strategy_name: str,
        model_path: str,
        strategy_config: Mapping[str, Any],
        settings: Mapping[str, Any],
        *,
        backend: str | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.strategy_name = strategy_name
        self.model_path = model_path
        self.strategy_config = dict(strategy_config)
        self.settings = dict(settings)
        self.backend = backend
        self.strategy: Any = None

    def build(self) -> Any:
        """This rank's strategy (after the process group is joined)."""
        raise NotImplementedError

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

            backend = self.backend or ("nccl" if torch.cuda.is_available() else "gloo")
            dist.init_process_group(
                backend,
                init_method=f"tcp://{master_address}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
            )
        self.strategy = self.build()

    def pid(self) -> int:
        """This rank's process id."""
        return os.getpid()

    def save(self, directory: str) -> None:
        """Write the checkpoint: rank 0 alone (every rank holds the same state),
        or every rank for a collective strategy (see :func:`is_collective`)."""
        if self.rank == 0 or is_collective(self.strategy):
            self.strategy.save(Path(directory))

    def load(self, directory: str) -> None:
        """Every rank restores the checkpoint."""
        self.strategy.load(Path(directory))

    def train(self, mode: bool = True) -> None:
        """The model to training or evaluation mode."""
        self.strategy.train(mode)

    def close(self) -> None:
        """Leave the process group."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


class TrainerRank(GroupRank):
    """One policy rank: builds the strategy
    (:data:`~agentgym.trainers.strategies.STRATEGIES`; arguments as :class:`GroupRank`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._export: Iterator[dict[str, torch.Tensor]] = iter(())

    def build(self) -> Any:
        """See :func:`~agentgym.trainers.strategies.build_strategy`."""
        from agentgym.trainers.strategies import build_strategy

        return build_strategy(
            self.strategy_name, Path(self.model_path), self.strategy_config, **self.settings
        )

    def logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """See :meth:`Strategy.logprobs`."""
        return self.strategy.logprobs(batch)

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """See :meth:`Strategy.reference_logprobs`."""
        return self.strategy.reference_logprobs(batch)

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> tuple[list[dict[str, Metric]], dict[str, Metric]]:
        """Accumulate this rank's micro-batches, then the group's optimizer step.

        Returns:
            Each micro-batch's metrics in order, and the step's metrics
            (``grad_norm``, ``lr``), which are the same on every rank.
        """
        per_micro = self.strategy.accumulate(micro_batches, loss_fn)
        return per_micro, self.strategy.optimizer_step()

    def collective(self) -> bool:
        """See :func:`is_collective`."""
        return is_collective(self.strategy)

    def open_export(self, bucket_bytes: int) -> None:
        """Start streaming the weights in buckets of about ``bucket_bytes``
        (:meth:`next_bucket` takes them in order)."""
        self._export = _buckets(self.strategy.export_weights(), bucket_bytes)

    def next_bucket(self) -> dict[str, torch.Tensor] | None:
        """The next bucket of the export :meth:`open_export` started (detached CPU
        copies by Hugging Face name), or None after the last."""
        return next(self._export, None)


def start_trainer_group(
    cluster: Any,
    placements: Sequence[Any],
    *,
    strategy_name: str,
    model_path: Path,
    strategy_config: Mapping[str, Any],
    settings: Mapping[str, Any],
    rpc_timeout: float | None = None,
) -> TrainerGroup:
    """Spawn one :class:`TrainerRank` per placement (``actor_train``'s workers), join
    them in a process group and build the strategy on each.

    Args:
        cluster: The :class:`~agentgym.cluster.Cluster` to spawn on.
        placements: The role's :class:`~agentgym.cluster.WorkerPlacement`\\ s, rank order.
        strategy_name: The strategy every rank builds.
        model_path: The policy's folder (readable on every node).
        strategy_config: The strategy's own options.
        settings: The role's settings (dtype, learning rate, ...).
        rpc_timeout: Seconds a call to the ranks may take.
    """
    return spawn_ranks(
        cluster,
        TrainerRank,
        "actor_train",
        placements,
        (strategy_name, str(model_path), dict(strategy_config), dict(settings)),
        rpc_timeout=rpc_timeout,
    )


def spawn_ranks(
    cluster: Any,
    rank_class: type,
    role: str,
    placements: Sequence[Any],
    arguments: tuple[Any, ...],
    *,
    rpc_timeout: float | None = None,
) -> TrainerGroup:
    """Spawn ``rank_class(rank, world, *arguments)`` per placement, named
    ``role[rank]``, and call every rank's ``setup`` at once (rank 0 hosts the
    process group); the ranks behind a :class:`TrainerGroup`."""
    world = len(placements)
    handles = [
        cluster.spawn(
            rank_class,
            placement.rank,
            world,
            *arguments,
            name=f"{role}[{placement.rank}]",
            node=placement.node,
            visible_devices=placement.visible_devices if placement.gpu else None,
            gpu=placement.gpu,
        )
        for placement in placements
    ]
    group = TrainerGroup(handles, rpc_timeout=rpc_timeout)
    address = port = None
    if world > 1:
        address = cluster.node_address(placements[0].node)
        port = handles[0].call_sync("free_port", timeout=rpc_timeout)
    group.call_each("setup", [(address, port)] * world)
    return group


def free_port() -> int:
    """A TCP port free on this machine now (for rank 0's process group)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


class TrainerGroup:
    """The driver's :class:`~agentgym.trainers.strategies.Strategy` over N rank handles.

    Args:
        handles: The ranks, rank 0 first.
        rpc_timeout: Seconds a call to the ranks may take (None: the handles' default).
    """

    def __init__(self, handles: Sequence[WorkerHandle], *, rpc_timeout: float | None = None):
        if not handles:
            raise ValueError("a trainer group needs at least one rank")
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
            return list(
                await asyncio.gather(
                    *(
                        handle.call(method, *arguments, timeout=self.rpc_timeout)
                        for handle, arguments in zip(self.handles, args, strict=True)
                    )
                )
            )

        return _run(gather())

    def call_on_rows(self, method: str, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]``: ``method`` on the batch's rows split over the ranks (every rank
        is called, with an empty share when there are fewer rows than ranks: a
        collective strategy's ranks all take part in its gathers), concatenated."""
        if self.world_size == 1:
            return self.handles[0].call_sync(method, batch, timeout=self.rpc_timeout)
        parts = split_rows(batch, self.world_size)
        results = self.call_each(method, [(part,) for part in parts])
        width = batch.input_ids.shape[1]
        return torch.cat(
            [torch.nn.functional.pad(r, (0, width - r.shape[1])) for r in results]
        )  # [B, T]

    def logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]``: the batch's rows split over the ranks."""
        return self.call_on_rows("logprobs", batch)

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """``[B, T]`` under the reference, rows split over the ranks."""
        return self.call_on_rows("reference_logprobs", batch)

    def train_step(
        self, micro_batches: Sequence[RolloutBatch], loss_fn: LossFunction
    ) -> dict[str, Metric]:
        """Deal the micro-batches out (rank ``r`` takes a contiguous share), step together.

        The metrics are folded in the micro-batches' order, as one process folds them.
        """
        shares = deal(list(micro_batches), self.world_size)
        results = self.call_each("train_step", [(share, loss_fn) for share in shares])
        reducer = MetricReducer()
        for per_micro, _ in results:
            for metrics in per_micro:
                reducer.add(metrics)
        reducer.add(results[0][1])
        return reducer.metrics()

    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Rank 0's weights by Hugging Face name, fetched a bucket at a time (every
        rank streams along when the strategy's export is collective)."""
        if self._collective is None:
            self._collective = bool(self.handles[0].call_sync("collective"))
        ranks = self.world_size if self._collective else 1
        self._on(ranks, "open_export", WEIGHT_BUCKET_BYTES)
        while (bucket := self._on(ranks, "next_bucket")[0]) is not None:
            yield from bucket.items()

    def _on(self, ranks: int, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on the first ``ranks`` ranks at the same time."""
        if ranks == 1:
            return [self.handles[0].call_sync(method, *args, timeout=self.rpc_timeout)]
        return self.call_each(method, [args] * ranks)

    def save(self, directory: Path) -> None:
        """Rank 0 writes the checkpoint (every rank, for a collective strategy)."""
        self.call_each("save", [(str(directory),)] * self.world_size)

    def load(self, directory: Path) -> None:
        """Every rank loads the checkpoint."""
        self.call_each("load", [(str(directory),)] * self.world_size)

    def train(self, mode: bool = True) -> None:
        """Every rank's model to training or evaluation mode."""
        self.call_each("train", [(mode,)] * self.world_size)

    def close(self) -> None:
        """Every rank leaves the process group."""
        self.call_each("close", [()] * self.world_size)


def deal(items: list[Any], parts: int) -> list[list[Any]]:
    """Contiguous shares of ``items`` for ``parts`` ranks, larger shares first
    (some empty when there are fewer items than ranks)."""
    return [items[start:stop] for start, stop in share_bounds(len(items), parts)]


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
    weights: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[dict[str, torch.Tensor]]:
    """``weights`` in dicts of about ``bucket_bytes``, as detached CPU copies."""
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = tensor.detach().to("cpu", copy=True)
        size += nbytes
    if bucket:
        yield bucket


def _run(coroutine: Any) -> Any:
    """Run ``coroutine`` to completion from synchronous code (on a private loop when
    this thread already runs one: the recipe calls the strategy from its loop's thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
