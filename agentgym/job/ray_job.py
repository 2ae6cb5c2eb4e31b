"""A decoupled job's shared state on a Ray cluster, for processes that share no
filesystem (Trinity-RFT's ``buffer.storage_type: queue`` and ``synchronizer.sync_method:
memory``).

* :class:`RayExperienceBuffer`: the :class:`~agentgym.job.buffer.ExperienceBuffer`
  inside a named, detached Ray actor whose SQLite file lives on the actor's node.
  Ray restarts the actor when it dies (``max_restarts=-1``) and retries the calls it
  was serving (``max_task_retries=-1``); the restarted actor reopens the same file,
  so every committed group, lease and cursor survives. Every call is safe to
  repeat: a repeated reservation finds its slots held, a repeated write stores no
  group twice (its second attempt is told the slots are gone, and the explorer plays
  on from its cursor), a repeated lease returns the step's groups.
* :class:`MemoryChannel`: the newest published weights in a named, detached actor's
  memory, moved in weight buckets (Trinity's ``memory`` sync keeps them in its
  synchronizer actor). A
  restarted weights actor holds nothing until the trainer's next publication;
  explorers keep the weights they loaded meanwhile. The trainer's "finished" mark
  lives there too.

Both actors are found by the job's name (``project/name``) in the Ray namespace
:data:`NAMESPACE`, so processes started separately on one cluster meet. They are
detached (a job's processes come and go, the state stays): ``ray stop`` or
:func:`remove_job_actors` ends them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.errors import ConfigError
from agentgym.job.buffer import ExperienceBuffer
from agentgym.job.buffer_rows import ExplorerRecord
from agentgym.job.published_weights import Published, WeightsGoneError
from agentgym.rollout.backends.buckets import (
    DEFAULT_BUCKET_BYTES,
    WeightBucket,
    chunk_weights,
    pack_bucket,
)
from agentgym.trajectory import Trajectory

if TYPE_CHECKING:
    import torch

NAMESPACE = "agentgym"
"""The Ray namespace of every job's actors."""


def connect(address: str | None) -> Any:
    """Ray, connected to the cluster a decoupled job's processes share.

    Raises:
        ConfigError: When no cluster is named (``ray_address`` or ``RAY_ADDRESS``): a
            Ray instance of this process alone would share nothing.
    """
    import ray

    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ConfigError(
            "buffer.storage_type=queue and synchronizer.sync_method=memory keep the job's "
            "state in Ray actors that its processes share: start a cluster (ray start "
            "--head) and give its address to every process (ray_address=ADDRESS, or "
            "RAY_ADDRESS)"
        )
    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, include_dashboard=False)
    return ray


def _actor(ray: Any, cls: type, name: str, *args: Any) -> Any:
    """The named actor of ``cls`` (created by the first process that asks)."""
    return (
        ray.remote(cls)
        .options(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            max_task_retries=-1,
            num_cpus=0,
        )
        .remote(*args)
    )


def remove_job_actors(job: str) -> None:
    """End the job's actors (its buffer file stays on disk)."""
    import ray

    for role in ("buffer", "weights"):
        with contextlib.suppress(ValueError):  # no such actor
            ray.kill(ray.get_actor(f"{job}:{role}", namespace=NAMESPACE), no_restart=True)


class BufferActor:
    """An :class:`ExperienceBuffer` served by a Ray actor (its file on the actor's node)."""

    def __init__(self, path: str) -> None:
        self.buffer = ExperienceBuffer(path)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``self.buffer.<method>(*args, **kwargs)``."""
        return getattr(self.buffer, method)(*args, **kwargs)

    def pid(self) -> int:
        """The actor's process (tests kill it)."""
        return os.getpid()


class RayExperienceBuffer:
    """The job's experience buffer on its Ray actor (``buffer.storage_type: queue``),
    with :class:`ExperienceBuffer`'s methods.

    Args:
        job: The job's name (``project/name``): the actor is ``<job>:buffer``.
        path: The SQLite file, on the actor's node.
        address: The Ray cluster (``ray_address``; None: ``RAY_ADDRESS``).
    """

    def __init__(self, job: str, path: Path, *, address: str | None = None) -> None:
        self._ray = connect(address)
        self.path = path
        self.actor = _actor(self._ray, BufferActor, f"{job}:buffer", str(path))

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._ray.get(self.actor.call.remote(method, *args, **kwargs))

    def close(self) -> None:
        """The actor stays (the job's other processes use it)."""

    def join(self, name: str) -> ExplorerRecord:
        """:meth:`ExperienceBuffer.join`."""
        record: ExplorerRecord = self._call("join", name)
        return record

    def explorers(self) -> list[ExplorerRecord]:
        """:meth:`ExperienceBuffer.explorers`."""
        records: list[ExplorerRecord] = self._call("explorers")
        return records

    def explorer(self, name: str) -> ExplorerRecord | None:
        """:meth:`ExperienceBuffer.explorer`."""
        record: ExplorerRecord | None = self._call("explorer", name)
        return record

    def heartbeat(self, name: str) -> None:
        """:meth:`ExperienceBuffer.heartbeat`."""
        self._call("heartbeat", name)

    def request_sync(self, name: str, version: int | None) -> None:
        """:meth:`ExperienceBuffer.request_sync`."""
        self._call("request_sync", name, version)

    def sync_requested(self, published: int) -> bool:
        """:meth:`ExperienceBuffer.sync_requested`."""
        return bool(self._call("sync_requested", published))

    def handed_out(self) -> int:
        """:meth:`ExperienceBuffer.handed_out`."""
        return int(self._call("handed_out"))

    def reserve(self, name: str, groups: int, *, version: int, ratio: float, batch: int) -> int:
        """:meth:`ExperienceBuffer.reserve`."""
        return int(self._call("reserve", name, groups, version=version, ratio=ratio, batch=batch))

    def write(
        self, name: str, groups: Sequence[Sequence[Trajectory]], *, cursor: dict[str, Any]
    ) -> int:
        """:meth:`ExperienceBuffer.write`."""
        return int(self._call("write", name, [list(group) for group in groups], cursor=cursor))

    def revoke(self, name: str) -> int:
        """:meth:`ExperienceBuffer.revoke`."""
        return int(self._call("revoke", name))

    def blocking(self, groups: int) -> list[str]:
        """:meth:`ExperienceBuffer.blocking`."""
        names: list[str] = self._call("blocking", groups)
        return names

    def lease(self, step: int, groups: int) -> list[list[Trajectory]] | None:
        """:meth:`ExperienceBuffer.lease`."""
        leased: list[list[Trajectory]] | None = self._call("lease", step, groups)
        return leased

    def recover(self, step: int) -> None:
        """:meth:`ExperienceBuffer.recover`."""
        self._call("recover", step)

    def commit(self, step: int) -> None:
        """:meth:`ExperienceBuffer.commit`."""
        self._call("commit", step)

    def counts(self) -> dict[str, int]:
        """:meth:`ExperienceBuffer.counts`."""
        counts: dict[str, int] = self._call("counts")
        return counts

    def consumed_by_step(self) -> dict[int, list[tuple[str, int]]]:
        """:meth:`ExperienceBuffer.consumed_by_step`."""
        consumed: dict[int, list[tuple[str, int]]] = self._call("consumed_by_step")
        return consumed


class WeightsActor:
    """The newest published weights of a job, as weight buckets, and its trainer's
    "finished" mark. A publication arrives bucket by bucket (:meth:`put`) and takes
    effect whole (:meth:`store`); explorers read it bucket by bucket."""

    def __init__(self) -> None:
        self.entry: Published | None = None
        self.buckets: list[WeightBucket] = []
        self.pending: dict[str, dict[int, WeightBucket]] = {}
        self.last: int | None = None

    def put(self, key: str, bucket: WeightBucket) -> None:
        """One bucket of the publication ``key`` (a repeated call replaces it)."""
        self.pending.setdefault(key, {})[bucket.index] = bucket

    def store(self, entry: Published, count: int) -> bool:
        """The ``count`` buckets put under ``entry.key`` are the weights of ``entry``;
        False when some are missing (the actor restarted meanwhile)."""
        buckets = self.pending.pop(entry.key, {})
        self.pending.clear()  # an earlier publication's leftovers
        if sorted(buckets) != list(range(count)):
            return False
        self.entry, self.buckets = entry, [buckets[i] for i in range(count)]
        return True

    def point(self, entry: Published) -> bool:
        """``entry`` holds the stored weights; False when none are stored (restarted)."""
        if self.entry is None:
            return False
        self.entry = entry
        return True

    def latest(self) -> Published | None:
        """The newest entry."""
        return self.entry

    def layout(self, key: str) -> tuple[int, list[str]] | None:
        """The bucket count of the stored weights, if they are still those of ``key``,
        and the names that a later name aliases (tied weights sent once)."""
        if self.entry is None or self.entry.key != key:
            return None
        targets = {alias_of for bucket in self.buckets for _, alias_of in bucket.aliases()}
        return len(self.buckets), sorted(targets)

    def bucket(self, key: str, index: int) -> WeightBucket | None:
        """Bucket ``index`` of the stored weights, if they are still those of ``key``."""
        if self.entry is None or self.entry.key != key:
            return None
        return self.buckets[index]

    def finish(self, version: int) -> None:
        """The trainer published its last version."""
        self.last = version

    def finished(self) -> int | None:
        """The trainer's last version (None: still training)."""
        return self.last


class MemoryChannel:
    """``synchronizer.sync_method: memory``: the job's weights in a Ray actor, moved in
    buckets of about ``bucket_bytes`` (packed ``uint8`` arrays, which Ray's object
    store carries without pickling their bytes): no call carries the whole model,
    and an explorer loads each bucket as it arrives.

    Args:
        job: The job's name (``project/name``): the actor is ``<job>:weights``.
        address: The Ray cluster (``ray_address``; None: ``RAY_ADDRESS``).
        bucket_bytes: Bytes per bucket.
    """

    def __init__(
        self, job: str, *, address: str | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> None:
        self._ray = connect(address)
        self.actor = _actor(self._ray, WeightsActor, f"{job}:weights")
        self.bucket_bytes = bucket_bytes

    def latest(self) -> Published | None:
        """The newest published version (None: nothing, or the actor restarted)."""
        entry: Published | None = self._ray.get(self.actor.latest.remote())
        return entry

    def read(self, published: Published) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors of ``published``, bucket by bucket (read-only views: copy them).

        Raises:
            WeightsGoneError: When a newer version replaced them meanwhile.
        """
        gone = WeightsGoneError(f"version {published.version}'s weights were replaced")
        layout = self._ray.get(self.actor.layout.remote(published.key))
        if layout is None:
            raise gone
        count, targets = layout
        kept: dict[str, torch.Tensor] = {}
        for index in range(count):
            bucket = self._ray.get(self.actor.bucket.remote(published.key, index))
            if bucket is None:
                raise gone
            for name, tensor in bucket.tensors():
                if name in targets:
                    kept[name] = tensor
                yield name, tensor
            for name, alias_of in bucket.aliases():
                yield name, kept[alias_of]

    def store(
        self, version: int, tensors: Mapping[str, torch.Tensor], groups_per_step: int
    ) -> None:
        """Publish ``tensors`` as version ``version``, one bucket per call.

        Raises:
            RuntimeError: When the actor lost the buckets twice (restarted while they
                were sent).
        """
        entry = Published(version, f"v{version}", groups_per_step)
        for _ in range(2):
            count = 0
            for count, entries in enumerate(
                chunk_weights(tensors.items(), self.bucket_bytes), start=1
            ):
                bucket = pack_bucket(count - 1, entries)
                self._ray.get(self.actor.put.remote(entry.key, bucket))
            if self._ray.get(self.actor.store.remote(entry, count)):
                return
        raise RuntimeError(f"the weights actor lost version {version}'s buckets twice")

    def point(self, version: int, groups_per_step: int) -> None:
        """Publish ``version`` with the stored weights (none after the actor restarted:
        explorers then keep theirs until the trainer's next publication)."""
        current = self.latest()
        if current is not None:
            self._ray.get(self.actor.point.remote(Published(version, current.key, groups_per_step)))

    def finish(self, version: int) -> None:
        """The trainer published its last version."""
        self._ray.get(self.actor.finish.remote(version))

    def finished(self) -> int | None:
        """The trainer's last version (None: still training)."""
        last: int | None = self._ray.get(self.actor.finished.remote())
        return last


def job_actors(
    job: str, *, address: str | None, buffer_path: Path | None, weights: bool
) -> tuple[RayExperienceBuffer | None, MemoryChannel | None]:
    """This process's ends of the job's Ray actors: the experience buffer an actor serves
    from ``buffer_path`` (``buffer.storage_type: queue``; None: not this job's) and the
    weight channel (``synchronizer.sync_method: memory``; False: not this job's)."""
    buffer = RayExperienceBuffer(job, buffer_path, address=address) if buffer_path else None
    return buffer, MemoryChannel(job, address=address) if weights else None
