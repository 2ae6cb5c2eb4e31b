"""The experience buffer between explorer and trainer processes (``mode: explore`` and
``mode: train``): SQLite in WAL mode, no server, one file in the job folder.

The unit is one complete group: every trajectory of one group id, with its
explorer's name, its place in that explorer's sequence, the oldest weights version
among its turns, and a SHA-256 checksum of its bytes. What it guarantees:

* **An explorer writes nothing twice.** A group is keyed ``(explorer, seq)``; the
  explorer's resume cursor (its env manager's seed cursor) is stored in the same
  transaction as the groups it covers, so an explorer killed at any point and
  restarted from its stored cursor replays the same seeds and its rewrites of
  groups already stored are ignored.
* **The trainer trains each group exactly once.** :meth:`ExperienceBuffer.lease`
  takes whole groups, oldest first, and marks them leased by the step; a trainer
  restored from the checkpoint of step ``S`` calls :meth:`ExperienceBuffer.recover`
  with ``S``: groups leased by steps up to ``S`` (their update is in the
  checkpoint) become consumed, those leased by later steps (whose update was lost)
  ready again, in their old order. Consumption is thus decided by the checkpoint
  itself, in effect one transaction with it.
* **Never a partial batch.** A lease gives all the groups asked for or none.
* **Staleness.** Explorers reserve a batch of groups before playing it
  (:meth:`ExperienceBuffer.reserve`), within the bound of
  :func:`~agentgym.rollout.async_rollout.staleness_bound` over every explorer's
  groups: no group is written that the trainer would take more than the bound's
  versions behind.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.rollout.async_rollout import staleness_bound
from agentgym.trajectory import Trajectory

_SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    explorer TEXT NOT NULL,
    seq INTEGER NOT NULL,
    group_id INTEGER NOT NULL,
    min_version INTEGER NOT NULL,
    payload BLOB NOT NULL,
    checksum TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'ready',
    step INTEGER,
    written_at REAL NOT NULL,
    UNIQUE (explorer, seq)
);
CREATE INDEX IF NOT EXISTS groups_state ON groups (state, id);
CREATE TABLE IF NOT EXISTS explorers (
    name TEXT PRIMARY KEY,
    cursor TEXT,
    next_seq INTEGER NOT NULL DEFAULT 0,
    reserved INTEGER NOT NULL DEFAULT 0,
    written INTEGER NOT NULL DEFAULT 0,
    started_at REAL NOT NULL,
    last_heard REAL NOT NULL
);
"""

STATES = ("ready", "leased", "consumed")
"""A group's states: written and not yet taken; taken by a step not yet checkpointed;
trained by a checkpointed step."""


class BufferCorruptError(RuntimeError):
    """A stored group's bytes do not match its checksum."""


@dataclass(frozen=True)
class ExplorerRecord:
    """What the buffer knows of one explorer.

    Attributes:
        name: ``explorer.name``.
        cursor: Its env manager's resume state after the last groups it wrote (None:
            none written yet).
        next_seq: The sequence number of its next group.
        written: Groups it has written.
        reserved: Groups it has reserved and not written yet.
        last_heard: When it last wrote or sent a heartbeat (``time.time()``).
    """

    name: str
    cursor: dict[str, Any] | None
    next_seq: int
    written: int
    reserved: int
    last_heard: float


class ExperienceBuffer:
    """A job's experience buffer in the SQLite file ``path`` (created when missing).

    Every process opens its own; writes are transactions, so explorers and the
    trainer may run on one machine or on a shared filesystem that supports SQLite's
    locks.

    Args:
        path: The database file.
        timeout: Seconds a write waits for another process's lock.
    """

    def __init__(self, path: str | Path, *, timeout: float = 60.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one connection per process, used by one thread at a time (the shutdown's
        # closing thread included)
        self._db = sqlite3.connect(
            self.path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close this process's connection."""
        self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``: the lock is taken at once)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- explorers -------------------------------------------------------------------

    def join(self, name: str) -> ExplorerRecord:
        """Register explorer ``name`` (or take up its record after a restart: the
        reservation it held is released, the cursor kept) and return its record."""
        now = time.time()
        with self._transaction() as db:
            db.execute(
                "INSERT INTO explorers (name, started_at, last_heard) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET reserved = 0, last_heard = excluded.last_heard",
                (name, now, now),
            )
        record = self.explorer(name)
        assert record is not None
        return record

    def explorer(self, name: str) -> ExplorerRecord | None:
        """Explorer ``name``'s record (None: it never joined)."""
        row = self._db.execute(
            "SELECT name, cursor, next_seq, written, reserved, last_heard FROM explorers "
            "WHERE name = ?",
            (name,),
        ).fetchone()
        return None if row is None else _record(row)

    def explorers(self) -> list[ExplorerRecord]:
        """Every explorer that joined, by name."""
        rows = self._db.execute(
            "SELECT name, cursor, next_seq, written, reserved, last_heard FROM explorers "
            "ORDER BY name"
        ).fetchall()
        return [_record(row) for row in rows]

    def heartbeat(self, name: str) -> None:
        """Explorer ``name`` is alive (it waits for weights or for admission)."""
        with self._transaction() as db:
            db.execute("UPDATE explorers SET last_heard = ? WHERE name = ?", (time.time(), name))

    def reserve(self, name: str, groups: int, *, version: int, ratio: float, batch: int) -> bool:
        """Reserve ``groups`` groups for explorer ``name`` to play with weights
        ``version``, if every explorer's written and reserved groups stay within
        ``staleness_bound(ratio, version, batch)``; whether it was reserved.

        ``batch`` is the trainer's groups per step, so a group the trainer takes at
        step ``s`` was played by weights at most ``ceil(ratio)`` versions older than
        the ``s - 1`` it updates (the async rule of
        :class:`~agentgym.rollout.async_rollout.AdmissionControl`, counted in groups).
        """
        bound = staleness_bound(ratio, version, batch)
        with self._transaction() as db:
            (taken,) = db.execute(
                "SELECT COALESCE(SUM(written + reserved), 0) FROM explorers"
            ).fetchone()
            if int(taken) + groups > bound:
                return False
            db.execute(
                "UPDATE explorers SET reserved = reserved + ?, last_heard = ? WHERE name = ?",
                (groups, time.time(), name),
            )
        return True

    def write(
        self,
        name: str,
        groups: Sequence[Sequence[Trajectory]],
        *,
        cursor: dict[str, Any],
        reserved: int | None = None,
    ) -> int:
        """Store ``groups`` (each every trajectory of one group id) as explorer
        ``name``'s next ones, with its resume ``cursor``, in one transaction; returns
        how many were new (a group already stored under its ``(explorer, seq)`` is
        left as it was). ``reserved`` (default ``len(groups)``) is released."""
        now = time.time()
        with self._transaction() as db:
            row = db.execute("SELECT next_seq FROM explorers WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise KeyError(f"explorer {name!r} has not joined the buffer {self.path}")
            seq = int(row[0])
            new = 0
            for offset, members in enumerate(groups):
                payload = pickle.dumps(list(members), protocol=pickle.HIGHEST_PROTOCOL)
                inserted = db.execute(
                    "INSERT OR IGNORE INTO groups (explorer, seq, group_id, min_version, "
                    "payload, checksum, written_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        name,
                        seq + offset,
                        members[0].group_id,
                        min(t.policy_version for t in members),
                        payload,
                        hashlib.sha256(payload).hexdigest(),
                        now,
                    ),
                )
                new += inserted.rowcount
            release = len(groups) if reserved is None else reserved
            db.execute(
                "UPDATE explorers SET cursor = ?, next_seq = ?, written = written + ?, "
                "reserved = MAX(reserved - ?, 0), last_heard = ? WHERE name = ?",
                (json.dumps(cursor), seq + len(groups), new, release, now, name),
            )
        return new

    # --- the trainer -----------------------------------------------------------------

    def lease(self, step: int, groups: int) -> list[list[Trajectory]] | None:
        """The ``groups`` oldest ready groups, leased by ``step`` (the ones it already
        leased, when it asks again); None while fewer are ready (nothing is leased).

        Raises:
            BufferCorruptError: When a group's bytes do not match its checksum.
        """
        with self._transaction() as db:
            rows = db.execute(
                "SELECT id, payload, checksum FROM groups WHERE state = 'leased' AND step = ? "
                "ORDER BY id",
                (step,),
            ).fetchall()
            if not rows:
                rows = db.execute(
                    "SELECT id, payload, checksum FROM groups WHERE state = 'ready' "
                    "ORDER BY id LIMIT ?",
                    (groups,),
                ).fetchall()
                if len(rows) < groups:
                    return None
                db.executemany(
                    "UPDATE groups SET state = 'leased', step = ? WHERE id = ?",
                    [(step, row[0]) for row in rows],
                )
        return [_load(row) for row in rows]

    def recover(self, step: int) -> None:
        """The trainer restarts from the checkpoint of ``step`` (0: none): groups leased
        by steps up to ``step`` are consumed, later leases (and consumptions) undone."""
        with self._transaction() as db:
            db.execute(
                "UPDATE groups SET state = 'consumed' WHERE state = 'leased' AND step <= ?",
                (step,),
            )
            db.execute(
                "UPDATE groups SET state = 'ready', step = NULL "
                "WHERE state IN ('leased', 'consumed') AND step > ?",
                (step,),
            )

    def commit(self, step: int) -> None:
        """The checkpoint of ``step`` is written: the groups leased up to it are consumed."""
        with self._transaction() as db:
            db.execute(
                "UPDATE groups SET state = 'consumed' WHERE state = 'leased' AND step <= ?",
                (step,),
            )

    def counts(self) -> dict[str, int]:
        """Groups in each of :data:`STATES`."""
        rows = dict(self._db.execute("SELECT state, COUNT(*) FROM groups GROUP BY state"))
        return {state: int(rows.get(state, 0)) for state in STATES}

    def consumed_by_step(self) -> dict[int, list[tuple[str, int]]]:
        """``(explorer, seq)`` of the groups each step trained (for audits and tests)."""
        rows = self._db.execute(
            "SELECT step, explorer, seq FROM groups WHERE state = 'consumed' ORDER BY step, id"
        ).fetchall()
        steps: dict[int, list[tuple[str, int]]] = {}
        for step, explorer, seq in rows:
            steps.setdefault(int(step), []).append((str(explorer), int(seq)))
        return steps


def _record(row: tuple[Any, ...]) -> ExplorerRecord:
    name, cursor, next_seq, written, reserved, last_heard = row
    return ExplorerRecord(
        name=str(name),
        cursor=None if cursor is None else json.loads(cursor),
        next_seq=int(next_seq),
        written=int(written),
        reserved=int(reserved),
        last_heard=float(last_heard),
    )


def _load(row: tuple[Any, ...]) -> list[Trajectory]:
    group, payload, checksum = row
    if hashlib.sha256(payload).hexdigest() != checksum:
        raise BufferCorruptError(f"group {group} of the experience buffer fails its checksum")
    members: list[Trajectory] = pickle.loads(payload)  # the job's own file, never a stranger's
    return members
