"""Atomic file writes: a reader sees the old file or the new one, never a part."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any


def fsync_path(path: str | Path) -> None:
    """Flush a file's data (or a folder's entries) to disk through a read-only descriptor."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_dir(folder: str | Path) -> None:
    """Make a folder's entries (a rename into it) durable (POSIX; a no-op elsewhere)."""
    if os.name == "posix":
        fsync_path(folder)


def write_atomic(path: str | Path, data: bytes | str, *, tmp_prefix: str | None = None) -> None:
    """Write ``data`` to ``path`` through a synced temporary file in the same folder
    and :func:`os.replace`.

    Args:
        path: The destination file (its folder must exist).
        data: Bytes, or text written as UTF-8.
        tmp_prefix: The temporary file's name prefix (default ``.{name}.``).
    """
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(prefix=tmp_prefix or f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(payload)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(
    path: str | Path, obj: Any, *, indent: int | None = 2, default: Any = None
) -> None:
    """Write ``obj`` as JSON atomically (see :func:`write_atomic`).

    Args:
        path: The destination file (its folder must exist).
        obj: A JSON-serializable object.
        indent: JSON indentation; ``None`` for one line.
        default: ``json.dumps``'s fallback for other objects (e.g. ``str``).
    """
    write_atomic(path, json.dumps(obj, indent=indent, default=default) + "\n")


_MADE: dict[str, str] = {}
_MADE_LOCK = threading.Lock()


def new_folder(path: str) -> str:
    """A folder this process made: ``path``, or where another process made it first
    (the same command started in the same second), ``path-2``, ``path-3``, ... (each
    tried with :func:`os.mkdir`, which only one process can win). Asked again for the
    same ``path`` (a config is resolved more than once), the folder already made.

    ``agentgym train``'s default run folder goes through it (the ``new_folder``
    resolver: :func:`agentgym.command_line.own_run_folder`).
    """
    with _MADE_LOCK:
        if path not in _MADE:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            for attempt in itertools.count(1):
                candidate = path if attempt == 1 else f"{path}-{attempt}"
                with contextlib.suppress(FileExistsError):
                    os.mkdir(candidate)
                    _MADE[path] = candidate
                    break
        return _MADE[path]
