"""Progress bars on stderr for the long waits of a run (a rollout, an update)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]


def progress(iterable_or_total: Iterable[Any] | int, desc: str, enabled: bool = True) -> Any:
    """A tqdm progress bar on stderr that disappears when done.

    Args:
        iterable_or_total: What to iterate over, or a total to advance by hand
            with ``.update(n)``.
        desc: The label in front of the bar.
        enabled: ``False`` gives a silent bar with the same interface.

    Returns:
        A ``tqdm`` object: iterate over it, or call ``update``, ``set_postfix``
        and ``close`` (or use it in a ``with`` block).
    """
    if isinstance(iterable_or_total, int):
        return tqdm(total=iterable_or_total, desc=desc, disable=not enabled, leave=False)
    return tqdm(iterable_or_total, desc=desc, disable=not enabled, leave=False)
