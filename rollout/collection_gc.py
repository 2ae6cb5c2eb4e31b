"""Python's cyclic garbage collector while episodes are played.

A rollout of thousands of concurrent episodes keeps hundreds of thousands of live
objects (the episodes' token lists, turns and coroutines), and each collection of the
youngest generation that spills into the older ones walks them: at 8,192 episodes the
collector took two thirds of the env manager's own time per env-turn (0.45 ms against
0.14 ms with the collector off; benchmarks/scale_bench.py). While episodes are played
the youngest generation's threshold is raised to :data:`YOUNG_THRESHOLD` allocations
(from Python's 700), so collections come 100× less often; the threshold is put back
when the last rollout of the process ends. Cyclic garbage still goes (tens of MB at
most wait for it).
"""

from __future__ import annotations

import gc
import threading
from types import TracebackType

YOUNG_THRESHOLD = 100_000
"""Allocations between two collections of the youngest generation during a rollout."""


class FewerCollections:
    """Raise the youngest generation's threshold while held (re-entrant, across threads:
    the threshold returns when the last holder releases)."""

    _lock = threading.Lock()
    _holders = 0
    _saved: tuple[int, ...] = ()

    def hold(self) -> None:
        """Raise the threshold (if this is the first holder)."""
        with self._lock:
            if FewerCollections._holders == 0:
                saved = gc.get_threshold()
                FewerCollections._saved = saved
                gc.set_threshold(max(YOUNG_THRESHOLD, saved[0]), *saved[1:])
            FewerCollections._holders += 1

    def release(self) -> None:
        """Put the threshold back (if this is the last holder)."""
        with self._lock:
            FewerCollections._holders -= 1
            if FewerCollections._holders == 0:
                gc.set_threshold(*FewerCollections._saved)

    def __enter__(self) -> FewerCollections:
        self.hold()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()
