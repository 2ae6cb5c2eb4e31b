"""A router over N generation engines: least-outstanding balancing, bucketed weight sync.

:class:`Router` is itself a :class:`GenerationBackend`, so the recipe drives
one engine or many the same way. Each request goes to the engine with the
fewest requests in flight (ties: the lowest index). A weight sync streams the
trainer's tensors into buckets of about ``bucket_bytes``
(:mod:`agentgym.rollout.backends.buckets`), packs the next bucket while the
engines load the current one, and sends every bucket to every engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentgym.rollout.backends.base import Generation, GenerationBackend, SamplingParams
from agentgym.rollout.backends.buckets import (
    DEFAULT_BUCKET_BYTES,
    WeightBucket,
    chunk_weights,
    pack_bucket,
)

if TYPE_CHECKING:
    import torch

    from agentgym.envs.text_env import TextEnv


@runtime_checkable
class BucketLoader(Protocol):
    """An engine that loads weights bucket by bucket (HF, vLLM, an engine actor)."""

    async def begin_weight_update(self) -> None:
        """Prepare for buckets (generation must wait until the finish)."""
        ...

    async def load_weight_bucket(self, bucket: WeightBucket) -> float:
        """Load one bucket; returns the engine's own seconds for it."""
        ...

    async def finish_weight_update(self) -> None:
        """Finalize (rebuild untouched layers, reset caches); raise if weights are missing."""
        ...


@dataclass(frozen=True)
class WeightSyncStats:
    """Where one weight sync spent its time.

    Attributes:
        seconds: The whole sync, begin to finish.
        pack_seconds: Reading the trainer's tensors and packing buckets (overlaps
            the sending of the previous bucket).
        transfer_seconds: Per bucket, ``share`` (an object-store put) and the slowest
            engine's call time minus its own load time (serialization, the RPC), summed.
        load_seconds: Per bucket, the slowest engine's load time, summed.
        buckets: Buckets sent (to each engine).
        num_bytes: Bytes packed (each sent to every engine).
        engines: Engines synced.
    """

    seconds: float
    pack_seconds: float
    transfer_seconds: float
    load_seconds: float
    buckets: int
    num_bytes: int
    engines: int

    def metrics(self) -> dict[str, float]:
        """Tracker entries (the recipe logs the total as ``time/weight_sync`` itself)."""
        return {
            "time/weight_sync_pack": self.pack_seconds,
            "time/weight_sync_transfer": self.transfer_seconds,
            "time/weight_sync_load": self.load_seconds,
            "weight_sync/buckets": float(self.buckets),
            "weight_sync/megabytes": self.num_bytes / 2**20,
        }


async def sync_weights(
    loaders: Sequence[BucketLoader],
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    share: Callable[[WeightBucket], Any] | None = None,
) -> WeightSyncStats:
    """Send ``weights`` to every loader in buckets; every loader gets every bucket once.

    Args:
        loaders: The engines.
        weights: ``(name, tensor)`` pairs in Hugging Face naming, streamed once.
        bucket_bytes: Bytes per bucket (a larger tensor gets a bucket of its own).
        share: Turns a bucket into what is sent to every engine (on Ray: put it in
            the object store once, so that N engines do not copy it N times).

    Raises:
        Whatever a loader raised; the others are still finished, so that no engine
        is left half-loaded.
    """
    started = time.perf_counter()
    await asyncio.gather(*(loader.begin_weight_update() for loader in loaders))
    pack = transfer = load = 0.0
    count = size = 0
    pending: asyncio.Task[tuple[float, float]] | None = None
    chunks = enumerate(chunk_weights(weights, bucket_bytes))
    try:
        # Pulling the export (a trainer rank's bucket on Ray: a blocking fetch), packing
        # and sharing run in a thread, so the loop keeps serving env traffic and the
        # bucket in flight is sent while the next one is packed.
        while (item := await asyncio.to_thread(next, chunks, None)) is not None:
            index, chunk = item
            packing = time.perf_counter()
            bucket = await asyncio.to_thread(pack_bucket, index, chunk)
            pack += time.perf_counter() - packing
            count, size = count + 1, size + bucket.num_bytes
            if pending is not None:
                sent, loaded = await pending
                transfer, load = transfer + sent, load + loaded
            sharing = time.perf_counter()
            payload = await asyncio.to_thread(share, bucket) if share is not None else bucket
            transfer += time.perf_counter() - sharing
            pending = asyncio.create_task(_send(loaders, payload))
            del bucket, chunk, item  # only the bucket in flight and the next stay in memory
        if pending is not None:
            sent, loaded = await pending
            transfer, load = transfer + sent, load + loaded
    except BaseException:
        if pending is not None and not pending.done():
            pending.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(
                *(loader.finish_weight_update() for loader in loaders), return_exceptions=True
            )
        raise
    await asyncio.gather(*(loader.finish_weight_update() for loader in loaders))
    return WeightSyncStats(
        seconds=time.perf_counter() - started,
        pack_seconds=pack,
        transfer_seconds=transfer,
        load_seconds=load,
        buckets=count,
        num_bytes=size,
        engines=len(loaders),
    )


async def _send(loaders: Sequence[BucketLoader], payload: Any) -> tuple[float, float]:
    """One bucket to every loader; (transfer, load) seconds of the slowest."""

    async def timed(loader: BucketLoader) -> tuple[float, float]:
        started = time.perf_counter()
        loaded = await loader.load_weight_bucket(payload)
        return time.perf_counter() - started, loaded

    results = await asyncio.gather(*(timed(loader) for loader in loaders))
    wall, loaded = max(results)
    return wall - loaded, loaded


class Router:
    """Spreads requests over engines (least outstanding first) and syncs them all.

    Args:
        backends: The engines (engine actors' clients, or in-process backends).
        bucket_bytes: Bytes per weight bucket.
        share: How a bucket is shared among the engines (see :func:`sync_weights`).
        max_running_requests: Requests in flight to each engine at most (ROLL's
            key); a request waits while every engine is full. None: no cap.

    Attributes:
        outstanding: Requests in flight, per engine.
        served: Requests sent so far, per engine.
        last_sync: Timings of the latest weight sync (None before the first, and
            when an engine cannot load buckets).
    """

    def __init__(
        self,
        backends: Sequence[GenerationBackend],
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        share: Callable[[WeightBucket], Any] | None = None,
        max_running_requests: int | None = None,
    ) -> None:
        if not backends:
            raise ValueError("a Router needs at least one backend")
        if max_running_requests is not None and max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
        self.backends = list(backends)
        self.bucket_bytes = bucket_bytes
        self.share = share
        self.outstanding = [0] * len(self.backends)
        self.served = [0] * len(self.backends)
        self.last_sync: WeightSyncStats | None = None
        self._syncing: asyncio.Future[None] | None = None
        self.max_running_requests = max_running_requests
        self._freed: asyncio.Future[None] | None = None

    def pick(self) -> int:
        """The engine with the fewest requests in flight (the lowest index on ties)."""
        return min(range(len(self.backends)), key=self.outstanding.__getitem__)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Generate on the least busy engine (after a weight sync in progress; while
        every engine has ``max_running_requests`` in flight, when one frees a place)."""
        while self._syncing is not None:
            await asyncio.shield(self._syncing)
        index = self.pick()
        cap = self.max_running_requests
        while cap is not None and self.outstanding[index] >= cap:  # every engine is full
            if self._freed is None:
                self._freed = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._freed)
            index = self.pick()
        self.outstanding[index] += 1
        self.served[index] += 1
        try:
            return await self.backends[index].generate(prompt_ids, params, env=env)
        finally:
            self.outstanding[index] -= 1
            if self._freed is not None:
                self._freed.set_result(None)
                self._freed = None

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send ``weights`` to every engine, in buckets when all of them can load buckets
        (else the whole list to each); requests wait until the sync is done."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._syncing = done
        try:
            loaders = [b for b in self.backends if isinstance(b, BucketLoader)]
            if len(loaders) == len(self.backends):
                self.last_sync = await sync_weights(
                    loaders, weights, bucket_bytes=self.bucket_bytes, share=self.share
                )
            else:
                pairs = list(weights)
                await asyncio.gather(*(b.update_weights(pairs) for b in self.backends))
                self.last_sync = None
        finally:
            self._syncing = None
            done.set_result(None)

    async def close(self) -> None:
        """Close every engine (all of them, even when one fails; then raise the first error)."""
        results = await asyncio.gather(
            *(backend.close() for backend in self.backends), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result


def sync_breakdown(backend: GenerationBackend) -> dict[str, float]:
    """Where the latest weight sync of ``backend`` spent its time (pack, transfer,
    load; a :class:`Router` over bucket loaders), else nothing."""
    stats = getattr(backend, "last_sync", None)
    return stats.metrics() if isinstance(stats, WeightSyncStats) else {}
