"""Atomic checkpoint folders and RNG state capture.

A checkpoint is written into a hidden temporary folder, marked complete,
flushed to disk and only then renamed to ``checkpoint-{step}``; ``latest``
names the newest one. A crash or a kill at any point leaves the previous
complete checkpoint where :func:`latest_checkpoint` finds it. One process
writes into a checkpoint root at a time (on multi-process runs, rank 0).

Layout::

    root/
      latest                  # "checkpoint-30"
      checkpoint-20/          # ... whatever ``write`` put there, plus COMPLETE
      checkpoint-30/
      .tmp-checkpoint-40-x1/  # a save that was interrupted; removed by the next save
"""

from __future__ import annotations

import json
import logging
import operator
import os
import random
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym.fileio import fsync_dir, fsync_path, write_atomic

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"
"""File written last into a checkpoint folder; a folder without it is never loaded."""
LATEST_FILE = "latest"
"""Text file in the checkpoint root naming the newest complete checkpoint folder."""
CHECKPOINT_PREFIX = "checkpoint-"

_TMP_PREFIX = ".tmp-checkpoint-"
_OLD_PREFIX = ".old-checkpoint-"
_LATEST_TMP_PREFIX = ".latest-"
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")


def save_checkpoint(
    root: str | Path,
    step: int,
    write: Callable[[Path], None],
    *,
    keep_last: int | None = 2,
) -> Path:
    """Write a checkpoint atomically and make it the latest.

    ``write(tmp_dir)`` fills a temporary folder inside ``root``. Then a
    ``COMPLETE`` marker is added, every file and folder is fsynced, and the
    folder is renamed to ``root/checkpoint-{step}`` (an existing one of the
    same step is renamed away first and deleted after). ``root/latest`` is
    replaced atomically, then older checkpoints beyond ``keep_last`` and
    leftovers of interrupted saves are deleted.

    If ``write`` raises, its temporary folder is removed, the exception
    propagates and the previous checkpoint stays the latest.

    Args:
        root: The checkpoint root folder (created if missing).
        step: The training step the checkpoint holds (≥ 0).
        write: Writes the checkpoint's files into the folder it is given.
        keep_last: How many complete checkpoints to keep, the new one
            included; ``None`` keeps all.

    Returns:
        The final checkpoint folder, ``root/checkpoint-{step}``.

    Raises:
        ValueError: On a negative ``step`` or a ``keep_last`` below 1.
    """
    bad_step = ValueError(f"step must be an integer ≥ 0, got {step!r}")
    try:
        index = operator.index(step)  # numpy and torch integers too
    except TypeError:
        raise bad_step from None
    if isinstance(step, bool) or index < 0:
        raise bad_step
    step = index
    if keep_last is not None and keep_last < 1:
        raise ValueError(
            f"keep_last must be ≥ 1 (or None to keep every checkpoint), got {keep_last!r}"
        )
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{step}-", dir=root))
    try:
        write(tmp)
        _write_synced(tmp / COMPLETE_MARKER, json.dumps({"step": step}).encode())
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    final = root / f"{CHECKPOINT_PREFIX}{step}"
    old: Path | None = None
    if final.exists():
        # A directory cannot be renamed over a non-empty one: move the old
        # copy aside first. Until the next rename, `latest` may name a missing
        # folder and latest_checkpoint() falls back to the other checkpoints.
        old = root / f"{_OLD_PREFIX}{step}-{secrets.token_hex(4)}"
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(root)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _point_latest(root, final.name)
    _prune(root, keep=final, keep_last=keep_last)
    logger.info("Saved checkpoint %s", final)
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint in ``root``.

    ``root/latest`` is trusted when it names a complete checkpoint folder;
    otherwise the complete ``checkpoint-{step}`` folder with the highest step
    is returned. Temporary folders and folders without the ``COMPLETE``
    marker are never returned.

    Args:
        root: The checkpoint root folder.

    Returns:
        The checkpoint folder, or ``None`` when there is none (or no ``root``).
    """
    root = Path(root)
    if not root.is_dir():
        return None
    try:
        named = (root / LATEST_FILE).read_text().strip()
    except (OSError, UnicodeDecodeError):
        named = ""
    if _CHECKPOINT_NAME.fullmatch(named) and is_complete(root / named):
        return root / named
    complete = _complete_checkpoints(root)
    if named:
        logger.warning(
            "%s names %r, which is not a complete checkpoint; using %s",
            root / LATEST_FILE,
            named,
            complete[-1][1].name if complete else "none",
        )
    return complete[-1][1] if complete else None


def is_complete(path: str | Path) -> bool:
    """Whether ``path`` is a checkpoint folder whose save finished."""
    return (Path(path) / COMPLETE_MARKER).is_file()


def rng_state() -> dict[str, Any]:
    """Capture the global RNG states: Python ``random``, NumPy, torch CPU and CUDA.

    Returns:
        A dict of plain Python values and tensors that :func:`torch.save`
        writes and ``torch.load(..., weights_only=True)`` reads back; pass it
        to :func:`set_rng_state`. ``"cuda"`` is present only when CUDA is.
    """
    # Imported here so that the file utilities load without torch (fast in subprocesses).
    import numpy as np
    import torch

    numpy_state = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            # ndarray is not on torch.load's weights_only allow-list; a tensor is.
            "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore RNG states captured by :func:`rng_state`.

    Entries that are absent are left alone. CUDA states are restored for
    as many devices as both the state and this machine have.

    Args:
        state: The dict :func:`rng_state` returned (possibly through
            ``torch.save``/``torch.load``).
    """
    import numpy as np
    import torch

    if "python" in state:
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
    if "numpy" in state:
        saved = state["numpy"]
        np.random.set_state(
            {
                "bit_generator": saved["bit_generator"],
                "state": {
                    "key": np.asarray(saved["key"], dtype=np.int64).astype(np.uint32),
                    "pos": saved["pos"],
                },
                "has_gauss": saved["has_gauss"],
                "gauss": saved["gauss"],
            }
        )
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) != torch.cuda.device_count():
            logger.warning(
                "The RNG state holds %d CUDA devices, this machine has %d; restoring the first %d",
                len(cuda_states),
                torch.cuda.device_count(),
                min(len(cuda_states), torch.cuda.device_count()),
            )
        for device, cuda_state in enumerate(cuda_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete ``checkpoint-{step}`` folders, sorted by step."""
    found = []
    for path in root.iterdir():
        match = _CHECKPOINT_NAME.fullmatch(path.name)
        if match and path.is_dir() and is_complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def _point_latest(root: Path, name: str) -> None:
    write_atomic(root / LATEST_FILE, (name + "\n").encode(), tmp_prefix=_LATEST_TMP_PREFIX)


def _prune(root: Path, *, keep: Path, keep_last: int | None) -> None:
    """Delete older checkpoints beyond ``keep_last`` and leftovers of interrupted saves."""
    for path in root.iterdir():
        if path.name.startswith((_TMP_PREFIX, _OLD_PREFIX, _LATEST_TMP_PREFIX)):
            logger.info("Removing %s, left by an interrupted checkpoint save", path)
            _remove(path)
    if keep_last is None:
        return
    # The folder just written is kept even when older runs left higher steps.
    others = [path for _, path in reversed(_complete_checkpoints(root)) if path != keep]
    for path in others[keep_last - 1 :]:
        logger.info("Removing old checkpoint %s (keep_last=%d)", path, keep_last)
        _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _fsync_tree(folder: Path) -> None:
    """Flush every file and folder under ``folder`` (itself included) to disk."""
    for dirpath, _, filenames in os.walk(folder):
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            if os.path.islink(path):
                continue
            fsync_path(path)
        fsync_dir(Path(dirpath))
