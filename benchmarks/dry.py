"""The benchmarks' dry mode: tiny sizes that check that what is timed works, not how fast.

``AGENTGYM_BENCH_DRY=1`` shrinks the sizes that the pytest-benchmark modules read
through :func:`sized`; run them so with ``--benchmark-disable`` (each benchmarked
function runs once, untimed), as tests/bench_dry/ does in CI::

    AGENTGYM_BENCH_DRY=1 python -m pytest benchmarks/ --benchmark-disable -p no:cacheprovider

The scripts take ``--dry-run`` instead.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

DRY = os.environ.get("AGENTGYM_BENCH_DRY", "") not in ("", "0")
"""Whether this process runs the benchmarks dry (``AGENTGYM_BENCH_DRY`` set, not 0)."""


def sized(full: T, dry: T) -> T:
    """``dry`` in the dry mode, else ``full``: the benchmark's size."""
    return dry if DRY else full
