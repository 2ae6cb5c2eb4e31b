"""This machine's process tree, from /proc: for tests that check what a run leaves behind."""

from __future__ import annotations

from pathlib import Path


def parent_pids() -> dict[int, int]:
    """Every live process's parent: pid → parent pid."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone since the listing
            continue
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int, parents: dict[int, int] | None = None) -> set[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for child, parent in (parent_pids() if parents is None else parents).items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found
