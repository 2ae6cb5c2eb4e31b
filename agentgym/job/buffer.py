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
* **Staleness.** Explorers reserve numbered slots for a batch before playing it
  (:meth:`ExperienceBuffer.reserve`), within
  :func:`~agentgym.rollout.async_rollout.staleness_bound` over every explorer's
  slots, and the trainer takes slots in their order (admission order, as the
  async rollout does): no group is trained more than the bound's versions behind,
  whichever explorer finishes first. A restarted explorer fills the slots it held;
  the trainer gives up the slots of an explorer silent for longer than
  ``buffer.explorer_timeout`` (:meth:`ExperienceBuffer.revoke`), so a dead explorer
  does not stop it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgym.job.buffer_rows import (
    RECORD_QUERY,
    SCHEMA,
    ExplorerRecord,
    explorer_record,
    load_group,
    plain_trajectory,
)
from agentgym.rollout.async_rollout import staleness_bound
from agentgym.trajectory import Trajectory

if TYPE_CHECKING:
    from typing import TypeAlias

    from agentgym.job.ray_job import RayExperienceBuffer

    JobBuffer: TypeAlias = "ExperienceBuffer | RayExperienceBuffer"
    """A job's buffer: this process's SQLite connection, or the job's Ray actor."""

WAITER_SECONDS = 30.0
"""An explorer waiting for slots keeps its place in line while heard from this recently."""

STATES = ("ready", "leased", "consumed")
"""A group's states: written and not yet taken; taken by a step not yet checkpointed;
trained by a checkpointed step."""


class ReservationRevokedError(RuntimeError):
    """The trainer gave up on an explorer's reserved slots (it was silent too long)."""


class ExperienceBuffer:
    """A job's experience buffer in the SQLite file ``path`` (created when missing).

    Every process opens its own; writes are transactions, so explorers and the
    trainer may run on one machine or on a shared filesystem that supports SQLite's
    locks. Groups are placed in *slots*, numbered in the order explorers reserved
    them (admission order); the trainer takes slots in that order, so a group's
    staleness is bounded by the version it was reserved at, whichever explorer
    finishes first.

    Args:
        path: The database file.
        timeout: Seconds a write waits for another process's lock.
        copy_to: A JSONL file that gets one line per group stored (``storage_type:
            file``), for inspection: the group's keys, checksum and trajectories
            (frames left out). Appended after the group's transaction commits, so
            an explorer killed between the two leaves those groups out of it; the
            database stays the record the trainer reads.
    """

    def __init__(
        self, path: str | Path, *, timeout: float = 60.0, copy_to: str | Path | None = None
    ) -> None:
        self.path = Path(path)
        self.copy_to = None if copy_to is None else Path(copy_to)
        self._short_since: dict[str, float] = {}
        """Explorer → when it first found room for part of its batch only (reserve)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one connection per process, used by one thread at a time (the shutdown's
        # closing thread included)
        self._db = sqlite3.connect(
            self.path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        with self._transaction() as db:
            if db.execute("SELECT COUNT(*) FROM slots").fetchone()[0] == 0:
                db.execute("INSERT INTO slots (next_slot) VALUES (0)")

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
        """Register explorer ``name``, or take up its record after a restart: its cursor
        and the slots it had reserved are kept (it replays that batch's seeds and
        fills them)."""
        now = time.time()
        with self._transaction() as db:
            db.execute(
                "INSERT INTO explorers (name, started_at, last_heard) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET last_heard = excluded.last_heard",
                (name, now, now),
            )
        record = self.explorer(name)
        assert record is not None
        return record

    def explorer(self, name: str) -> ExplorerRecord | None:
        """Explorer ``name``'s record (None: it never joined)."""
        row = self._db.execute(f"{RECORD_QUERY} WHERE name = ?", (name,)).fetchone()
        return None if row is None else explorer_record(row)

    def explorers(self) -> list[ExplorerRecord]:
        """Every explorer that joined, by name."""
        return [explorer_record(row) for row in self._db.execute(f"{RECORD_QUERY} ORDER BY name")]

    def heartbeat(self, name: str) -> None:
        """Explorer ``name`` is alive (it plays, or waits for weights or admission)."""
        with self._transaction() as db:
            db.execute("UPDATE explorers SET last_heard = ? WHERE name = ?", (time.time(), name))

    def request_sync(self, name: str, version: int | None) -> None:
        """Explorer ``name`` asks for weights newer than ``version``, the one it holds
        (``synchronizer.sync_style: explorer_driven``); None withdraws the request."""
        with self._transaction() as db:
            db.execute("UPDATE explorers SET sync_request = ? WHERE name = ?", (version, name))

    def sync_requested(self, published: int) -> bool:
        """Whether an explorer asks for a version newer than ``published``."""
        (asking,) = self._db.execute(
            "SELECT COUNT(*) FROM explorers WHERE sync_request >= ?", (published,)
        ).fetchone()
        return bool(asking)

    def handed_out(self) -> int:
        """Slots handed out to explorers so far, less those given up: the groups the
        trainer will get, in order."""
        (next_slot,) = self._db.execute("SELECT next_slot FROM slots").fetchone()
        (void,) = self._db.execute("SELECT COUNT(*) FROM void_slots").fetchone()
        return int(next_slot) - int(void)

    def reserve(self, name: str, groups: int, *, version: int, ratio: float, batch: int) -> int:
        """Reserve the next ``groups`` slots for explorer ``name`` to play with weights
        ``version`` (none while it holds a reservation), if the slots handed out stay
        within ``staleness_bound(ratio, version, batch)``; whether it did.

        Explorers are served in the order they started waiting (one that just wrote
        its batch does not jump ahead of one waiting since earlier).

        ``batch`` is the trainer's groups per step. The trainer takes slots in order,
        ``batch`` a step, so a slot reserved at ``version`` is trained by a step that
        updates a version at most ``ceil(ratio)`` newer (the rule of
        :class:`~agentgym.rollout.async_rollout.AdmissionControl`, counted in groups).

        Returns:
            The slots reserved: ``groups``, none (0: wait for a newer version), or
            fewer than ``groups`` when the bound has left room for fewer, and no more,
            for :data:`WAITER_SECONDS` of this explorer's asking. Explorers whose
            batches differ in size (or whose slots were given up) can leave the
            handed-out slots short of a step by fewer groups than any batch, and the
            trainer needs that step to publish the version that would admit a whole
            batch; the explorer then plays its batch and writes only the groups it
            reserved, the rest discarded.
        """
        bound = staleness_bound(ratio, version, batch)
        now = time.time()
        with self._transaction() as db:
            held, waiting = db.execute(
                "SELECT slot_count, waiting_since FROM explorers WHERE name = ?", (name,)
            ).fetchone()
            if held:
                return int(held)  # a restarted explorer's batch: its slots are still its own
            (next_slot,) = db.execute("SELECT next_slot FROM slots").fetchone()
            (void,) = db.execute("SELECT COUNT(*) FROM void_slots").fetchone()
            (earlier,) = db.execute(  # first come, first served among live explorers
                "SELECT COUNT(*) FROM explorers WHERE name != ? AND waiting_since IS NOT NULL "
                "AND waiting_since < ? AND last_heard > ?",
                (name, now if waiting is None else waiting, now - WAITER_SECONDS),
            ).fetchone()
            room = bound - (next_slot - void)
            granted = groups if room >= groups else 0
            if 0 < room < groups:  # room for part of a batch: wait for another explorer ...
                short = self._short_since.setdefault(name, now)
                if now - short >= WAITER_SECONDS:
                    granted = room  # ... to fill it, or for a while take it
            else:
                self._short_since.pop(name, None)
            if not granted or earlier:
                if waiting is None:
                    db.execute("UPDATE explorers SET waiting_since = ? WHERE name = ?", (now, name))
                return 0
            self._short_since.pop(name, None)
            db.execute("UPDATE slots SET next_slot = ?", (next_slot + granted,))
            db.execute(
                "UPDATE explorers SET slot_start = ?, slot_count = ?, waiting_since = NULL, "
                "last_heard = ? WHERE name = ?",
                (next_slot, granted, now, name),
            )
        return granted

    def write(
        self, name: str, groups: Sequence[Sequence[Trajectory]], *, cursor: dict[str, Any]
    ) -> int:
        """Store ``groups`` (each every trajectory of one group id) in explorer
        ``name``'s reserved slots, with its resume ``cursor``, in one transaction;
        returns how many were new (a group already stored under its ``(explorer, seq)``
        is left as it was).

        Raises:
            ReservationRevokedError: When the trainer gave up on the reservation (the
                explorer was silent too long); nothing is stored, the cursor is kept.
            ValueError: When ``groups`` does not fill the reservation.
        """
        now = time.time()
        with self._transaction() as db:
            row = db.execute(
                "SELECT next_seq, slot_start, slot_count FROM explorers WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                raise KeyError(f"explorer {name!r} has not joined the buffer {self.path}")
            seq, start, count = (int(row[0]), row[1], int(row[2]))
            if not count:
                raise ReservationRevokedError(
                    f"explorer {name!r}: its reserved slots were given up by the trainer "
                    "(silent too long); the batch is not stored"
                )
            if len(groups) != count:
                raise ValueError(f"{len(groups)} groups for {count} reserved slots")
            new, stored = 0, []
            for offset, members in enumerate(groups):
                payload = pickle.dumps(list(members), protocol=pickle.HIGHEST_PROTOCOL)
                checksum = hashlib.sha256(payload).hexdigest()
                inserted = db.execute(
                    "INSERT OR IGNORE INTO groups (slot, explorer, seq, group_id, min_version, "
                    "payload, checksum, written_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        int(start) + offset,
                        name,
                        seq + offset,
                        members[0].group_id,
                        min(t.policy_version for t in members),
                        payload,
                        checksum,
                        now,
                    ),
                )
                new += inserted.rowcount
                if inserted.rowcount:
                    stored.append((int(start) + offset, seq + offset, checksum, members))
            db.execute(
                "UPDATE explorers SET cursor = ?, next_seq = ?, written = written + ?, "
                "slot_start = NULL, slot_count = 0, last_heard = ? WHERE name = ?",
                (json.dumps(cursor), seq + len(groups), new, now, name),
            )
        if self.copy_to is not None and stored:
            lines = [
                json.dumps(
                    {
                        "explorer": name,
                        "seq": number,
                        "slot": slot,
                        "group_id": members[0].group_id,
                        "min_version": min(t.policy_version for t in members),
                        "checksum": checksum,
                        "written_at": now,
                        "trajectories": [plain_trajectory(t) for t in members],
                    }
                )
                for slot, number, checksum, members in stored
            ]
            with self.copy_to.open("a") as handle:
                handle.write("".join(line + "\n" for line in lines))
        return new

    def revoke(self, name: str) -> int:
        """Give up explorer ``name``'s reserved slots (it died or stalled): they are
        skipped, so the trainer does not wait for them; the slots given up."""
        with self._transaction() as db:
            start, count = db.execute(
                "SELECT slot_start, slot_count FROM explorers WHERE name = ?", (name,)
            ).fetchone()
            if not count:
                return 0
            db.executemany(
                "INSERT OR IGNORE INTO void_slots (slot) VALUES (?)",
                [(slot,) for slot in range(int(start), int(start) + int(count))],
            )
            db.execute(
                "UPDATE explorers SET slot_start = NULL, slot_count = 0 WHERE name = ?", (name,)
            )
        return int(count)

    # --- the trainer -----------------------------------------------------------------

    def blocking(self, groups: int) -> list[str]:
        """The explorers whose reserved, unwritten slots the next ``groups`` are waiting for."""
        taken = self._next_slots(self._db, groups)
        rows = self._db.execute(
            "SELECT name, slot_start, slot_count FROM explorers WHERE slot_count > 0"
        ).fetchall()
        return sorted(
            str(name)
            for name, start, count in rows
            if any(int(start) <= slot < int(start) + int(count) for slot in taken)
        )

    def lease(self, step: int, groups: int) -> list[list[Trajectory]] | None:
        """The next ``groups`` slots' groups in slot order, leased by ``step`` (the ones
        it already leased, when it asks again); None while any of those slots is still
        being played (nothing is leased).

        Raises:
            BufferCorruptError: When a group's bytes do not match its checksum.
        """
        with self._transaction() as db:
            rows = db.execute(
                "SELECT slot, payload, checksum FROM groups WHERE state = 'leased' AND step = ? "
                "ORDER BY slot",
                (step,),
            ).fetchall()
            if not rows:
                slots = self._next_slots(db, groups)
                if len(slots) < groups:
                    return None
                marks = ",".join("?" * len(slots))
                rows = db.execute(
                    "SELECT slot, payload, checksum FROM groups "
                    f"WHERE slot IN ({marks}) ORDER BY slot",
                    slots,
                ).fetchall()
                if len(rows) < groups:
                    return None
                db.executemany(
                    "UPDATE groups SET state = 'leased', step = ? WHERE slot = ?",
                    [(step, row[0]) for row in rows],
                )
        return [load_group(row) for row in rows]

    @staticmethod
    def _next_slots(db: sqlite3.Connection, groups: int) -> list[int]:
        """The ``groups`` lowest slots handed out, not void, not yet leased or consumed
        (every slot below the lowest ready or reserved one is taken: only the window
        from there is read)."""
        (first,) = db.execute(
            "SELECT MIN(slot) FROM (SELECT MIN(slot) AS slot FROM groups WHERE state = 'ready' "
            "UNION ALL SELECT MIN(slot_start) FROM explorers WHERE slot_count > 0)"
        ).fetchone()
        if first is None:
            return []
        (next_slot,) = db.execute("SELECT next_slot FROM slots").fetchone()
        taken = {
            int(slot)
            for (slot,) in db.execute(
                "SELECT slot FROM groups WHERE state != 'ready' AND slot >= ? "
                "UNION SELECT slot FROM void_slots WHERE slot >= ?",
                (first, first),
            )
        }
        slots = []
        for slot in range(int(first), int(next_slot)):
            if slot not in taken:
                slots.append(slot)
                if len(slots) == groups:
                    break
        return slots

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
            "SELECT step, explorer, seq FROM groups WHERE state = 'consumed' ORDER BY step, slot"
        ).fetchall()
        steps: dict[int, list[tuple[str, int]]] = {}
        for step, explorer, seq in rows:
            steps.setdefault(int(step), []).append((str(explorer), int(seq)))
        return steps
