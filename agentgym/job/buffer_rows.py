"""The experience buffer's stored rows (:mod:`agentgym.job.buffer`): the SQLite schema,
an explorer's record, and a group's bytes checked against their checksum."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
from dataclasses import dataclass
from typing import Any

from agentgym.trajectory import Trajectory

SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    slot INTEGER NOT NULL UNIQUE,
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
CREATE INDEX IF NOT EXISTS groups_state ON groups (state, slot);
CREATE TABLE IF NOT EXISTS explorers (
    name TEXT PRIMARY KEY,
    cursor TEXT,
    next_seq INTEGER NOT NULL DEFAULT 0,
    slot_start INTEGER,
    slot_count INTEGER NOT NULL DEFAULT 0,
    waiting_since REAL,
    sync_request INTEGER,
    written INTEGER NOT NULL DEFAULT 0,
    started_at REAL NOT NULL,
    last_heard REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS slots (
    next_slot INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS void_slots (
    slot INTEGER PRIMARY KEY
);
"""


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
        reserved: Slots it holds for the batch it plays (0: none).
        last_heard: When it last wrote or sent a heartbeat (``time.time()``).
    """

    name: str
    cursor: dict[str, Any] | None
    next_seq: int
    written: int
    reserved: int
    last_heard: float


RECORD_QUERY = "SELECT name, cursor, next_seq, written, slot_count, last_heard FROM explorers"


def explorer_record(row: tuple[Any, ...]) -> ExplorerRecord:
    name, cursor, next_seq, written, reserved, last_heard = row
    return ExplorerRecord(
        name=str(name),
        cursor=None if cursor is None else json.loads(cursor),
        next_seq=int(next_seq),
        written=int(written),
        reserved=int(reserved),
        last_heard=float(last_heard),
    )


def plain_trajectory(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory as JSON-ready values, its rendered frames left out."""
    return {k: v for k, v in dataclasses.asdict(trajectory).items() if k != "frames"}


def load_group(row: tuple[Any, ...]) -> list[Trajectory]:
    slot, payload, checksum = row
    if hashlib.sha256(payload).hexdigest() != checksum:
        raise BufferCorruptError(
            f"the group in slot {slot} of the experience buffer fails its checksum"
        )
    members: list[Trajectory] = pickle.loads(payload)  # the job's own file, never a stranger's
    return members
