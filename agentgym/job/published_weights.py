"""Weight sync between the trainer and the explorers of a decoupled job: the trainer
publishes versions of the policy's weights on a channel, explorers load the newest.

Two channels (``synchronizer.sync_method``):

* ``checkpoint`` (:class:`FolderChannel`): one folder ``v<version>`` per published
  version under ``<job>/weights/``, holding ``model.safetensors``, and
  ``LATEST.json`` naming the newest version and the folder that holds its weights.
  Folders are written under a temporary name and renamed, and ``LATEST.json`` is
  replaced atomically, so a reader never sees a partial version; the newest
  :data:`KEEP` folders are kept. Needs a filesystem every process reaches.
* ``memory`` (:class:`agentgym.job.ray_job.MemoryChannel`): the newest weights in
  a Ray actor's memory (Trinity-RFT's ``memory``): no shared filesystem.
* ``nccl`` (:class:`agentgym.job.collective_weights.CollectiveChannel`): from the
  trainer's device to each explorer's over a process group per transfer.

A version that changed no weights points at the weights of the one before it (the
same :attr:`Published.key`), so explorers do not reload them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agentgym.fileio import write_json_atomic
from agentgym.rollout.backends.buckets import unshared

if TYPE_CHECKING:
    import torch

WEIGHTS_DIR = "weights"
LATEST = "LATEST.json"
FINISHED = "trainer_finished.json"
"""The marker the trainer writes in the job folder when it published its last version."""
KEEP = 3
"""Published folders kept (an explorer loading an older one while a newer lands)."""


class WeightsGoneError(RuntimeError):
    """A channel no longer holds the version asked for (a newer one replaced it), or
    its transfer broke off."""

    partial = False
    """Set by the explorer when part of the version had reached its engines."""


@dataclass(frozen=True)
class Published:
    """A published version: its number, where its weights are, and the trainer's
    groups per step (the staleness bound counts in these)."""

    version: int
    key: str
    """Where the weights are (a folder, a tag): equal keys hold equal weights."""
    groups_per_step: int


class WeightChannel(Protocol):
    """Where a job's trainer publishes weights and its explorers find them."""

    def latest(self) -> Published | None:
        """The newest published version (None: nothing published yet)."""
        ...

    def read(self, published: Published) -> Iterator[tuple[str, torch.Tensor]]:
        """The named tensors of ``published``, one at a time."""
        ...

    def store(
        self, version: int, tensors: Mapping[str, torch.Tensor], groups_per_step: int
    ) -> None:
        """Publish ``tensors`` as version ``version`` (the newest from now on)."""
        ...

    def point(self, version: int, groups_per_step: int) -> None:
        """Publish version ``version`` with the newest weights, unchanged."""
        ...

    def finish(self, version: int) -> None:
        """The trainer published its last version: explorers may end."""
        ...

    def finished(self) -> int | None:
        """The trainer's last version, once it has finished (None: still training)."""
        ...


class FolderChannel:
    """``sync_method: checkpoint``: versions as folders in ``<job_dir>/weights``."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.root = job_dir / WEIGHTS_DIR

    def latest(self) -> Published | None:
        """The newest published version (None: nothing published yet)."""
        path = self.root / LATEST
        if not path.is_file():
            return None
        entry = json.loads(path.read_text())
        folder = str(self.root / str(entry["folder"]))
        return Published(int(entry["version"]), folder, int(entry["groups_per_step"]))

    def read(self, published: Published) -> Iterator[tuple[str, torch.Tensor]]:
        """The named tensors of ``published``, one at a time."""
        from safetensors import safe_open

        with safe_open(str(Path(published.key) / "model.safetensors"), framework="pt") as file:
            for name in file.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield name, file.get_tensor(name)

    def store(
        self, version: int, tensors: Mapping[str, torch.Tensor], groups_per_step: int
    ) -> None:
        """Write ``tensors`` as folder ``v<version>`` and point ``LATEST.json`` at it."""
        from safetensors.torch import save_file

        folder = self.root / f"v{version:08d}"
        staging = self.root / f".v{version:08d}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_file(unshared(tensors.items()), str(staging / "model.safetensors"))
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        self.record(version, folder.name, groups_per_step)

    def point(self, version: int, groups_per_step: int) -> None:
        """``LATEST.json`` names ``version`` and the newest folder."""
        current = self.latest()
        if current is None:
            raise RuntimeError(f"nothing published in {self.root} yet")
        self.record(version, Path(current.key).name, groups_per_step)

    def record(self, version: int, folder: str, groups_per_step: int) -> None:
        """Point ``LATEST.json`` at ``folder`` as ``version`` (atomically); keep the
        newest :data:`KEEP` folders."""
        entry = {"version": version, "folder": folder, "groups_per_step": groups_per_step}
        write_json_atomic(self.root / LATEST, entry)
        folders = sorted(p for p in self.root.glob("v*") if p.is_dir())
        for old in folders[:-KEEP]:
            if old.name != folder:
                shutil.rmtree(old, ignore_errors=True)

    def finish(self, version: int) -> None:
        """Write the marker :data:`FINISHED` in the job folder."""
        write_json_atomic(self.job_dir / FINISHED, {"version": version})

    def finished(self) -> int | None:
        """The version in the marker :data:`FINISHED` (None: no marker yet)."""
        path = self.job_dir / FINISHED
        return int(json.loads(path.read_text())["version"]) if path.is_file() else None


class WeightPublisher:
    """Where ``mode: train``'s trainer sends its weights: each :meth:`update_weights`
    publishes the next version on the job's channel.

    Args:
        channel: Where the job's weights are published.
        groups_per_step: The trainer's groups per step, published with each version.
        version: The version before the next publication: -1 for a new run (the
            builders publish the model's weights as version 0), ``S - 1`` on a resume
            from step ``S`` (the recipe sends the checkpoint's weights, published as ``S``).
    """

    def __init__(self, channel: WeightChannel, *, groups_per_step: int, version: int = -1) -> None:
        self.channel = channel
        self.groups_per_step = groups_per_step
        self.version = version
        self.upcoming: int | None = None
        """The version the next :meth:`update_weights` publishes (None: the next one)."""
        self.last_bytes = 0

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Publish ``weights`` as version :attr:`upcoming` (else the next one)."""
        version = self.version + 1 if self.upcoming is None else self.upcoming
        self.upcoming = None
        self.publish(version, weights)

    def publish(self, version: int, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Publish ``weights`` as version ``version``, the newest (in host memory, or
        where they are for a channel that sends from the device: ``on_device``)."""
        if getattr(self.channel, "on_device", False):
            tensors = {name: tensor.detach() for name, tensor in weights}
        else:
            tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in weights}
        self.channel.store(version, tensors, self.groups_per_step)
        self.last_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        self.version = version

    def skip(self, version: int | None = None) -> None:
        """Weights unchanged since the newest published: ``version`` (default the next)
        holds the same weights."""
        version = self.version + 1 if version is None else version
        self.channel.point(version, self.groups_per_step)
        self.version = version

    def finish(self, version: int) -> None:
        """The trainer's last version is ``version``: the channel says so to explorers."""
        self.channel.finish(version)

    async def close(self) -> None:
        """Release what the channel holds (a serving thread: ``nccl``)."""
        close = getattr(self.channel, "close", None)
        if close is not None:
            close()
