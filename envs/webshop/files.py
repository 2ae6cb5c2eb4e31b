"""WebShop's data files on disk: finding, reading and writing them, and the cache.

A data directory holds WebShop's files: ``items_shuffle*.json`` (required),
``items_ins_v2*.json`` (required), and optionally ``items_human_ins*.json``
and ``reviews*.json``. Generated catalogs are written in the same files under
the cache directory, so the real data and ours go through one loader.

The cache directory is, in order: the ``cache_dir`` argument, the
``AGENTGYM_WEBSHOP_CACHE`` environment variable, ``~/.cache/agentgym/webshop``.
Everything is written to a temporary sibling first and renamed into place, so
a crash or a concurrent writer never leaves a half-written entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.envs.webshop.catalog import WebShopDataError
from agentgym.envs.webshop.generator import GENERATOR_VERSION, RawCatalog

CACHE_ENV_VAR = "AGENTGYM_WEBSHOP_CACHE"

ITEMS_FILE = "items_shuffle.json"
ATTRIBUTES_FILE = "items_ins_v2.json"
HUMAN_FILE = "items_human_ins.json"
REVIEWS_FILE = "reviews.json"


@dataclass(frozen=True)
class DataFiles:
    """Paths of one set of WebShop data files."""

    items: Path
    attributes: Path
    human_instructions: Path | None
    reviews: Path | None


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory: ``cache_dir``, else ``$AGENTGYM_WEBSHOP_CACHE``, else ``~/.cache``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    from_env = os.environ.get(CACHE_ENV_VAR)
    if from_env:
        return Path(from_env).expanduser()
    return Path.home() / ".cache" / "agentgym" / "webshop"


def generated_dir(root: Path, num_products: int, seed: int) -> Path:
    """Where the generated catalog of this size and seed is cached."""
    return root / f"generated-v{GENERATOR_VERSION}-seed{seed}-n{num_products}"


def data_cache_dir(root: Path, files: DataFiles, num_products: int | None) -> Path:
    """Where derived data (the index) of user-given files is cached: keyed by path, size, mtime."""
    digest = hashlib.sha1()
    for path in (files.items, files.attributes):
        stat = path.stat()
        digest.update(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|".encode())
    digest.update(str(num_products).encode())
    return root / f"data-{digest.hexdigest()[:16]}"


def find_data_files(data_path: str | os.PathLike[str]) -> DataFiles:
    """Find WebShop's files in a directory.

    Args:
        data_path: A directory with ``items_shuffle*.json`` and ``items_ins_v2*.json``
            (for example WebShop's ``data/`` after its ``setup.sh``).

    Returns:
        The paths found.

    Raises:
        WebShopDataError: If the directory or a required file is missing, or a
            pattern matches several files.
    """
    directory = Path(data_path).expanduser()
    if not directory.is_dir():
        raise WebShopDataError(
            f"data_path={str(data_path)!r} is not a directory; point it at the folder holding "
            "WebShop's items_shuffle*.json and items_ins_v2*.json, or leave it unset to use "
            "the generated catalog"
        )

    def one(pattern: str, *, required: bool) -> Path | None:
        found = sorted(directory.glob(pattern))
        if len(found) > 1:
            raise WebShopDataError(
                f"{len(found)} files match {pattern!r} in {directory}: "
                f"{[p.name for p in found]}; keep one of them (or put it in its own folder)"
            )
        if not found and required:
            present = sorted(p.name for p in directory.glob("*.json"))
            raise WebShopDataError(
                f"no file matching {pattern!r} in {directory} (JSON files there: {present}); "
                "WebShop's data needs items_shuffle*.json and items_ins_v2*.json"
            )
        return found[0] if found else None

    items = one("items_shuffle*.json", required=True)
    attributes = one("items_ins_v2*.json", required=True)
    if items is None or attributes is None:  # unreachable: required=True raises instead
        raise WebShopDataError(f"WebShop's files are incomplete in {directory}")
    return DataFiles(
        items,
        attributes,
        one("items_human_ins*.json", required=False),
        one("reviews*.json", required=False),
    )


def _read_json(path: Path, expected: type) -> Any:
    try:
        with path.open(encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise WebShopDataError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, expected):
        raise WebShopDataError(
            f"{path} holds a JSON {type(value).__name__}, but WebShop's schema has a "
            f"{expected.__name__} there"
        )
    return value


def read_data_files(files: DataFiles) -> RawCatalog:
    """Read a set of WebShop data files.

    Raises:
        WebShopDataError: If a file cannot be read or has the wrong top-level type.
    """
    return RawCatalog(
        items=_read_json(files.items, list),
        attributes=_read_json(files.attributes, dict),
        human_instructions=_read_json(files.human_instructions, dict)
        if files.human_instructions
        else {},
        reviews=_read_json(files.reviews, list) if files.reviews else [],
    )


def write_data_files(raw: RawCatalog, directory: Path) -> DataFiles:
    """Write a catalog as WebShop's files into ``directory`` (created atomically).

    Returns:
        The paths written.
    """
    with atomic_directory(directory) as tmp:
        for name, value in (
            (ITEMS_FILE, raw.items),
            (ATTRIBUTES_FILE, raw.attributes),
            (HUMAN_FILE, raw.human_instructions),
            (REVIEWS_FILE, raw.reviews),
        ):
            with (tmp / name).open("w", encoding="utf-8") as f:
                json.dump(value, f, separators=(",", ":"))
    return find_data_files(directory)


@contextlib.contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """Yield a temporary directory that is renamed to ``target`` on success.

    If ``target`` appeared meanwhile (another process finished first), the
    temporary copy is discarded and ``target`` is kept.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
