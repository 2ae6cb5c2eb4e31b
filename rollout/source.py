"""The ``RolloutSource`` seam: what the training recipe asks of rollout.

A source hands the recipe each step's batch, applies weight updates (pausing
and resuming its own generation around them), runs other work (validation)
while its training episodes are paused, says where a resume starts, and
closes. The recipe does not know which source it has:

* :class:`SyncSource` plays each step's batch when the step asks for it
  (``async_generation_ratio: 0``);
* :class:`AheadSource` plays batches ahead of training within the staleness
  bound (``async_generation_ratio: k > 0``, :mod:`agentgym.rollout.async_rollout`).

* :class:`~agentgym.job.buffer_source.BufferSource` takes each step's batch from a
  decoupled job's experience buffer (``mode: train``).

The build floor picks the source (:func:`agentgym.builders.rollouts.rollout_source`); a
new source implements the members of :class:`RolloutSource`; see CONTRIBUTING.md.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from agentgym.progress import progress
from agentgym.rollout.async_rollout import (
    AsyncRollout,
    PausableBackend,
    bounded_update,
)
from agentgym.rollout.backends.base import GenerationBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import PlayerFactory, RolloutConfig, collect
from agentgym.rollout.metrics import staleness_metrics
from agentgym.rollout.router import sync_breakdown
from agentgym.trajectory import Trajectory

_T = TypeVar("_T")

WeightExport = Callable[[], Iterable[tuple[str, Any]]]
"""The trainer's weights, exported when called: ``(Hugging Face name, tensor)`` pairs."""


@dataclass
class StepRollout:
    """One step's batch and its metrics, named for the tracker (``train/*``, ``time/*``,
    ``async/*``)."""

    trajectories: list[Trajectory]
    metrics: dict[str, float]


class RolloutSource(Protocol):
    """What the recipe asks of rollout (see the module docstring)."""

    @property
    def version(self) -> int:
        """The weights version the engines hold now (the number of the last step whose
        update they carry, or that skipped one; 0 before any)."""
        ...

    def start(self, step: int) -> None:
        """Begin with the batch of step ``step + 1``; the engines hold version ``step``
        (0 for a new run, the checkpoint's step on resume). Called on the event loop."""
        ...

    async def next_batch(self, step: int) -> StepRollout:
        """The batch step ``step`` trains (sampled by version ``step - 1`` or, ahead of
        training, at most the staleness bound older)."""
        ...

    async def update_weights(self, weights: WeightExport, *, timeout: float) -> dict[str, float]:
        """Send the trainer's new ``weights`` where this source's episodes are generated,
        bounded by ``timeout``, with the training episodes' generation paused around it.

        Returns:
            ``time/weight_sync*`` metrics (and the version the engines now hold).

        Raises:
            WeightSyncTimeoutError: When the transfer takes longer than ``timeout``.
        """
        ...

    async def send_weights(self, weights: WeightExport, *, timeout: float) -> float:
        """Before :meth:`start` on a resume: the checkpoint's ``weights`` to the engines
        (the version the checkpoint's step names); the seconds it took.

        Raises:
            WeightSyncTimeoutError: When the transfer takes longer than ``timeout``.
        """
        ...

    def skip_update(self) -> None:
        """Count a step that changed no weights (the engines hold the next version)."""
        ...

    async def paused(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``work`` (validation) with the training episodes' generation paused."""
        ...

    async def run_work(self, work: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run the trainer's blocking ``work`` (batch preparation, the update) as this
        source needs: in this thread when nothing generates meanwhile (Ctrl-C stops
        it at once), in a worker thread while episodes keep generating."""
        ...

    def state_dict(self, step: int) -> dict[str, Any]:
        """The train envs' resume state at the checkpoint after step ``step``: the seed
        cursor of the first batch not yet trained (batches in flight are regenerated);
        empty when the source keeps its own (the experience buffer)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Before :meth:`start` on a resume: the :meth:`state_dict` a checkpoint stored."""
        ...

    def checkpointed(self, step: int) -> None:
        """The checkpoint of step ``step`` is on disk (what it trained is settled)."""
        ...

    async def close(self) -> None:
        """Cancel the episodes in flight and release what the source holds."""
        ...


@dataclass
class Rollout:
    """What episodes are played with: envs, the policy's engines and chat template, and
    the rollout settings. A mode's parts carry one for training (inside its source) and
    one for validation.

    Attributes:
        manager: The envs (``env_groups`` × ``group_size``).
        backend: The generation backend.
        chat: The policy's chat template.
        config: Rollout limits and sampling.
        players: Who plays each episode: None, the env manager's own loop; an agent
            behind the OpenAI-compatible proxy (``agent.kind: proxy``,
            :class:`agentgym.proxy.players.ProxyPlayers`).
    """

    manager: EnvManager
    backend: GenerationBackend
    chat: ChatTokenizer
    config: RolloutConfig
    players: PlayerFactory | None = None

    def transfer(self, weights: WeightExport) -> Callable[[], Awaitable[None]]:
        """The transfer of ``weights`` (exported when it runs) to :attr:`backend`."""

        async def update() -> None:
            await self.backend.update_weights(weights())

        return update


class SyncSource:
    """Each step's batch is played when the step asks for it, by version ``step - 1``.

    Args:
        envs: What the episodes are played with.
    """

    def __init__(self, envs: Rollout) -> None:
        self.envs = envs
        self.version = 0

    def start(self, step: int) -> None:
        """Nothing runs before a step asks; the engines hold version ``step``."""
        self.version = step

    async def next_batch(self, step: int) -> StepRollout:
        """Play the manager's next batch now (a progress bar on a terminal)."""
        envs = self.envs
        episodes = len(envs.manager.slots) * envs.manager.max_traj_per_env
        with progress(episodes, f"step {step} rollout", enabled=sys.stderr.isatty()) as bar:
            result = await collect(
                envs.manager,
                envs.backend,
                envs.chat,
                envs.config,
                policy_version=step - 1,
                on_trajectory=lambda _: bar.update(1),
                players=envs.players,
            )
        return StepRollout(result.trajectories, _train_metrics(result.metrics))

    async def update_weights(self, weights: WeightExport, *, timeout: float) -> dict[str, float]:
        """Nothing generates between steps: just the transfer, timed."""
        seconds = await self.send_weights(weights, timeout=timeout)
        self.version += 1
        return {"time/weight_sync": seconds} | sync_breakdown(self.envs.backend)

    async def send_weights(self, weights: WeightExport, *, timeout: float) -> float:
        """The transfer to the engines, bounded by ``timeout``."""
        envs = self.envs
        return await bounded_update(envs.transfer(weights), envs.backend, timeout=timeout)

    def skip_update(self) -> None:
        """Same weights, the next version number."""
        self.version += 1

    async def paused(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """Nothing generates between steps."""
        return await work()

    async def run_work(self, work: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """In this thread: nothing generates while the step trains."""
        return work(*args, **kwargs)

    def state_dict(self, step: int) -> dict[str, Any]:
        """The manager's cursor (the next batch is the next step's)."""
        return self.envs.manager.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The manager's cursor."""
        self.envs.manager.load_state_dict(state)

    def checkpointed(self, step: int) -> None:
        """The cursor in the checkpoint is all a resume needs."""

    async def close(self) -> None:
        """Nothing runs between steps."""


class AheadSource:
    """Batches played ahead of training within the staleness bound
    (``async_generation_ratio``; :class:`~agentgym.rollout.async_rollout.AsyncRollout`).

    Args:
        envs: What the episodes are played with (the backend is wrapped in a
            :class:`~agentgym.rollout.async_rollout.PausableBackend`).
        ratio: ``async_generation_ratio`` (k > 0).
        partial: ``partial_rollout``: tokens a piece of a response that a weight sync
            may cut and the new weights continue (0: a sync waits for whole responses).
    """

    def __init__(self, envs: Rollout, *, ratio: float, partial: int = 0) -> None:
        self.envs = envs
        self.ratio = ratio
        self.partial = partial
        self.pipeline: AsyncRollout | None = None
        self._start_version = 0

    @property
    def version(self) -> int:
        """The version the generation client records (see :class:`RolloutSource`)."""
        return self._start_version if self.pipeline is None else self.pipeline.client.version

    def start(self, step: int) -> None:
        """Start every env's episode loop from the batch of step ``step + 1``."""
        self._start_version = step
        envs = self.envs
        self.pipeline = AsyncRollout(
            envs.manager,
            PausableBackend(envs.backend, version=step, chunk=self.partial),
            envs.chat,
            envs.config,
            ratio=self.ratio,
            first_batch=step,
            players=envs.players,
        )
        self.pipeline.start()

    def _running(self) -> AsyncRollout:
        if self.pipeline is None:
            raise RuntimeError("AheadSource.start was not called")
        return self.pipeline

    async def next_batch(self, step: int) -> StepRollout:
        """Wait for batch ``step - 1`` (admission order); its staleness and idle times."""
        pipeline = self._running()
        started, waiting = time.perf_counter(), pipeline.admission_wait
        result = await pipeline.next_batch(step - 1)
        metrics = _train_metrics(result.metrics)
        metrics["time/trainer_idle"] = time.perf_counter() - started
        metrics["time/rollout_idle"] = pipeline.admission_wait - waiting
        metrics |= staleness_metrics(result.trajectories, step - 1, self.ratio)
        return StepRollout(result.trajectories, metrics)

    async def update_weights(self, weights: WeightExport, *, timeout: float) -> dict[str, float]:
        """Pause generation (requests in flight finish), update, bump the version, resume."""
        pipeline = self._running()
        times = await pipeline.sync(self.envs.transfer(weights), timeout=timeout)
        return (
            times
            | sync_breakdown(self.envs.backend)
            | {"async/policy_version": float(pipeline.client.version)}
        )

    def skip_update(self) -> None:
        """Same weights, the next version number: admit the next batch."""
        self._running().advance()

    async def paused(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """Pause the training episodes' generation (requests in flight finish first),
        run ``work``, resume even when it fails."""
        client = self._running().client
        await client.pause()
        try:
            return await work()
        finally:
            client.resume()

    async def run_work(self, work: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """In a worker thread, while the loop keeps the episodes of later steps going;
        the thread uses this thread's torch thread count (a new thread's OpenMP team
        may differ, and with it the order of float reductions: the update would not
        be bit for bit the synchronous one)."""
        import torch

        threads = torch.get_num_threads()

        def run() -> _T:
            torch.set_num_threads(threads)
            return work(*args, **kwargs)

        return await asyncio.to_thread(run)

    async def send_weights(self, weights: WeightExport, *, timeout: float) -> float:
        """Before :meth:`start`: nothing generates yet, the transfer as it is."""
        envs = self.envs
        return await bounded_update(envs.transfer(weights), envs.backend, timeout=timeout)

    def state_dict(self, step: int) -> dict[str, Any]:
        """The cursor of the first batch not yet trained (those in flight are not saved)."""
        return {**self.envs.manager.state_dict(), "cursor": self._running().cursor(step)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The manager's cursor (the batch after the checkpoint's step)."""
        self.envs.manager.load_state_dict(state)

    def checkpointed(self, step: int) -> None:
        """The cursor in the checkpoint is all a resume needs."""

    async def close(self) -> None:
        """Cancel the episodes in flight (a resume regenerates them)."""
        if self.pipeline is not None:
            await self.pipeline.close()


def _train_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {f"train/{key}": value for key, value in metrics.items()}
