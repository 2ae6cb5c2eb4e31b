"""``mode: explore``: the explorer's half of a decoupled job (Trinity-RFT's explorer).

It builds the envs and the engines only, and loops: load the newest weights the
trainer published (:mod:`~agentgym.job.published_weights`), validate them every
``eval_steps`` versions, reserve a batch within the staleness bound, play it, and
write its complete groups to the experience buffer with the seed cursor after them
(:mod:`~agentgym.job.buffer`). A restarted explorer takes up its
cursor from the buffer, so it replays the seeds of a batch it had not finished and
writes no group twice. It ends when the trainer has published its last version.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agentgym.job.buffer import ReservationRevokedError
from agentgym.job.published_weights import Published, WeightChannel, WeightsGoneError
from agentgym.job.schedule import SyncSchedule
from agentgym.job.waiting import Waiting
from agentgym.rollout.evaluation import evaluate
from agentgym.rollout.loop import collect
from agentgym.rollout.source import Rollout
from agentgym.trainers.tracking import Tracker
from agentgym.trajectory import Trajectory

if TYPE_CHECKING:
    from agentgym.job.buffer import JobBuffer

_T = TypeVar("_T")


class WeightsTimeoutError(TimeoutError):
    """No weights (or no newer weights the explorer waits for) were published within
    ``synchronizer.sync_timeout``: the trainer is gone or stuck."""


@dataclass
class ExplorerParts:
    """What an explorer runs on, built by :func:`agentgym.builders.explore.build_explorer`."""

    name: str
    job_dir: Path
    buffer: JobBuffer
    weights: WeightChannel
    """Where the trainer publishes weights (``synchronizer.sync_method``)."""
    train: Rollout
    """The episodes this explorer writes to the buffer."""
    val: Rollout | None
    """The validation episodes (None: ``eval_steps`` is 0)."""
    tracker: Tracker
    ratio: float
    """The staleness bound in versions."""
    schedule: SyncSchedule
    """When to load new weights (``synchronizer.sync_interval``, ``sync_offset``,
    ``sync_style``)."""
    eval_steps: int
    sync_timeout: float
    close: Callable[[], None]
    """Releases the envs, the tracker and the cluster (the engines close on the
    explorer's event loop)."""
    eval_on_startup: bool = True
    """Validate the first weights loaded (``validation.on_startup``)."""


def explore(parts: ExplorerParts, *, log: Callable[[str], None] = print) -> int:
    """Run the explorer until the trainer has finished; the batches it played.

    Raises:
        WeightsTimeoutError: When nothing is published within ``sync_timeout``.
    """
    session = ExplorerSession(parts, asyncio.new_event_loop(), log)
    record = parts.buffer.join(parts.name)
    if record.cursor is not None:
        parts.train.manager.load_state_dict(record.cursor)
        log(f"explorer {parts.name}: resumed at group {record.next_seq}")
    played = synced_after = record.next_seq // parts.train.manager.batch_groups
    validated: set[int] = set()
    batches = 0
    try:
        loaded = session.first_weights()
        admission = session.admission(loaded)
        # without on_startup the first weights are the mark the schedule counts from
        mark = set() if parts.eval_on_startup else {loaded.version}
        idle_from = time.perf_counter()  # waits for admission and weights count from here
        while (last := parts.weights.finished()) is None:
            if _due(parts.eval_steps, loaded.version, validated | mark):
                validated.add(loaded.version)
                session.evaluate(loaded.version)
                idle_from = time.perf_counter()  # validating is not waiting
            granted = parts.buffer.reserve(
                parts.name,
                parts.train.manager.batch_groups,
                version=loaded.version,
                ratio=parts.ratio,
                batch=loaded.groups_per_step,
            )
            if not granted:  # the staleness bound: only a newer version lets this explorer on
                newer = session.blocked(loaded, admission)
                if newer is not loaded:
                    loaded, synced_after = newer, played
                    admission = session.admission(loaded)
                continue
            admission = session.admission(loaded)  # the wait's timeout counts from here
            metrics = session.play_batch(loaded, granted)
            if metrics is None:  # the trainer gave this explorer's slots up meanwhile
                continue
            batches += 1
            played += 1
            metrics["time/explorer_wait"] = metrics.pop("time/started") - idle_from
            parts.tracker.log(metrics, batches)
            idle_from = time.perf_counter()
            if parts.schedule.explorer_syncs(played, synced_after):
                newer = session.sync(loaded)
                if newer is not loaded:
                    loaded, synced_after = newer, played
        # the last version is published before the trainer's finish mark
        loaded = session.load_newer(loaded)
        if loaded.version not in validated and parts.eval_steps:
            session.evaluate(loaded.version)
        log(f"explorer {parts.name}: the trainer finished at version {last}")
        return batches
    finally:
        session.close()


GONE_RETRY_SECONDS = 0.5
"""The pause before loading the newest weights again after a version went away."""
HEARTBEAT_SECONDS = 5.0
"""How often a playing explorer tells the buffer it is alive."""


@dataclass
class ExplorerSession:
    """An explorer at work: its parts, the event loop its engines serve on, and where
    its lines go. Each step of :func:`explore` is a method.

    Attributes:
        parts: What the explorer runs on.
        loop: The event loop the engines serve on (closed by :meth:`close`).
        log: Where its lines go.
    """

    parts: ExplorerParts
    loop: asyncio.AbstractEventLoop
    log: Callable[[str], None] = print

    def first_weights(self) -> Published:
        """The first published version, loaded (waiting up to ``sync_timeout`` for one)."""
        while True:
            try:
                return self.load(self._wait_for_weights())
            except WeightsGoneError:  # replaced while we read it: take the newer
                time.sleep(GONE_RETRY_SECONDS)

    def load(self, published: Published) -> Published:
        """Load ``published`` into the engines; it.

        Raises:
            WeightsGoneError: When a newer version replaced it on a memory channel first.
        """
        started = time.perf_counter()
        arrived = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal arrived
            for entry in self.parts.weights.read(published):
                arrived += 1
                yield entry

        try:
            self.loop.run_until_complete(self.parts.train.backend.update_weights(counted()))
        except WeightsGoneError as gone:
            gone.partial = arrived > 0  # the engines hold part of it: load a whole version
            raise
        self.log(
            f"explorer {self.parts.name}: loaded version {published.version} in "
            f"{time.perf_counter() - started:.2f} s"
        )
        return published

    def load_newer(self, loaded: Published) -> Published:
        """The newest published version, loaded if it differs from ``loaded`` (else
        ``loaded`` itself, not reloaded). An older one than ``loaded`` is loaded too: the
        trainer restarted from an earlier checkpoint (or afresh), and ``loaded`` belongs to
        a line of training that no longer exists."""
        current = self.parts.weights.latest()
        if current is None or current.version == loaded.version:
            return loaded
        if current.version < loaded.version:
            self.log(
                f"explorer {self.parts.name}: the trainer restarted at version "
                f"{current.version} (this explorer held {loaded.version}); loading it"
            )
        if current.key == loaded.key:  # a step that changed no weights
            return current
        try:
            return self.load(current)
        except WeightsGoneError as gone:  # replaced while we read it: the next look finds it
            if gone.partial:  # unless the engines hold part of it: no sample from a mix
                return self.first_weights()
            return loaded

    def admission(self, loaded: Published) -> Waiting:
        """The wait for room under the staleness bound at ``loaded``: only the trainer's
        next version makes room, so a trainer that publishes none within
        ``synchronizer.sync_timeout`` (gone, or restarted and stuck) ends the wait."""
        parts = self.parts
        return self.waiting(
            lambda: (
                f"waits for the trainer to pass version {loaded.version} "
                f"(the staleness bound, {parts.ratio:g} versions)"
            ),
            timeout=parts.sync_timeout,
            give_up=lambda waited: self.trainer_gone(loaded, waited),
        )

    def trainer_gone(self, loaded: Published, waited: float) -> WeightsTimeoutError:
        """The error of a wait for a version after ``loaded`` that lasted ``waited`` s."""
        parts = self.parts
        return WeightsTimeoutError(
            f"explorer {parts.name}: the trainer published no version after "
            f"{loaded.version} in {parts.job_dir} for {waited:.0f} s "
            f"(synchronizer.sync_timeout={parts.sync_timeout:g}); is the trainer "
            "(mode=train) running? Restart it with the command that started it "
            "(resume_from_checkpoint=auto continues from its latest checkpoint), then "
            "this explorer with its own"
        )

    def blocked(self, loaded: Published, admission: Waiting) -> Published:
        """The staleness bound holds this explorer at ``loaded``: the newest version when
        the trainer published one (loaded), else ``loaded`` after one tick of the wait."""
        parts = self.parts
        if parts.schedule.style == "explorer_driven":
            parts.buffer.request_sync(parts.name, loaded.version)
        newer = self.load_newer(loaded)
        if newer is not loaded:
            parts.buffer.request_sync(parts.name, None)
            return newer
        admission.tick()
        time.sleep(admission.poll_seconds)
        return loaded

    def sync(self, loaded: Published) -> Published:
        """A scheduled sync: the newest version if newer than ``loaded``. ``fixed`` waits
        for one while the trainer has the groups to make it; ``explorer_driven`` asks
        for one, and goes on without it when none is there yet."""
        parts, schedule = self.parts, self.parts.schedule
        if schedule.style == "explorer_driven":
            parts.buffer.request_sync(parts.name, loaded.version)
        elif schedule.explorer_waits:
            needed = schedule.next_publication(loaded.version) * loaded.groups_per_step

            def settled() -> bool | None:  # a newer version, or none coming: stop waiting
                current = parts.weights.latest()
                coming = (  # (an older version: the trainer restarted from it; load it)
                    current is not None
                    and current.version == loaded.version
                    and parts.buffer.handed_out() >= needed
                    and parts.weights.finished() is None
                )
                return None if coming else True

            self.waiting(
                lambda: (
                    f"waits for the version after {loaded.version} (synchronizer.sync_style=fixed)"
                ),
                timeout=parts.sync_timeout,
                give_up=lambda waited: self.trainer_gone(loaded, waited),
            ).until(settled)
        newer = self.load_newer(loaded)
        if newer is not loaded and schedule.style == "explorer_driven":
            parts.buffer.request_sync(parts.name, None)
        return newer

    def play_batch(self, loaded: Published, granted: int) -> dict[str, float] | None:
        """Play a batch with ``loaded`` and write the ``granted`` groups the bound has
        room for to the buffer; the batch's metrics (``time/started``: when it began), or
        None when the trainer revoked the reservation meanwhile (nothing is written)."""
        parts, train = self.parts, self.parts.train
        started = time.perf_counter()
        play = collect(
            train.manager,
            train.backend,
            train.chat,
            train.config,
            policy_version=loaded.version,
            players=train.players,
        )
        result = self.loop.run_until_complete(_heartbeats(parts, play))
        played_groups = _groups(result.trajectories)
        if granted < len(played_groups):  # the bound had room for fewer (reserve)
            self.log(
                f"explorer {parts.name}: the staleness bound had room for {granted} of "
                f"{len(played_groups)} groups; the others are discarded"
            )
        try:
            written = parts.buffer.write(
                parts.name, played_groups[:granted], cursor=dict(train.manager.state_dict())
            )
        except ReservationRevokedError as error:
            self.log(f"{error}; playing on")
            return None
        seconds = time.perf_counter() - started
        metrics = {f"train/{key}": value for key, value in result.metrics.items()}
        metrics["explore/groups_written"] = float(written)
        metrics["explore/groups_discarded"] = float(len(played_groups) - granted)
        metrics["explore/groups_per_second"] = written / max(seconds, 1e-9)
        metrics["explore/policy_version"] = float(loaded.version)
        metrics["time/explore_batch"] = seconds
        metrics["time/started"] = started
        return metrics

    def evaluate(self, version: int) -> None:
        """Play the validation envs with ``version`` and log ``val/*`` (none: nothing)."""
        if self.parts.val is not None:
            played = self.loop.run_until_complete(evaluate(self.parts.val, version=version))
            self.parts.tracker.log(played.metrics, version)

    def waiting(self, what: Callable[[], str], **options: Any) -> Waiting:
        """A wait of this explorer: its line names it, each look tells the buffer it is
        alive."""
        parts = self.parts
        return Waiting(
            lambda: f"explorer {parts.name}: {what()}",
            log=self.log,
            on_look=lambda: parts.buffer.heartbeat(parts.name),
            **options,
        )

    def _wait_for_weights(self) -> Published:
        """The first version the trainer publishes (waiting up to ``sync_timeout``)."""
        parts = self.parts
        return self.waiting(
            lambda: f"waits for the trainer's first weights in {parts.job_dir}",
            timeout=parts.sync_timeout,
            give_up=lambda _: WeightsTimeoutError(
                f"explorer {parts.name}: no weights published in {parts.job_dir} within "
                f"synchronizer.sync_timeout={parts.sync_timeout:g} s; start the trainer "
                "(mode=train) with the same checkpoint_root_dir, project and name"
            ),
            say_first=True,
        ).until(parts.weights.latest)

    def close(self) -> None:
        """Close the engines (on the loop they served on), the explorer's parts, its
        buffer connection and the loop, each whatever became of the others."""
        try:
            self.loop.run_until_complete(self.parts.train.backend.close())
        finally:
            try:
                self.parts.close()
            finally:
                self.parts.buffer.close()
                self.loop.close()


async def _heartbeats(parts: ExplorerParts, play: Awaitable[_T]) -> _T:
    """Await ``play``, telling the buffer every :data:`HEARTBEAT_SECONDS` that this
    explorer is alive (the trainer gives up a silent explorer's slots)."""
    task = asyncio.ensure_future(play)
    while not task.done():
        await asyncio.wait({task}, timeout=HEARTBEAT_SECONDS)
        parts.buffer.heartbeat(parts.name)
    return task.result()


def _due(every: int, version: int, validated: set[int]) -> bool:
    """Whether ``version`` is the first loaded at or past a multiple of ``every`` (a
    version the trainer published while this explorer played is skipped, not lost)."""
    if every <= 0 or version in validated:
        return False
    last = max(validated, default=-1)
    return last < 0 or version // every > last // every


def _groups(trajectories: list[Trajectory]) -> list[list[Trajectory]]:
    """The batch's trajectories by group, in the order the groups first appear."""
    groups: dict[int, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    return list(groups.values())


def close_all(closers: list[Callable[[], Any]]) -> None:
    """Call every closer, in order, whatever the others did; raise the first error."""
    errors = []
    for close in closers:
        try:
            close()
        except Exception as error:
            errors.append(error)
    if errors:
        raise errors[0]
