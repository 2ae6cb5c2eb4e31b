"""The end-of-run summary of what the libraries logged
(:func:`agentgym.library_logging.library_logs` writes their records to a file in
:data:`agentgym.library_logging.LOG_FORMAT`): counts by level and the repeated messages,
most frequent first.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \d+ (?P<level>[A-Z]+) (?P<name>\S+): (?P<message>.*)$"
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SEVERITY = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")

EXPECTED = {
    ("vllm", "RotaryEmbedding: Failed to load weights"): (
        "expected at each weight sync: no checkpoint holds the rotary cache, and vLLM "
        "puts its own back"
    ),
}
"""Library warnings that every run of a kind logs, with why they are harmless; the
summary says so beside them. (vLLM's layerwise reload counts a rope layer's
``cos_sin_cache`` buffer as a tensor to load, finds none in the weights sent, and
places the buffer it had back.)"""


@dataclass(frozen=True)
class RepeatedMessage:
    """Records of one library at one level whose messages differ at most in numbers.

    Attributes:
        library: The logger's top-level name (``vllm``, ``torch``, ...).
        level: ``WARNING``, ``INFO``, ...
        message: The first of them.
        count: How many there were.
    """

    library: str
    level: str
    message: str
    count: int


class LibraryLogSummary:
    """What the libraries logged to ``path`` from byte ``offset`` on.

    It reads the file, not the records as they pass, so that records of child
    processes (vLLM's engine core) count too.

    Args:
        path: The log file, written in :data:`LOG_FORMAT`.
        offset: Where this run's records start (a resumed run appends).
    """

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset

    def messages(self) -> list[RepeatedMessage]:
        """Every kind of record, most frequent first (ties: the first logged first)."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as file:
            file.seek(self.offset)
            text = file.read().decode("utf-8", errors="replace")
        counts: Counter[tuple[str, str, str]] = Counter()
        first: dict[tuple[str, str, str], str] = {}
        for line in text.splitlines():
            match = _RECORD.match(line)
            if match is None:
                continue  # a continuation line of a multi-line record
            library = match["name"].split(".")[0]
            key = (library, match["level"], _NUMBER.sub("#", match["message"]))
            counts[key] += 1
            first.setdefault(key, match["message"])
        return [
            RepeatedMessage(library, level, first[key], count)
            for key, count in counts.most_common()
            for library, level, _ in [key]
        ]

    def counts(self) -> dict[str, int]:
        """Records per level, most severe first."""
        totals: Counter[str] = Counter()
        for message in self.messages():
            totals[message.level] += message.count
        return {level: totals[level] for level in _severity_order(totals)}

    def summary(self, top: int = 5) -> str:
        """A few lines for a person: the counts, the file, and the most repeated
        errors and warnings (up to ``top``), errors first; an :data:`EXPECTED` one says
        why it is harmless.

        Returns:
            Such as::

                library logs: 226 records (60 WARNING, 166 INFO) in out/libraries.log
                  60× vllm WARNING: RotaryEmbedding: Failed to load weights (expected ...)
                   2× vllm WARNING: libtcmalloc is not found in LD_PRELOAD. ...
        """
        counts = self.counts()
        if not counts:
            return f"library logs: none ({self.path})"
        total = sum(counts.values())
        by_level = ", ".join(f"{count} {level}" for level, count in counts.items())
        lines = [f"library logs: {total} records ({by_level}) in {self.path}"]
        notable = [m for m in self.messages() if m.level in ("CRITICAL", "ERROR", "WARNING")]
        notable.sort(key=lambda m: m.level == "WARNING")  # stable: errors first, counts kept
        width = len(str(max((m.count for m in notable[:top]), default=1)))
        for message in notable[:top]:
            text = message.message
            text = text if len(text) <= 100 else text[:99] + "…"
            line = f"  {message.count:>{width}}× {message.library} {message.level}: {text}"
            why = EXPECTED.get((message.library, message.message))
            lines.append(line if why is None else f"{line} ({why})")
        if len(notable) > top:
            lines.append(f"  ... {len(notable) - top} more kinds of warnings and errors")
        return "\n".join(lines)


def _severity_order(levels: Counter[str]) -> list[str]:
    known = [level for level in _SEVERITY if levels[level]]
    return known + sorted(level for level in levels if level not in _SEVERITY)
