"""The benchmark scripts' figures as a Markdown table, the form benchmarks/README.md quotes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def print_table(header: Sequence[str], rows: Iterable[Sequence[str]], labels: int = 1) -> None:
    """Print ``header`` and ``rows`` as a Markdown table.

    Args:
        header: The column titles.
        rows: One sequence of formatted cells a row, as many as ``header`` has.
        labels: How many leading columns are labels (left-aligned); the rest are
            figures (right-aligned).
    """
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join(["---"] * labels + ["---:"] * (len(header) - labels)) + " |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
