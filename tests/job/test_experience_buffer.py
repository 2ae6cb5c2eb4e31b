"""The experience buffer's guarantees, on real SQLite files shared by real processes:
whole groups only, each trained exactly once across a trainer's crash and resume, no
group written twice across an explorer's crash and restart, the staleness bound over
every explorer, a corrupt group named."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from agentgym.job.buffer import ExperienceBuffer, ReservationRevokedError
from agentgym.job.buffer_rows import BufferCorruptError
from agentgym.trajectory import Trajectory


def group(group_id: int, version: int = 0, size: int = 2) -> list[Trajectory]:
    return [
        Trajectory(
            env_name="sokoban",
            tag="sokoban",
            group_id=group_id,
            seed=group_id,
            env_index=index,
            policy_version=version,
        )
        for index in range(size)
    ]


def put(buffer: ExperienceBuffer, name: str, groups: list[list[Trajectory]], **cursor: int) -> int:
    """Reserve (far within the bound) and write, as an explorer does."""
    assert buffer.reserve(name, len(groups), version=10**6, ratio=0, batch=1)
    return buffer.write(name, groups, cursor=cursor)


def test_whole_groups_in_slot_order_and_never_a_partial_batch(tmp_path: Path) -> None:
    buffer = ExperienceBuffer(tmp_path / "b.sqlite")
    buffer.join("e")
    put(buffer, "e", [group(0), group(1), group(2)], cursor=3)
    assert buffer.lease(1, 4) is None  # 3 ready: nothing leased
    assert buffer.counts() == {"ready": 3, "leased": 0, "consumed": 0}
    first = buffer.lease(1, 2)
    assert first is not None and [[t.group_id for t in g] for g in first] == [[0, 0], [1, 1]]
    assert buffer.lease(1, 2) is not None  # asked again: the same leases
    assert [g[0].group_id for g in buffer.lease(1, 2) or []] == [0, 1]
    assert buffer.counts() == {"ready": 1, "leased": 2, "consumed": 0}
    buffer.commit(1)
    assert buffer.counts() == {"ready": 1, "leased": 0, "consumed": 2}


def test_a_rewritten_group_is_ignored_and_the_cursor_is_kept(tmp_path: Path) -> None:
    buffer = ExperienceBuffer(tmp_path / "b.sqlite")
    assert buffer.join("e").cursor is None
    assert put(buffer, "e", [group(0), group(1)], cursor=2) == 2
    # a restarted explorer that replays from an older cursor: its sequence numbers
    # continue from the buffer's record, so the replay is stored once
    record = ExperienceBuffer(tmp_path / "b.sqlite").join("e")
    assert (record.cursor, record.next_seq, record.written) == ({"cursor": 2}, 2, 2)
    with sqlite3.connect(tmp_path / "b.sqlite") as db:
        db.execute("UPDATE explorers SET next_seq = 0")  # as if the write of seq 0, 1 replays
    assert put(buffer, "e", [group(0), group(1)], cursor=2) == 0
    assert buffer.counts()["ready"] == 2


def test_file_storage_copies_each_stored_group_once_as_a_json_line(tmp_path: Path) -> None:
    import json

    buffer = ExperienceBuffer(tmp_path / "b.sqlite", copy_to=tmp_path / "b.jsonl")
    buffer.join("e")
    members = group(0, version=3)
    members[0].frames = [b"a frame"]  # not JSON: left out of the copy
    put(buffer, "e", [members, group(1, version=4)], cursor=2)
    with sqlite3.connect(tmp_path / "b.sqlite") as db:
        db.execute("UPDATE explorers SET next_seq = 0")  # a replay of seq 0 and 1 ...
    put(buffer, "e", [group(0), group(1)], cursor=2)  # ... stored, and copied, once
    lines = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [(r["explorer"], r["seq"], r["group_id"], r["min_version"]) for r in lines] == [
        ("e", 0, 0, 3),
        ("e", 1, 1, 4),
    ]
    assert [t["env_index"] for t in lines[0]["trajectories"]] == [0, 1]
    assert "frames" not in lines[0]["trajectories"][0]
    leased = buffer.lease(1, 2)  # the trainer reads the database, as with sql
    assert leased is not None and [g[0].group_id for g in leased] == [0, 1]
    with sqlite3.connect(tmp_path / "b.sqlite") as db:
        checksums = [row[0] for row in db.execute("SELECT checksum FROM groups ORDER BY slot")]
    assert checksums == [r["checksum"] for r in lines]


def test_recover_settles_leases_by_the_checkpoint_step(tmp_path: Path) -> None:
    buffer = ExperienceBuffer(tmp_path / "b.sqlite")
    buffer.join("e")
    put(buffer, "e", [group(i) for i in range(6)])
    for step in (1, 2, 3):
        assert buffer.lease(step, 2) is not None
    buffer.commit(1)
    # the trainer died after step 3's lease; its last checkpoint is step 2
    buffer.recover(2)
    assert buffer.counts() == {"ready": 2, "leased": 0, "consumed": 4}
    again = buffer.lease(3, 2)
    assert again is not None and [g[0].group_id for g in again] == [4, 5]
    buffer.recover(3)
    assert buffer.consumed_by_step() == {
        1: [("e", 0), ("e", 1)],
        2: [("e", 2), ("e", 3)],
        3: [("e", 4), ("e", 5)],
    }


def test_reservations_hold_every_explorer_within_the_staleness_bound(tmp_path: Path) -> None:
    buffer = ExperienceBuffer(tmp_path / "b.sqlite")
    buffer.join("a")
    buffer.join("b")
    # ratio 1, 2 groups a step, version 0: at most (1 + 0 + 1) × 2 = 4 slots in all
    assert buffer.reserve("a", 2, version=0, ratio=1, batch=2)
    assert buffer.reserve("b", 2, version=0, ratio=1, batch=2)
    buffer.write("a", [group(0), group(1)], cursor={})
    assert not buffer.reserve("a", 2, version=0, ratio=1, batch=2)  # written ones count
    assert buffer.reserve("a", 2, version=1, ratio=1, batch=2)
    assert buffer.reserve("a", 2, version=9, ratio=1, batch=2)  # held: the same slots
    assert buffer.explorer("a") is not None and buffer.explorer("a").reserved == 2  # type: ignore[union-attr]


def test_explorers_waiting_for_slots_are_served_first_come_first_served(
    tmp_path: Path,
) -> None:
    buffer = ExperienceBuffer(tmp_path / "b.sqlite")
    buffer.join("a")
    buffer.join("b")
    assert buffer.reserve("a", 2, version=0, ratio=0, batch=2)  # the bound: 2 slots
    assert not buffer.reserve("b", 1, version=0, ratio=0, batch=2)  # b waits from now
    buffer.write("a", [group(0), group(1)], cursor={})
    # version 1 admits 2 more: a, back first, must not take them before b
    assert not buffer.reserve("a", 2, version=1, ratio=0, batch=2)
    assert buffer.reserve("b", 1, version=1, ratio=0, batch=2)
    assert buffer.reserve("a", 1, version=1, ratio=0, batch=2)


def test_room_for_part_of_a_batch_is_granted_after_a_while_so_the_trainer_is_not_starved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explorer of 1 group a batch wrote 3 and left: the trainer (2 groups a step)
    needs a 4th for the step that would admit a whole batch of the other explorer (2
    groups). The bound leaves room for 1: after WAITER_SECONDS it is granted, and
    the explorer writes 1 of its 2 groups (the CI deadlock of 2026-11-26)."""
    from agentgym.job import buffer as experience_buffer

    clock = [1000.0]
    monkeypatch.setattr(experience_buffer.time, "time", lambda: clock[0])
    buffer = ExperienceBuffer(tmp_path / "b.sqlite")
    buffer.join("small")
    buffer.join("big")
    for seq in range(3):
        assert buffer.reserve("small", 1, version=1, ratio=0, batch=2) == 1
        buffer.write("small", [group(seq)], cursor={})
    # version 1, ratio 0: 4 slots may be handed out; 3 are
    assert buffer.reserve("big", 2, version=1, ratio=0, batch=2) == 0
    clock[0] += experience_buffer.WAITER_SECONDS - 1
    assert buffer.reserve("big", 2, version=1, ratio=0, batch=2) == 0  # the small may fill it
    clock[0] += 1
    assert buffer.reserve("big", 2, version=1, ratio=0, batch=2) == 1
    assert buffer.reserve("big", 2, version=1, ratio=0, batch=2) == 1  # held: the same slot
    buffer.write("big", [group(10)], cursor={})
    steps = [buffer.lease(step, 2) for step in (1, 2)]
    assert [[g[0].group_id for g in leased or []] for leased in steps] == [[0, 1], [2, 10]]


def test_the_trainer_takes_slots_in_admission_order_not_finishing_order(tmp_path: Path) -> None:
    buffer = ExperienceBuffer(tmp_path / "b.sqlite")
    buffer.join("slow")
    buffer.join("fast")
    assert buffer.reserve("slow", 2, version=0, ratio=1, batch=2)  # slots 0, 1
    assert buffer.reserve("fast", 2, version=0, ratio=1, batch=2)  # slots 2, 3
    buffer.write("fast", [group(10), group(11)], cursor={})
    assert buffer.lease(1, 2) is None  # step 1 is slots 0, 1: still being played
    assert buffer.blocking(2) == ["slow"]
    buffer.write("slow", [group(0), group(1)], cursor={})
    assert [g[0].group_id for g in buffer.lease(1, 2) or []] == [0, 1]
    assert [g[0].group_id for g in buffer.lease(2, 2) or []] == [10, 11]


def test_a_restarted_explorer_fills_its_slots_and_a_dead_ones_are_given_up(
    tmp_path: Path,
) -> None:
    buffer = ExperienceBuffer(tmp_path / "b.sqlite")
    for name in ("a", "b", "c"):
        buffer.join(name)
        assert buffer.reserve(name, 1, version=0, ratio=2, batch=1)  # slots 0, 1, 2
    assert buffer.join("a").reserved == 1  # restarted: slot 0 is still a's
    buffer.write("a", [group(0)], cursor={})
    assert buffer.revoke("b") == 1  # b died: slot 1 is skipped
    buffer.write("c", [group(2)], cursor={})
    assert [g[0].group_id for g in buffer.lease(1, 2) or []] == [0, 2]
    with pytest.raises(ReservationRevokedError, match="given up by the trainer"):
        buffer.write("b", [group(1)], cursor={})  # b was only slow: nothing is stored
    assert buffer.counts() == {"ready": 0, "leased": 2, "consumed": 0}


def test_a_corrupt_group_is_named(tmp_path: Path) -> None:
    buffer = ExperienceBuffer(tmp_path / "b.sqlite")
    buffer.join("e")
    put(buffer, "e", [group(0)])
    with sqlite3.connect(tmp_path / "b.sqlite") as db:
        db.execute("UPDATE groups SET payload = x'00'")
    with pytest.raises(BufferCorruptError, match=r"slot 0 .* fails its checksum"):
        buffer.lease(1, 1)


def _write_forever(path: str, name: str, started: multiprocessing.synchronize.Event) -> None:
    buffer = ExperienceBuffer(path)
    record = buffer.join(name)
    seq = record.next_seq
    started.set()
    while True:
        put(buffer, name, [group(seq), group(seq + 1)], cursor=seq + 2)
        seq += 2


def test_an_explorer_killed_mid_write_loses_no_group_and_repeats_none(tmp_path: Path) -> None:
    path = str(tmp_path / "b.sqlite")
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    writer = context.Process(target=_write_forever, args=(path, "e", started))
    writer.start()
    assert started.wait(60)
    time.sleep(0.5)
    assert writer.pid is not None
    os.kill(writer.pid, signal.SIGKILL)  # mid-transaction, most likely
    writer.join()
    buffer = ExperienceBuffer(path)
    record = buffer.join("e")
    stored = buffer._db.execute("SELECT seq, group_id FROM groups ORDER BY seq").fetchall()
    # every transaction is whole: groups come in pairs with the cursor after them
    assert len(stored) == record.next_seq == record.written
    assert record.cursor == {"cursor": record.next_seq}
    assert all(seq == group_id for seq, group_id in stored)
    assert [seq for seq, _ in stored] == list(range(len(stored)))
