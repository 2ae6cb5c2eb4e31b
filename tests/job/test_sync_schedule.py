"""Trinity-RFT's sync schedule (``sync_interval``, ``sync_offset``, ``sync_style``) on
both sides of a decoupled job: which steps the trainer publishes (on a real buffer and
real published folders), when an explorer loads, waits or asks, and the staleness
bound the schedule implies or conflicts with."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agentgym.errors import ConfigError
from agentgym.job.buffer import ExperienceBuffer
from agentgym.job.buffer_source import BufferSource
from agentgym.job.explorer import ExplorerSession, WeightsTimeoutError
from agentgym.job.published_weights import FolderChannel, WeightPublisher
from agentgym.job.schedule import SyncSchedule
from agentgym.schema import validate
from tests.job.test_experience_buffer import group, put
from tests.test_config import composed


def test_fixed_syncs_every_interval_after_the_offset() -> None:
    schedule = SyncSchedule(interval=3, offset=1)
    assert [n for n in range(1, 12) if schedule.explorer_syncs(n, 0)] == [4, 7, 10]
    assert [
        s for s in range(1, 9) if schedule.trainer_publishes(s, last_step=8, requested=False)
    ] == [3, 6, 8]
    assert schedule.implied_bound == 3
    assert schedule.explorer_waits
    assert schedule.next_publication(3) == 6
    assert schedule.next_publication(5) == 6


def test_explorer_driven_asks_and_the_trainer_publishes_when_asked() -> None:
    schedule = SyncSchedule(interval=2, style="explorer_driven")
    assert not schedule.explorer_syncs(3, synced_after=2)
    assert schedule.explorer_syncs(4, synced_after=2)
    assert schedule.explorer_syncs(7, synced_after=2)  # asks again until it gets one
    assert not schedule.trainer_publishes(2, last_step=5, requested=False)
    assert schedule.trainer_publishes(3, last_step=5, requested=True)
    assert schedule.trainer_publishes(5, last_step=5, requested=False)  # the last step
    assert not schedule.explorer_waits


def test_trainer_driven_explorers_take_each_new_version() -> None:
    schedule = SyncSchedule(interval=2, style="trainer_driven")
    assert all(schedule.explorer_syncs(n, n - 1) for n in range(1, 5))
    assert [
        s for s in range(1, 6) if schedule.trainer_publishes(s, last_step=5, requested=True)
    ] == [2, 4, 5]


def test_a_bound_the_schedule_cannot_keep_is_named_with_its_numbers() -> None:
    message = SyncSchedule(interval=4).conflict(1)
    assert message is not None
    assert "async_generation_ratio=1" in message and "sync_interval=4" in message
    assert ">= 3" in message
    assert SyncSchedule(interval=4).conflict(3) is None
    assert SyncSchedule(interval=4, style="explorer_driven").conflict(0.5) is None
    with pytest.raises(ConfigError, match="sync_interval=4"):
        validate(composed("mode=train", "async_generation_ratio=1", "synchronizer.sync_interval=4"))


def test_trinity_names_and_the_implied_bound() -> None:
    config = validate(
        composed(
            "mode=train",
            "synchronizer.sync_style=dynamic_by_explorer",
            "synchronizer.sync_method=OFFLINE",
        )
    )
    assert config.synchronizer.sync_style == "explorer_driven"
    assert config.synchronizer.sync_method == "checkpoint"
    assert config.staleness_versions == 0  # Trinity's defaults: each version waited for
    spaced = composed("mode=train", "synchronizer.sync_interval=3", "synchronizer.sync_offset=1")
    assert validate(spaced).staleness_versions == 3
    ratio = composed("mode=train", "synchronizer.sync_interval=3", "async_generation_ratio=2")
    assert validate(ratio).staleness_versions == 2
    with pytest.raises(ConfigError, match="sync_style"):
        validate(composed("synchronizer.sync_style=sometimes"))


class Trainer:
    """A one-tensor "strategy" and the recipe's calls on a :class:`BufferSource`."""

    def __init__(self, root: Path, schedule: SyncSchedule, last_step: int) -> None:
        self.buffer = ExperienceBuffer(root / "buffer.sqlite")
        self.buffer.join("e")
        self.weights = {"w": torch.zeros(2)}
        self.channel = FolderChannel(root)
        self.publisher = WeightPublisher(self.channel, groups_per_step=1)
        self.publisher.publish(0, self.weights.items())
        self.source = BufferSource(
            self.buffer,
            self.publisher,
            groups_per_step=1,
            ratio=100,
            schedule=schedule,
            last_step=last_step,
            max_read_timeout=20,
            poll_seconds=0.01,
        )
        self.root = root

    def export(self) -> Any:
        """The trainer's weights as they are when a publication exports them."""
        return self.weights.items()

    async def step(self, step: int, *, changed: bool = True) -> None:
        await self.source.next_batch(step)
        if changed:
            self.weights["w"] = self.weights["w"] + 1
            await self.source.update_weights(self.export, timeout=20)
        else:
            self.source.skip_update()

    def published(self) -> tuple[int, float]:
        current = self.channel.latest()
        assert current is not None
        return current.version, float(dict(self.channel.read(current))["w"][0])


def test_the_trainer_publishes_every_interval_and_its_last_step(tmp_path: Path) -> None:
    trainer = Trainer(tmp_path, SyncSchedule(interval=3), last_step=5)
    put(trainer.buffer, "e", [group(i) for i in range(5)])
    seen = []

    async def run() -> None:
        for step in range(1, 6):
            await trainer.step(step)
            seen.append(trainer.published())

    asyncio.run(run())
    assert seen == [(0, 0.0), (0, 0.0), (3, 3.0), (3, 3.0), (5, 5.0)]


def test_a_skipped_due_step_publishes_the_weights_it_kept(tmp_path: Path) -> None:
    trainer = Trainer(tmp_path, SyncSchedule(interval=2), last_step=4)
    put(trainer.buffer, "e", [group(i) for i in range(4)])
    seen = []

    async def run() -> None:
        await trainer.step(1)  # changed, not due: unpublished
        await trainer.step(2, changed=False)  # due: step 1's weights, owed as version 2
        seen.append(trainer.published())
        await trainer.step(3)  # its batch first sends what step 2 owes
        seen.append(trainer.published())
        await trainer.step(4, changed=False)  # the last: owed, sent at close
        await trainer.source.close()
        seen.append(trainer.published())

    asyncio.run(run())
    assert seen == [(0, 0.0), (2, 1.0), (4, 2.0)]


def test_explorer_driven_publishes_when_asked_even_while_waiting_for_groups(
    tmp_path: Path,
) -> None:
    trainer = Trainer(tmp_path, SyncSchedule(style="explorer_driven"), last_step=9)
    put(trainer.buffer, "e", [group(0), group(1)])
    seen = []

    async def run() -> None:
        await trainer.step(1)
        seen.append(trainer.published())  # nobody asked
        trainer.buffer.request_sync("e", 0)
        await trainer.step(2)
        seen.append(trainer.published())
        trainer.buffer.request_sync("e", None)
        # step 3 trains with nobody asking; then step 4 waits for groups, and the
        # explorer asks meanwhile: the waiting trainer publishes step 3
        put(trainer.buffer, "e", [group(2)])
        await trainer.step(3)
        seen.append(trainer.published())
        waiting = asyncio.ensure_future(trainer.source.next_batch(4))
        await asyncio.sleep(0.1)
        trainer.buffer.request_sync("e", 2)
        await asyncio.sleep(0.3)
        seen.append(trainer.published())
        put(trainer.buffer, "e", [group(3)])
        await waiting

    asyncio.run(run())
    assert seen == [(0, 0.0), (2, 2.0), (2, 2.0), (3, 3.0)]


class Engine:
    """The explorer's engines: what they loaded."""

    def __init__(self) -> None:
        self.loaded: list[float] = []

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.loaded.append(float(dict(weights)["w"][0]))


def explorer(root: Path, buffer: ExperienceBuffer, schedule: SyncSchedule) -> Any:
    return SimpleNamespace(
        name="e",
        buffer=buffer,
        weights=FolderChannel(root),
        train=SimpleNamespace(backend=Engine()),
        schedule=schedule,
        sync_timeout=60.0,
        job_dir=root,
    )


def test_an_older_version_is_loaded_the_trainer_restarted_from_it(tmp_path: Path) -> None:
    publisher = WeightPublisher(FolderChannel(tmp_path), groups_per_step=1)
    publisher.publish(0, {"w": torch.zeros(1)}.items())
    publisher.publish(1, {"w": torch.ones(1)}.items())
    parts = explorer(tmp_path, ExperienceBuffer(tmp_path / "buffer.sqlite"), SyncSchedule())
    loop = asyncio.new_event_loop()
    session = ExplorerSession(parts, loop, log=lambda line: None)
    held = parts.weights.latest()
    assert held is not None and session.load_newer(held) is held  # the same: not reloaded
    restarted = WeightPublisher(FolderChannel(tmp_path), groups_per_step=1)  # afresh
    restarted.publish(0, {"w": torch.full((1,), 2.0)}.items())
    loaded = session.load_newer(held)
    assert loaded.version == 0 and parts.train.backend.loaded == [2.0]
    loop.close()


def test_a_fixed_wait_for_a_trainer_that_is_gone_gives_up_naming_it(tmp_path: Path) -> None:
    channel = FolderChannel(tmp_path)
    WeightPublisher(channel, groups_per_step=1).publish(0, {"w": torch.zeros(1)}.items())
    buffer = ExperienceBuffer(tmp_path / "buffer.sqlite")
    buffer.join("e")
    put(buffer, "e", [group(0)])  # the trainer has the groups for version 1, makes none
    parts = explorer(tmp_path, buffer, SyncSchedule())
    parts.sync_timeout = 0.3
    loaded = channel.latest()
    assert loaded is not None
    loop = asyncio.new_event_loop()
    with pytest.raises(WeightsTimeoutError, match=r"published no version after 0 in .* for 0 s"):
        ExplorerSession(parts, loop, log=lambda line: None).sync(loaded)
    loop.close()


def test_fixed_waits_for_the_next_version_when_the_trainer_has_its_groups(
    tmp_path: Path,
) -> None:
    channel = FolderChannel(tmp_path)
    publisher = WeightPublisher(channel, groups_per_step=1)
    publisher.publish(0, {"w": torch.zeros(1)}.items())
    buffer = ExperienceBuffer(tmp_path / "buffer.sqlite")
    buffer.join("e")
    parts = explorer(tmp_path, buffer, SyncSchedule())
    loaded = channel.latest()
    assert loaded is not None
    loop = asyncio.new_event_loop()
    started = time.monotonic()
    assert ExplorerSession(parts, loop).sync(loaded) is loaded  # no groups: nothing to wait for
    assert time.monotonic() - started < 0.5
    put(buffer, "e", [group(0)])  # the trainer can make version 1 now
    later = threading.Timer(0.6, lambda: publisher.publish(1, {"w": torch.ones(1)}.items()))
    later.start()
    synced = ExplorerSession(parts, loop).sync(loaded)
    assert synced.version == 1 and time.monotonic() - started >= 0.5
    assert parts.train.backend.loaded == [1.0]
    loop.close()


def test_explorer_driven_asks_and_goes_on_without_waiting(tmp_path: Path) -> None:
    channel = FolderChannel(tmp_path)
    publisher = WeightPublisher(channel, groups_per_step=1)
    publisher.publish(0, {"w": torch.zeros(1)}.items())
    buffer = ExperienceBuffer(tmp_path / "buffer.sqlite")
    buffer.join("e")
    parts = explorer(tmp_path, buffer, SyncSchedule(style="explorer_driven"))
    loaded = channel.latest()
    assert loaded is not None
    loop = asyncio.new_event_loop()
    assert ExplorerSession(parts, loop).sync(loaded) is loaded
    assert buffer.sync_requested(0)
    publisher.publish(1, {"w": torch.ones(1)}.items())
    assert ExplorerSession(parts, loop).sync(loaded).version == 1
    assert not buffer.sync_requested(0)
    assert parts.train.backend.loaded == [1.0]
    loop.close()
