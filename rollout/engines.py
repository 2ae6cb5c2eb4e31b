"""Generation engines as workers: :class:`EngineWorker` runs in the engine's own
process (a Ray actor, or this process on a local cluster); :class:`EngineClient`
is its driver-side :class:`GenerationBackend`.

The worker builds its backend (:func:`make_backend`) where it runs, so the
model and its memory live there. Every error the client sees names the engine
(``actor_infer[1] died during generate: ...``), so a failed episode or a failed
weight sync says which process to look at.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from agentgym.cluster.handles import RpcTimeoutError, WorkerDiedError, WorkerHandle
from agentgym.cluster.placement import WorkerSpec
from agentgym.rollout.backends import make_backend
from agentgym.rollout.backends.base import Generation, GenerationError, SamplingParams
from agentgym.rollout.backends.buckets import DEFAULT_BUCKET_BYTES, WeightBucket
from agentgym.rollout.router import BucketLoader, WeightSyncStats, sync_weights

if TYPE_CHECKING:
    import torch

    from agentgym.envs.text_env import TextEnv
    from agentgym.proxy.hosts import OpenedSession, Recording, SessionSpec

ENGINE_CONCURRENCY = 1024
"""Calls an engine actor serves at once: enough for every episode's request in
flight (the backend batches them)."""


class EngineWorker:
    """One generation engine, built in the process that runs it.

    Args:
        name: The engine's name in messages (``actor_infer[0]``).
        backend: A name for :func:`make_backend` (``hf``, ``vllm``, ``auto``).
        model_path: The model folder.
        backend_kwargs: Passed to :func:`make_backend` (``dtype``, ``device``,
            ``max_model_len``, ``seed``, ``max_batch_size``).
    """

    def __init__(self, name: str, backend: str, model_path: str, **backend_kwargs: Any) -> None:
        self.name = name
        self.model_path = model_path
        self.backend = make_backend(backend, model_path, **backend_kwargs)
        self._proxy: Any = None  # the proxy's sessions here, with the model's template

    async def open_session(self, spec: SessionSpec) -> OpenedSession:
        """A proxy session on this engine's own server (started on first use, in this
        process), generating on this engine (``agent.kind: proxy`` under Ray)."""
        from transformers import AutoTokenizer

        from agentgym.proxy.hosts import ServerSessions
        from agentgym.rollout.chat import ChatTokenizer

        if self._proxy is None:
            chat = ChatTokenizer(AutoTokenizer.from_pretrained(self.model_path))
            self._proxy = (ServerSessions(), chat)
        sessions, chat = self._proxy
        opened: OpenedSession = await sessions.open(spec, self.backend, chat)
        return opened

    async def close_session(self, name: str) -> Recording:
        """Finish proxy session ``name`` and return its recording."""
        recording: Recording = await self._proxy[0].close(name)
        return recording

    def pid(self) -> int:
        """The engine process's id."""
        return os.getpid()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Generate one response (the backend batches concurrent calls)."""
        return await self.backend.generate(prompt_ids, params)

    async def begin_weight_update(self) -> None:
        """Prepare the backend for buckets."""
        await self._loader().begin_weight_update()

    async def load_weight_bucket(self, bucket: WeightBucket) -> float:
        """Load one bucket; returns the seconds spent here (the transfer excluded)."""
        started = time.perf_counter()
        await self._loader().load_weight_bucket(bucket)
        return time.perf_counter() - started

    async def finish_weight_update(self) -> None:
        """Finalize the update (raises if the buckets missed a parameter)."""
        await self._loader().finish_weight_update()

    async def update_weights(self, weights: Sequence[tuple[str, torch.Tensor]]) -> None:
        """The backend's own, unbucketed update (all tensors in one call)."""
        await self.backend.update_weights(weights)

    async def close(self) -> None:
        """Release the engine (and stop its proxy server, if it started one)."""
        if self._proxy is not None:
            await self._proxy[0].stop()
        await self.backend.close()

    def _loader(self) -> BucketLoader:
        if not isinstance(self.backend, BucketLoader):
            raise TypeError(
                f"{self.name}: the {type(self.backend).__name__} cannot load weight buckets; "
                "use the hf or vllm backend"
            )
        return self.backend


class EngineClient:
    """The driver's :class:`GenerationBackend` for one :class:`EngineWorker`.

    Args:
        handle: The worker's handle (from ``Cluster.spawn(spec, EngineWorker, ...)``).
        bucket_bytes: Bytes per bucket when :meth:`update_weights` is called on this
            client alone (a :class:`~agentgym.rollout.router.Router` sends its own).

    Attributes:
        name: The engine's name (the handle's).
        last_sync: Timings of the latest :meth:`update_weights`.
    """

    def __init__(self, handle: WorkerHandle, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        self.handle = handle
        self.name = handle.name
        self.bucket_bytes = bucket_bytes
        self.last_sync: WeightSyncStats | None = None

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await self.handle.call(method, *args)
        except WorkerDiedError as error:
            reason = str(error.__cause__ or error).strip().splitlines() or ["no reason given"]
            raise GenerationError(f"{self.name} died during {method}: {reason[0]}") from error
        except RpcTimeoutError as error:
            raise GenerationError(str(error)) from error
        except GenerationError as error:
            raise GenerationError(f"{self.name}: {error}") from error
        except Exception as error:
            raise GenerationError(
                f"{self.name}.{method} failed: {type(error).__name__}: {error}"
            ) from error

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Generate on the engine (``env`` stays here: model engines do not read it).

        Raises:
            GenerationError: Naming the engine, when it died, timed out or failed.
        """
        result: Generation = await self._call("generate", list(prompt_ids), params)
        return result

    async def open_session(self, spec: SessionSpec) -> OpenedSession:
        """A proxy session on the engine's own server (:class:`EngineWorker.open_session`).

        Raises:
            GenerationError: Naming the engine, when it died, timed out or failed.
        """
        opened: OpenedSession = await self._call("open_session", spec)
        return opened

    async def close_session(self, name: str) -> Recording:
        """Finish the engine's proxy session ``name``; its recording."""
        recording: Recording = await self._call("close_session", name)
        return recording

    async def begin_weight_update(self) -> None:
        """See :class:`~agentgym.rollout.router.BucketLoader`."""
        await self._call("begin_weight_update")

    async def load_weight_bucket(self, bucket: WeightBucket) -> float:
        """Send one bucket (or what ``share`` made of it); returns the engine's load seconds."""
        return float(await self._call("load_weight_bucket", bucket))

    async def finish_weight_update(self) -> None:
        """See :class:`~agentgym.rollout.router.BucketLoader`."""
        await self._call("finish_weight_update")

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send ``weights`` in buckets of ``bucket_bytes``."""
        self.last_sync = await sync_weights([self], weights, bucket_bytes=self.bucket_bytes)

    async def close(self) -> None:
        """Close the engine's backend (the process stays until the cluster's shutdown).

        A dead engine has nothing left to close.
        """
        with contextlib.suppress(WorkerDiedError):
            await self.handle.call("close")


def spawn_engines(
    cluster: Any,
    count: int,
    backend: str,
    model_path: str,
    *,
    nodes: Sequence[int] | None = None,
    visible_devices: Sequence[str | None] | None = None,
    gpu: bool = False,
    role: str = "actor_infer",
    seeds: Sequence[int] | None = None,
    **backend_kwargs: Any,
) -> list[EngineClient]:
    """Start ``count`` engine workers on ``cluster`` and return their clients.

    Args:
        cluster: An :class:`agentgym.cluster.Cluster`.
        count: Engines to start.
        backend: Backend name for each engine.
        model_path: The model folder (readable from every node).
        nodes: Each engine's node rank (default: all on node 0).
        visible_devices: Each engine's device slots on its node (default: unset).
        gpu: Whether engines use GPUs.
        role: The name's prefix (engines are ``{role}[i]``).
        seeds: Each engine's sampling seed (engines with one seed would draw the same
            random numbers, and a group's samples on two engines would coincide).
        backend_kwargs: Passed to :func:`make_backend` in each engine.
    """
    places = list(nodes) if nodes is not None else [0] * count
    devices = list(visible_devices) if visible_devices is not None else [None] * count
    if len(places) != count or len(devices) != count:
        raise ValueError(
            f"{count} engines need {count} nodes and device sets, got {len(places)} and "
            f"{len(devices)}"
        )
    clients = []
    for rank in range(count):
        name = f"{role}[{rank}]"
        seeded = {"seed": seeds[rank]} if seeds is not None else {}
        spec = WorkerSpec(name, places[rank], devices[rank], gpu, ENGINE_CONCURRENCY)
        handle = cluster.spawn(
            spec, EngineWorker, name, backend, model_path, **backend_kwargs, **seeded
        )
        clients.append(EngineClient(handle))
    return clients
