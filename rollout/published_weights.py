"""Weight sync by checkpoint (``synchronizer.sync_method: checkpoint``): the trainer
publishes each version of the policy's weights into the job folder, explorers load
the newest.

Layout under ``<job>/weights/``: one folder ``v<version>`` per published version
holding ``model.safetensors``, and ``LATEST.json`` naming the newest version and
the folder that holds its weights (a step that changed no weights moves the
version and keeps the folder). Folders are written under a temporary name and
renamed, and ``LATEST.json`` is replaced atomically, so a reader never sees a
partial version; the newest :data:`KEEP` folders are kept.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.fileio import write_json_atomic

if TYPE_CHECKING:
    import torch

WEIGHTS_DIR = "weights"
LATEST = "LATEST.json"
KEEP = 3
"""Published folders kept (an explorer loading an older one while a newer lands)."""


@dataclass(frozen=True)
class Published:
    """A published version: its number and the folder of its weights."""

    version: int
    folder: Path
    groups_per_step: int
    """The trainer's groups per step (the staleness bound counts in these)."""


def latest(job_dir: Path) -> Published | None:
    """The newest published version (None: nothing published yet)."""
    path = job_dir / WEIGHTS_DIR / LATEST
    if not path.is_file():
        return None
    entry = json.loads(path.read_text())
    folder = job_dir / WEIGHTS_DIR / str(entry["folder"])
    return Published(int(entry["version"]), folder, int(entry["groups_per_step"]))


def read_weights(published: Published) -> Iterator[tuple[str, torch.Tensor]]:
    """The named tensors of a published version, one at a time."""
    from safetensors import safe_open

    with safe_open(str(published.folder / "model.safetensors"), framework="pt") as file:
        for name in file.keys():  # noqa: SIM118 (safe_open has no __iter__)
            yield name, file.get_tensor(name)


class WeightPublisher:
    """The trainer's "engine" in ``mode: train``: each :meth:`update_weights` publishes
    the next version into ``<job>/weights``.

    Args:
        job_dir: The job folder.
        groups_per_step: The trainer's groups per step, published with each version.
        version: The version before the next publication: -1 for a new run (the
            builders publish the model's weights as version 0), ``S - 1`` on a resume
            from step ``S`` (the recipe sends the checkpoint's weights, published as ``S``).
    """

    def __init__(self, job_dir: Path, *, groups_per_step: int, version: int = -1) -> None:
        self.job_dir = job_dir
        self.groups_per_step = groups_per_step
        self.version = version
        self.upcoming: int | None = None
        """The version the next :meth:`update_weights` publishes (None: the next one)."""
        self.last_bytes = 0

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The trainer process generates nothing."""
        raise RuntimeError("mode=train generates nothing: its explorers do")

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Publish ``weights`` as version :attr:`upcoming` (else the next one)."""
        version = self.version + 1 if self.upcoming is None else self.upcoming
        self.upcoming = None
        self.publish(version, weights)

    def publish(self, version: int, weights: Iterable[tuple[str, torch.Tensor]]) -> Path:
        """Write ``weights`` as version ``version`` and make it the newest."""
        from safetensors.torch import save_file

        root = self.job_dir / WEIGHTS_DIR
        folder = root / f"v{version:08d}"
        staging = root / f".v{version:08d}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in weights}
        save_file(tensors, str(staging / "model.safetensors"))
        self.last_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        self._point(version, folder.name)
        return folder

    def skip(self, version: int | None = None) -> None:
        """Weights unchanged since the newest published: ``version`` (default the next)
        points at the same folder."""
        current = latest(self.job_dir)
        if current is None:
            raise RuntimeError(f"nothing published in {self.job_dir / WEIGHTS_DIR} yet")
        self._point(self.version + 1 if version is None else version, current.folder.name)

    def _point(self, version: int, folder: str) -> None:
        root = self.job_dir / WEIGHTS_DIR
        entry = {"version": version, "folder": folder, "groups_per_step": self.groups_per_step}
        write_json_atomic(root / LATEST, entry)
        self.version = version
        folders = sorted(p for p in root.glob("v*") if p.is_dir())
        for old in folders[:-KEEP]:
            if old.name != folder:
                shutil.rmtree(old, ignore_errors=True)

    async def close(self) -> None:
        """Nothing to release."""
