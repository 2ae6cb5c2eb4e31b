"""When the trainer of a decoupled job publishes weights and when its explorers load
them (Trinity-RFT's ``synchronizer.sync_interval``, ``sync_offset`` and
``sync_style``), and the staleness bound that schedule implies.

A version is the trainer step whose update it carries. Trinity's three styles, as
built here (docs/explorer_trainer.md):

* ``fixed``: the trainer publishes every ``sync_interval`` steps; an explorer syncs
  after its batch ``n`` when ``n > sync_offset`` and ``(n - sync_offset)`` is a
  multiple of ``sync_interval``, and waits for a newer version when the trainer has
  the groups to make one (Trinity's explorer waits unconditionally, and a
  ``sync_timeout`` ends it; here it waits as long as the trainer is on its way).
* ``trainer_driven``: the trainer publishes every ``sync_interval`` steps; explorers
  take each new version after the batch they are playing, without waiting.
* ``explorer_driven``: an explorer asks for weights after ``sync_interval`` of its
  batches (or when the staleness bound stops it); the trainer publishes when asked
  (after a step, or while it waits for groups); the explorer takes the newest
  without waiting.

Whatever the style, an explorer that the staleness bound stops loads the newest
version, so the bound always wins over the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SyncSchedule:
    """A decoupled job's sync schedule.

    Attributes:
        interval: ``sync_interval``: steps between publications, and the explorer's
            batches between syncs.
        offset: ``sync_offset``: batches an explorer plays before its first
            scheduled sync (``fixed``).
        style: ``sync_style``: ``fixed``, ``trainer_driven`` or ``explorer_driven``.
    """

    interval: int = 1
    offset: int = 0
    style: str = "fixed"

    @property
    def implied_bound(self) -> int:
        """The staleness bound in versions this schedule implies when
        ``async_generation_ratio`` is not set: the batches an explorer plays on one
        version, ``sync_interval + sync_offset``, less the one that is on-policy."""
        return self.interval + self.offset - 1

    def trainer_publishes(self, step: int, *, last_step: int, requested: bool) -> bool:
        """Whether the trainer publishes the weights of ``step`` (always its last
        step: explorers end on it). ``requested``: an explorer asks for a newer
        version than the one published."""
        if step >= last_step:
            return True
        if self.style == "explorer_driven":
            return requested
        return step % self.interval == 0

    def explorer_syncs(self, played: int, synced_after: int) -> bool:
        """Whether an explorer syncs after its batch number ``played`` (from 1), having
        last synced after batch ``synced_after``."""
        if self.style == "fixed":
            return played > self.offset and (played - self.offset) % self.interval == 0
        if self.style == "explorer_driven":
            return played - synced_after >= self.interval
        return True  # trainer_driven: whenever the trainer has published a newer one

    @property
    def explorer_waits(self) -> bool:
        """Whether a syncing explorer waits for a newer version (``fixed``)."""
        return self.style == "fixed"

    def next_publication(self, version: int) -> int:
        """The step of the trainer's next scheduled publication after ``version``
        (``fixed`` and ``trainer_driven``)."""
        return (version // self.interval + 1) * self.interval

    def conflict(self, bound: float) -> str | None:
        """Why the staleness ``bound`` and this schedule cannot both hold (None: they
        can). Publishing only every ``interval`` steps, the trainer needs the groups of
        ``interval`` steps played on one version before it publishes the next, and the
        bound lets explorers play ``bound + 1`` steps ahead of a version."""
        if self.style == "explorer_driven" or bound >= self.interval - 1:
            return None
        return (
            f"async_generation_ratio={bound:g} lets explorers play {bound + 1:g} steps' "
            f"groups on one version, but with synchronizer.sync_interval={self.interval} "
            f"(sync_style={self.style}) the trainer publishes the next version only after "
            f"{self.interval} steps: the explorers would wait for a version that needs "
            f"groups they may not play. Set async_generation_ratio >= {self.interval - 1}, "
            "a smaller sync_interval, or sync_style=explorer_driven"
        )
