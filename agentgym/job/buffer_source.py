"""The trainer's side of ``mode: train``: a :class:`~agentgym.rollout.source.RolloutSource`
that takes each step's batch from the experience buffer that explorer processes fill
(:mod:`~agentgym.job.buffer`) and publishes each weight update for them
(:mod:`~agentgym.job.published_weights`).

Nothing generates in this process: the update runs in this thread, and validation is
the explorers' (``mode: explore`` validates each version it loads, every
``eval_steps``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from agentgym.job.buffer_rows import ExplorerRecord
from agentgym.job.published_weights import WeightPublisher
from agentgym.job.schedule import SyncSchedule
from agentgym.job.waiting import Waiting
from agentgym.rollout.async_rollout import bounded_update
from agentgym.rollout.metrics import rollout_metrics, staleness_metrics
from agentgym.rollout.source import StepRollout, WeightExport
from agentgym.trajectory import Trajectory

if TYPE_CHECKING:
    from agentgym.job.buffer import JobBuffer

_T = TypeVar("_T")


class BufferReadTimeoutError(TimeoutError):
    """The buffer held too few groups for a step for ``max_read_timeout`` seconds."""


@dataclass(eq=False)
class BufferSource:
    """Each step's batch is the buffer's oldest ``groups_per_step`` complete groups.

    Attributes:
        buffer: The job's experience buffer.
        publisher: Publishes each weight update for the explorers.
        groups_per_step: Groups a step trains (``train_env_manager.env_groups``).
        ratio: The staleness bound in versions (for the ``async/staleness_*`` metrics).
        schedule: When the trainer publishes (every ``sync_interval`` steps, or when an
            explorer asks: :class:`~agentgym.job.schedule.SyncSchedule`).
        last_step: The run's last step (always published: explorers end on it).
        max_read_timeout: Seconds a step may wait for its groups before the run fails.
        explorer_timeout: Seconds an explorer holding slots a step waits for may be
            silent before its slots are given up.
        poll_seconds: How often a waiting step looks again.
        log: Where the waiting lines go.
    """

    buffer: JobBuffer
    publisher: WeightPublisher
    _: KW_ONLY
    groups_per_step: int
    ratio: float
    schedule: SyncSchedule
    last_step: int
    max_read_timeout: float
    explorer_timeout: float = 120.0
    poll_seconds: float = 0.2
    log: Callable[[str], None] = print
    revoked: int = field(default=0, init=False)
    """Reserved slots given up for silent explorers."""
    _step: int = field(default=0, init=False)
    _weights: WeightExport | None = field(default=None, init=False)
    """The trainer's weights: exported again at each publication."""
    _finished: bool = field(default=False, init=False)
    """Whether the run's last step is trained and checkpointed."""
    _unpublished: int | None = field(default=None, init=False)
    """The newest step whose weights changed and are not published yet."""
    _owed: int | None = field(default=None, init=False)
    """A version the schedule published on a skipped step, still to be sent."""
    _timeout: float = field(default=0.0, init=False)

    @property
    def version(self) -> int:
        """The newest version published."""
        return self.publisher.version

    def start(self, step: int) -> None:
        """Settle the groups of steps after the checkpoint of ``step`` (ready again)
        and before it (consumed)."""
        self.buffer.recover(step)

    async def next_batch(self, step: int) -> StepRollout:
        """Lease the step's groups, waiting (and saying so every minute) while the
        buffer holds too few.

        Raises:
            BufferReadTimeoutError: After ``max_read_timeout`` seconds without enough
                groups, naming each explorer and when it was last heard from.
        """
        self._step = step
        if self._owed is not None:
            await self._publish(self._owed)
        waiting = Waiting(
            lambda: (
                f"step {step} waits for {self.groups_per_step} groups in the buffer "
                f"({self.buffer.counts()['ready']} ready); {self._explorers()}"
            ),
            log=self.log,
            on_look=lambda: self._revoke_silent(step),
            timeout=self.max_read_timeout,
            give_up=lambda waited: BufferReadTimeoutError(
                f"step {step} waited {waited:.0f} s (max_read_timeout) for "
                f"{self.groups_per_step} groups in {self.buffer.path}; {self._explorers()}"
            ),
            poll_seconds=self.poll_seconds,
        )
        while (groups := self.buffer.lease(step, self.groups_per_step)) is None:
            if self._unpublished is not None and self.buffer.sync_requested(self.version):
                await self._publish(self._unpublished)  # an explorer asks while we wait
            waiting.tick()
            await waiting.pause()
        waited = waiting.waited
        trajectories = _one_batch(groups)
        metrics = {f"train/{key}": value for key, value in rollout_metrics(trajectories).items()}
        metrics |= {f"buffer/{state}": float(n) for state, n in self.buffer.counts().items()}
        metrics["time/trainer_wait"] = waited
        metrics["buffer/revoked_slots"] = float(self.revoked)
        metrics |= staleness_metrics(trajectories, step - 1, self.ratio)
        return StepRollout(trajectories, metrics)

    def _revoke_silent(self, step: int) -> None:
        """Give up the slots of the explorers the step waits for that have been silent
        longer than ``explorer_timeout`` (dead, or stuck)."""
        waiting_for = set(self.buffer.blocking(self.groups_per_step))
        for record in self.buffer.explorers():
            silent = time.time() - record.last_heard
            if record.name in waiting_for and silent > self.explorer_timeout:
                slots = self.buffer.revoke(record.name)
                self.revoked += slots
                self.log(
                    f"step {step}: explorer {record.name} silent for {silent:.0f} s "
                    f"(buffer.explorer_timeout): its {slots} reserved slots are given up"
                )

    def _explorers(self) -> str:
        explorers = self.buffer.explorers()
        if not explorers:
            return "no explorer has joined yet"
        return "explorers: " + ", ".join(_heard(record) for record in explorers)

    async def update_weights(self, weights: WeightExport, *, timeout: float) -> dict[str, float]:
        """Publish the trainer's ``weights`` when the sync schedule says so; else keep
        them for the next publication."""
        self._weights, self._timeout = weights, timeout
        self._unpublished = self._step
        seconds = await self._publish(self._step) if self._due() else 0.0
        return {
            "time/weight_sync": seconds,
            "async/policy_version": float(self.publisher.version),
            "sync/published": float(self._unpublished is None),
            "sync/bytes": float(self.publisher.last_bytes),
        }

    def skip_update(self) -> None:
        """A step that changed no weights. When the schedule publishes it: the same
        folder under the step's version, or, when an earlier step's update is not
        published yet, those weights (at the next batch, or at close)."""
        if not self._due():
            return
        if self._unpublished is None:
            self.publisher.skip(self._step)
        else:
            self._owed = self._step

    def _due(self) -> bool:
        requested = self.schedule.style == "explorer_driven" and self.buffer.sync_requested(
            self.version
        )
        return self.schedule.trainer_publishes(
            self._step, last_step=self.last_step, requested=requested
        )

    async def _publish(self, step: int) -> float:
        """Send the trainer's current weights (those of ``step``) as version ``step``."""
        assert self._weights is not None
        self.publisher.upcoming = step
        seconds = await self.send_weights(self._weights, timeout=self._timeout)
        self._unpublished = self._owed = None
        return seconds

    async def send_weights(self, weights: WeightExport, *, timeout: float) -> float:
        """Publish ``weights`` (on a resume from step ``S``: as version ``S``), bounded by
        ``timeout``; the seconds it took."""

        async def publish() -> None:
            await self.publisher.update_weights(weights())

        return await bounded_update(publish, self.publisher, timeout=timeout)

    async def paused(self, work: Callable[[], Awaitable[_T]]) -> _T:
        """Nothing generates here."""
        return await work()

    async def run_work(self, work: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """In this thread: nothing generates here."""
        return work(*args, **kwargs)

    def state_dict(self, step: int) -> dict[str, Any]:
        """The buffer's state is its own (leases by step); nothing to add."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The buffer keeps its own state (:meth:`start` settles it)."""

    def checkpointed(self, step: int) -> None:
        """The checkpoint of ``step`` is written: its groups are consumed."""
        self.buffer.commit(step)
        self._finished = step >= self.last_step

    async def close(self) -> None:
        """Publish what a skipped last step owes; once the last step is trained, tell
        the explorers the last version (they end on it); close this process's
        connection to the buffer and the weight channel."""
        try:
            if self._owed is not None:
                await self._publish(self._owed)
            if self._finished:
                self.publisher.finish(self.last_step)
        finally:
            try:
                self.buffer.close()
            finally:
                await self.publisher.close()


def _heard(record: ExplorerRecord) -> str:
    return (
        f"{record.name} (wrote {record.written} groups, last heard "
        f"{time.time() - record.last_heard:.0f} s ago)"
    )


def _one_batch(groups: Sequence[list[Trajectory]]) -> list[Trajectory]:
    """The groups' trajectories as one batch, each group under its own id (explorers
    number their groups independently, so two may use one id)."""
    trajectories = []
    for index, members in enumerate(groups):
        for trajectory in members:
            trajectory.group_id = index
            trajectories.append(trajectory)
    return trajectories
