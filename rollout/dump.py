"""A training run's batches dumped, and replayed (ROLL's ``rollout_mock``).

``mode: dump`` writes each step's batch, as the trainer receives it, to
``dump_dir/step_000001.pkl`` (and what produced it to ``dump_dir/meta.json``);
``mode: mock`` plays nothing and hands the trainer those batches instead, so that two
runs that differ only in how they train (micro-batches, dynamic batching, strategy,
parallel layout) can be compared step by step on the same data. A dump is replayed
only by a config that would have played the same batches: the keys that decide them
(:func:`~agentgym.builders.rollouts.rollout_fingerprint`) must match, and the ones that
differ are named.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from agentgym.errors import ConfigError
from agentgym.rollout.source import RolloutSource, StepRollout, SyncSource, WeightExport

_T = TypeVar("_T")

META_FILE = "meta.json"
"""The dump's record of the keys that decided its batches."""


def step_file(folder: Path, step: int) -> Path:
    """Where step ``step``'s batch is dumped."""
    return folder / f"step_{step:06d}.pkl"


class DumpingSource:
    """``source``, with each batch it hands the trainer also written to ``folder``.

    Args:
        source: The run's rollout source.
        folder: The dump folder (created; a dump of another config there is refused).
        fingerprint: The keys that decide the batches, stored beside them.

    Raises:
        ConfigError: When ``folder`` holds a dump of a config whose keys differ.
    """

    def __init__(self, source: RolloutSource, folder: Path, fingerprint: dict[str, Any]) -> None:
        self.source = source
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / META_FILE).is_file():
            check_fingerprint(folder, fingerprint, action="dump into")
        (folder / META_FILE).write_text(json.dumps(fingerprint, indent=1, sort_keys=True))

    @property
    def version(self) -> int:
        """The wrapped source's."""
        return self.source.version

    def start(self, step: int) -> None:
        """The wrapped source's."""
        self.source.start(step)

    async def next_batch(self, step: int) -> StepRollout:
        """The wrapped source's batch, written to the dump first (atomically)."""
        batch = await self.source.next_batch(step)
        path = step_file(self.folder, step)
        staged = path.with_suffix(f".{os.getpid()}.tmp")
        staged.write_bytes(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
        staged.replace(path)
        return batch

    async def update_weights(self, weights: WeightExport, *, timeout: float) -> dict[str, float]:
        """The wrapped source's."""
        return await self.source.update_weights(weights, timeout=timeout)

    async def send_weights(self, weights: WeightExport, *, timeout: float) -> float:
        """The wrapped source's."""
        return await self.source.send_weights(weights, timeout=timeout)

    def skip_update(self) -> None:
        """The wrapped source's."""
        self.source.skip_update()

    async def paused(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """The wrapped source's."""
        return await self.source.paused(work)

    async def run_work(self, work: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """The wrapped source's."""
        return await self.source.run_work(work, *args, **kwargs)

    def state_dict(self, step: int) -> dict[str, Any]:
        """The wrapped source's."""
        return self.source.state_dict(step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The wrapped source's."""
        self.source.load_state_dict(state)

    def checkpointed(self, step: int) -> None:
        """The wrapped source's."""
        self.source.checkpointed(step)

    async def close(self) -> None:
        """The wrapped source's."""
        await self.source.close()


class ReplaySource(SyncSource):
    """Plays nothing: each step's batch is the one dumped in ``folder`` (weights still
    go to the engines, which validation plays on).

    Args:
        envs: The run's train episodes (their engines take the weights).
        folder: A dump written by :class:`DumpingSource`.
        fingerprint: This config's keys that decide the batches.

    Raises:
        ConfigError: When there is no dump in ``folder``, or its keys differ (named).
    """

    def __init__(self, envs: Any, folder: Path, fingerprint: dict[str, Any]) -> None:
        super().__init__(envs)
        self.folder = folder
        check_fingerprint(folder, fingerprint, action="replay")

    async def next_batch(self, step: int) -> StepRollout:
        """Step ``step``'s dumped batch.

        Raises:
            ConfigError: When the dump holds no batch for ``step``.
        """
        path = step_file(self.folder, step)
        if not path.is_file():
            held = sorted(int(p.stem.split("_")[1]) for p in self.folder.glob("step_*.pkl"))
            raise ConfigError(
                f"rollout_mock: the dump in {self.folder} has no batch for step {step} (it "
                f"holds steps {held[0] if held else '-'}..{held[-1] if held else '-'}); "
                "lower max_steps or dump more steps"
            )
        batch: StepRollout = pickle.loads(path.read_bytes())
        return StepRollout(batch.trajectories, dict(batch.metrics) | {"rollout/replayed": 1.0})


def check_fingerprint(folder: Path, fingerprint: dict[str, Any], *, action: str) -> None:
    """Refuse to ``action`` the dump in ``folder`` unless its keys equal ``fingerprint``.

    Raises:
        ConfigError: Naming the dump's folder, and each differing key with both values.
    """
    meta = folder / META_FILE
    if not meta.is_file():
        raise ConfigError(
            f"rollout_mock: no dump in {folder} ({META_FILE} is missing); run with "
            "rollout_mock.mode=dump first"
        )
    stored = json.loads(meta.read_text())
    ours = json.loads(json.dumps(fingerprint))  # as JSON reads it back (tuples as lists)
    differ = sorted(k for k in stored.keys() | ours.keys() if stored.get(k) != ours.get(k))
    if differ:
        changes = "; ".join(f"{k}: dump {stored.get(k)!r}, now {ours.get(k)!r}" for k in differ)
        raise ConfigError(
            f"rollout_mock: cannot {action} {folder}: it was dumped by another config, whose "
            f"batches differ ({changes})"
        )
