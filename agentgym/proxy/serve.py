"""``mode: serve``: an explorer that serves the OpenAI API to agents someone else starts
(Trinity-RFT's ``mode: serve``); the trainer is the usual ``mode: train``.

The explorer loads the trainer's weights as any explorer does and listens on
``agent.host:agent.port``. An outside harness opens a session per episode and hands
its agent the session's base URL and the job's key::

    POST /sessions          {"task": "level-7"}  ->  {"session": ..., "base_url": ...}
    POST <base_url>/chat/completions ...          (the agent, any OpenAI client)
    POST /s/<session>/feedback {"reward": 1.0}   (ends the episode)

Sessions that name the same ``task`` form a group of ``group_size`` (GRPO compares the
members of a group); sessions without a task are grouped in the order they open. A
group is written to the job's experience buffer once all its sessions have ended,
through the buffer's own reservation (the staleness bound holds as for any explorer)
and its ``(explorer, seq)`` keys, so the trainer trains every written group exactly
once. A session with no feedback within ``agent.timeout`` ends as a failed episode.
A new group opens only while the bound has room for it at the loaded version and the
trainer still needs groups; until then ``POST /sessions`` waits (up to
``agent.timeout``, then 503). Generation and weight loads take turns: a load waits
for the requests being generated and holds new ones, so every response comes from
one version, recorded on its tokens.

Where to connect: ``<job folder>/serve/<explorer name>.json`` holds the URL and the
key (readable by its owner only); ``agent.api_key`` fixes the key instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import zlib
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from agentgym.job.explorer import WeightsTimeoutError, close_all
from agentgym.job.published_weights import Published, WeightChannel, WeightsGoneError
from agentgym.proxy.hosts import Recording
from agentgym.proxy.players import fill_trajectory
from agentgym.proxy.recorder import ProxyError, SessionRecorder
from agentgym.proxy.server import ProxyServer, Session
from agentgym.proxy.turns import TakingTurns, TurnTakingBackend
from agentgym.rollout.async_rollout import staleness_bound
from agentgym.rollout.backends.base import GenerationBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.evaluation import evaluate
from agentgym.rollout.loop import RolloutConfig
from agentgym.rollout.source import Rollout
from agentgym.trainers.tracking import Tracker
from agentgym.trajectory import Trajectory

if TYPE_CHECKING:
    from agentgym.job.buffer import JobBuffer

_T = TypeVar("_T")

POLL_SECONDS = 0.5
"""How often the explorer looks for new weights, the trainer's end and expired sessions."""
SERVE_FOLDER = "serve"
"""The job folder's subfolder of the serving explorers' address files."""


@dataclass
class ServeParts:
    """What a serving explorer runs on, built by
    :func:`agentgym.builders.explore.build_server`.

    Attributes:
        name: The explorer's name in the buffer (``explorer.name``).
        job_dir: The job folder.
        buffer: The job's experience buffer.
        weights: Where the trainer publishes weights.
        backend: The policy's engines.
        chat: The policy's chat template and tokenizer.
        config: How requests are generated and recorded (``rollout_mode``, limits).
        val: The validation episodes (None: ``eval_steps`` is 0).
        tracker: Where metrics go.
        ratio: The staleness bound in versions.
        group_size: Sessions per group.
        max_steps: The trainer's steps: groups beyond ``max_steps × groups per step``
            would never be trained, so none opens.
        eval_steps: Validate every this many versions (0: never).
        eval_on_startup: Validate the first weights loaded.
        sync_timeout: Seconds to wait for the trainer's first weights.
        host: Where the server listens.
        port: Its port (0: any free one, written to the address file).
        api_key: The key agents must send (None: a new random one).
        timeout: Seconds a session may stay open, and an opener may wait for room.
        close: Releases the engines' workers, the validation envs and the tracker.
    """

    name: str
    job_dir: Path
    buffer: JobBuffer
    weights: WeightChannel
    backend: GenerationBackend
    chat: ChatTokenizer
    config: RolloutConfig
    val: Rollout | None
    tracker: Tracker
    ratio: float
    group_size: int
    max_steps: int
    eval_steps: int
    eval_on_startup: bool
    sync_timeout: float
    host: str
    port: int
    api_key: str | None
    timeout: float
    close: Callable[[], None]


@dataclass
class ServedGroup:
    """The sessions of one group: opened, and ended as trajectories."""

    task: str | None
    group_id: int
    version: int
    """The version loaded when it opened (its failed members' version)."""
    opened: int = 0
    ended: list[Trajectory] = field(default_factory=list)


class ServingExplorer:
    """A serving explorer at work: its sessions, their groups, and the weights it holds.

    Args:
        parts: What it runs on.
        log: Where its lines go.
    """

    def __init__(self, parts: ServeParts, log: Callable[[str], None] | None = None) -> None:
        self.parts = parts
        self.log = log or partial(print, flush=True)
        self.turns = TakingTurns()
        self.backend = TurnTakingBackend(parts.backend, self.turns)
        self.server = ProxyServer(parts.host, parts.port, token=parts.api_key)
        self.server.opener = self.open
        self.server.on_finish = self._ended
        self.loaded: Published | None = None
        self.closed: str | None = None
        """Why no session opens any more (None: sessions open)."""
        self.filling: dict[str | None, ServedGroup] = {}
        """Each task's group that still takes sessions."""
        self.unwritten: set[int] = set()
        """Groups opened and not yet written (or dropped)."""
        self.counts = {"written": 0, "discarded": 0, "expired": 0, "sessions": 0}
        self._room = asyncio.Condition()
        self._buffer_lock = asyncio.Lock()
        self._opening = asyncio.Lock()
        self._writing = asyncio.Lock()
        self._writes: set[asyncio.Task[None]] = set()
        self._expired: set[str] = set()
        self._groups: dict[str, ServedGroup] = {}
        """Each open session's group."""
        self._next_group = 0
        self._validated: set[int] = set()

    # --- sessions ----------------------------------------------------------------------

    async def open(self, task: str | None) -> Session:
        """A new session of ``task``'s filling group, or of a new group once the bound and
        the trainer's remaining steps have room for one.

        Raises:
            ProxyError: 410 once the trainer has finished; 503 when no room came within
                ``agent.timeout``.
        """
        deadline = time.monotonic() + self.parts.timeout
        while True:
            if self.closed is not None:
                raise ProxyError(410, self.closed, code="job_finished")
            group = self.filling.get(task)
            if group is None and self.loaded is not None:
                async with self._opening:  # one new group at a time: the room is counted once
                    group = self.filling.get(task)
                    if group is None and await self._has_room():
                        group = ServedGroup(task, self._next_group, self.loaded.version)
                        self._next_group += 1
                        self.filling[task] = group
                        self.unwritten.add(group.group_id)
            if group is not None:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProxyError(
                    503,
                    "no room for a new group: the trainer has not caught up within "
                    f"agent.timeout={self.parts.timeout:g} s (the staleness bound); try again",
                    code="busy",
                )
            # other explorers' writes and the trainer's leases change the room too: look again
            async with self._room:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), min(left, POLL_SECONDS * 2))
        recorder = SessionRecorder(
            self.backend,  # type: ignore[arg-type]  # its generate is all a recorder calls
            self.parts.chat,
            self.parts.config,
            group_id=group.group_id,
            env_index=group.opened,
            policy_version=self.loaded.version if self.loaded else 0,
        )
        group.opened += 1
        if group.opened == self.parts.group_size:
            del self.filling[task]
        session = self.server.open(recorder, task)
        self._groups[session.name] = group
        self.counts["sessions"] += 1
        return session

    async def _has_room(self) -> bool:
        """Whether one more group fits under the staleness bound at the loaded version
        and within the groups the trainer still trains."""
        loaded = self.loaded
        assert loaded is not None
        handed_out = await self._call(self.parts.buffer.handed_out)
        limit = min(
            staleness_bound(self.parts.ratio, loaded.version, loaded.groups_per_step),
            self.parts.max_steps * loaded.groups_per_step,
        )
        return handed_out + len(self.unwritten) < limit

    def _ended(self, session: Session) -> None:
        """A session ended (feedback, or expired): its trajectory joins its group, and a
        complete group goes to the buffer."""
        group = self._groups.pop(session.name)
        recorder = session.recorder
        trajectory = Trajectory(
            env_name="serve",
            tag="serve",
            group_id=group.group_id,
            seed=task_seed(group.task),
            env_index=recorder.env_index,
            mode=self.parts.config.mode,
            policy_version=group.version,
        )
        if session.name in self._expired:
            trajectory.error = (
                f"no feedback within agent.timeout={self.parts.timeout:g} s: post the reward "
                f"to /s/{session.name}/feedback"
            )
        fill_trajectory(trajectory, Recording.of(session), None)
        group.ended.append(trajectory)
        if len(group.ended) == self.parts.group_size:
            task = asyncio.ensure_future(self._write(group))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _write(self, group: ServedGroup) -> None:
        """Reserve a slot for ``group`` within the bound and store it (once)."""
        parts = self.parts
        members = sorted(group.ended, key=lambda t: t.env_index)
        version = min(t.policy_version for t in members)
        batch = self.loaded.groups_per_step if self.loaded else 1
        deadline = time.monotonic() + parts.timeout
        reserve = partial(parts.buffer.reserve, version=version, ratio=parts.ratio, batch=batch)
        try:
            async with self._writing:  # the buffer holds one reservation per explorer
                while not await self._call(reserve, parts.name, 1):
                    if time.monotonic() > deadline:
                        self.counts["discarded"] += 1
                        self.log(
                            f"explorer {parts.name}: group {group.group_id} (version {version}) "
                            "found no slot within the staleness bound; discarded"
                        )
                        return
                    await asyncio.sleep(POLL_SECONDS)
                write = partial(parts.buffer.write, cursor={"groups": self.counts["written"] + 1})
                written = await self._call(write, parts.name, [members])
            self.counts["written"] += written
            parts.tracker.log(self._group_metrics(members, version), self.counts["written"])
        finally:
            self.unwritten.discard(group.group_id)
            async with self._room:
                self._room.notify_all()

    def _group_metrics(self, members: list[Trajectory], version: int) -> dict[str, float]:
        """A written group's record (its step: the groups written so far)."""
        turns = [turn for t in members for turn in t.turns]
        return {
            "train/success": sum(t.success for t in members) / len(members),
            "train/score": sum(t.score for t in members) / len(members),
            "train/failed": float(sum(t.failed for t in members)),
            "proxy/requests": len(turns) / len(members),
            "proxy/prefix_breaks": float(sum(turn.starts_sample for turn in turns)),
            "serve/policy_version": float(version),
            "serve/groups_written": float(self.counts["written"]),
            "serve/sessions_expired": float(self.counts["expired"]),
        }

    def _expire(self) -> None:
        """End the sessions open longer than ``agent.timeout`` (failed episodes)."""
        now = time.monotonic()
        for session in list(self.server.sessions.values()):
            if not session.finished and now - session.opened > self.parts.timeout:
                self._expired.add(session.name)
                self.counts["expired"] += 1
                self.server.finish(session)

    async def _call(self, function: Callable[..., _T], *args: Any) -> _T:
        """A buffer call off the event loop, one at a time (one connection)."""
        async with self._buffer_lock:
            return await asyncio.to_thread(function, *args)

    # --- weights -----------------------------------------------------------------------

    async def follow(self) -> int:
        """Serve until the trainer finishes: load each version it publishes, validate
        every ``eval_steps``; the groups written."""
        parts = self.parts
        await self._call(parts.buffer.join, parts.name)
        await self.server.start()
        address = self._write_address()
        self.log(
            f"mode=serve: explorer {parts.name} serves agents at {self.server.url} "
            f"(open a session: POST {self.server.url}/sessions; address and key: {address})"
        )
        try:
            await self._load(await self._first_weights())
            if not parts.eval_on_startup:
                assert self.loaded is not None
                self._validated.add(self.loaded.version)
            while True:
                await self._maybe_validate()
                finished = await self._call(parts.weights.finished)
                if finished is not None:
                    break
                await asyncio.sleep(POLL_SECONDS)
                await self._call(parts.buffer.heartbeat, parts.name)
                self._expire()
                await self._load_newer()
            await self._load_newer()  # the last version is published before the finish mark
            await self._maybe_validate(last=True)
            self.closed = f"the job has finished: the trainer published its last version {finished}"
            async with self._room:
                self._room.notify_all()
            if self._writes:
                await asyncio.wait(set(self._writes), timeout=parts.timeout)
            open_sessions = sum(not s.finished for s in self.server.sessions.values())
            self.log(
                f"explorer {parts.name}: the trainer finished at version {finished}; "
                f"{self.counts['written']} groups written from {self.counts['sessions']} "
                f"sessions ({open_sessions} sessions still open and "
                f"{self.counts['discarded']} groups discarded are not trained)"
            )
            return self.counts["written"]
        finally:
            self.closed = self.closed or "the serving explorer is stopping"
            await self.server.stop()
            address.unlink(missing_ok=True)

    async def _first_weights(self) -> Published:
        parts = self.parts
        deadline = time.monotonic() + parts.sync_timeout
        self.log(f"explorer {parts.name}: waits for the trainer's first weights in {parts.job_dir}")
        while (published := await self._call(parts.weights.latest)) is None:
            if time.monotonic() > deadline:
                raise WeightsTimeoutError(
                    f"explorer {parts.name}: no weights published in {parts.job_dir} within "
                    f"synchronizer.sync_timeout={parts.sync_timeout:g} s; start the trainer "
                    "(mode=train) with the same checkpoint_root_dir, project and name"
                )
            await self._call(parts.buffer.heartbeat, parts.name)
            await asyncio.sleep(POLL_SECONDS)
        return published

    async def _load_newer(self) -> None:
        current = await self._call(self.parts.weights.latest)
        loaded = self.loaded
        if current is None or loaded is None or current.version <= loaded.version:
            return
        if current.key == loaded.key:  # a step that changed no weights
            await self._loaded(current)
            return
        await self._load(current)

    async def _load(self, published: Published) -> None:
        """Load ``published`` (or, if it goes away meanwhile, the newest) with no
        generation under way."""
        started = time.perf_counter()
        async with self.turns.load():
            while True:
                try:
                    await self.parts.backend.update_weights(self.parts.weights.read(published))
                    break
                except WeightsGoneError:  # replaced while read: load a whole newer one
                    await asyncio.sleep(POLL_SECONDS)
                    newest = await self._call(self.parts.weights.latest)
                    published = newest or published
            await self._loaded(published)
        self.log(
            f"explorer {self.parts.name}: loaded version {published.version} in "
            f"{time.perf_counter() - started:.2f} s"
        )

    async def _loaded(self, published: Published) -> None:
        self.loaded = published
        for session in self.server.sessions.values():
            if not session.finished:  # versions the backend does not report itself
                session.recorder.policy_version = published.version
        async with self._room:  # a newer version makes room
            self._room.notify_all()

    async def _maybe_validate(self, *, last: bool = False) -> None:
        parts, loaded = self.parts, self.loaded
        if parts.val is None or loaded is None or loaded.version in self._validated:
            return
        previous = max(self._validated, default=-1)
        due = previous < 0 or loaded.version // parts.eval_steps > previous // parts.eval_steps
        if due or last:
            self._validated.add(loaded.version)
            played = await evaluate(parts.val, version=loaded.version)
            parts.tracker.log(played.metrics, loaded.version)

    def _write_address(self) -> Path:
        """``<job>/serve/<name>.json``: the server's URL and key, for its owner only."""
        folder = self.parts.job_dir / SERVE_FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.parts.name}.json"
        staged = path.with_suffix(f".{os.getpid()}.tmp")
        descriptor = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(
                {
                    "url": self.server.url,
                    "sessions": f"{self.server.url}/sessions",
                    "api_key": self.server.token,
                    "explorer": self.parts.name,
                    "pid": os.getpid(),
                },
                handle,
            )
        staged.replace(path)
        return path


def task_seed(task: str | None) -> int:
    """A served trajectory's ``seed``: its task when that is a number (a seed, a row),
    else a stable 31-bit hash of it; 0 without a task."""
    if task is None:
        return 0
    if task.isdecimal():
        return int(task)
    return zlib.crc32(task.encode()) & 0x7FFFFFFF


def serve(parts: ServeParts, *, log: Callable[[str], None] | None = None) -> int:
    """Run a serving explorer until the trainer has finished; the groups it wrote.

    Raises:
        WeightsTimeoutError: When nothing is published within ``sync_timeout``.
    """
    loop = asyncio.new_event_loop()
    explorer = ServingExplorer(parts, log)
    try:
        return loop.run_until_complete(explorer.follow())
    finally:
        try:
            close_all(
                [
                    lambda: loop.run_until_complete(parts.backend.close()),
                    parts.close,
                    parts.buffer.close,
                ]
            )
        finally:
            loop.close()
