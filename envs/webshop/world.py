"""Load a shop: the catalog (generated or from WebShop's files), its index and goals.

Building is cached twice: on disk (the generated files and the BM25 index,
see :mod:`agentgym.envs.webshop.files`) and in the process (envs made with
the same arguments share one :class:`World`, as an env manager's many envs do).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from agentgym.envs.webshop.catalog import Catalog, build_catalog
from agentgym.envs.webshop.files import (
    cache_root,
    data_cache_dir,
    find_data_files,
    generated_dir,
    read_data_files,
    write_data_files,
)
from agentgym.envs.webshop.generator import generate_catalog
from agentgym.envs.webshop.goals import GoalSet, WebShopConfigError
from agentgym.envs.webshop.search import INDEX_VERSION, SearchEngine


@dataclass(frozen=True)
class World:
    """Everything an episode reads and nothing it writes.

    Attributes:
        catalog: The products and their prices.
        engine: BM25 over the catalog.
        goals: All goals, in split order.
    """

    catalog: Catalog
    engine: SearchEngine
    goals: GoalSet


def load_world(
    *,
    num_products: int | None = 1000,
    catalog_seed: int = 0,
    data_path: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    goal_source: str = "synthetic",
    goal_seed: int = 233,
) -> World:
    """Load (or build and cache) a shop.

    Args:
        num_products: Catalog size; with ``data_path``, the first this many
            products of the file (None: all of them).
        catalog_seed: Seed of the generated catalog and of price draws.
        data_path: Folder with WebShop's real data files; None generates a catalog.
        cache_dir: Cache folder (default ``$AGENTGYM_WEBSHOP_CACHE`` or
            ``~/.cache/agentgym/webshop``).
        goal_source: ``"synthetic"`` or ``"human"``.
        goal_seed: Seed of price bounds and of the goal shuffle.

    Returns:
        The shop, shared with every other caller that passes the same arguments.

    Raises:
        WebShopConfigError: On a bad size or goal source.
        WebShopDataError: On missing or malformed data files.
    """
    if num_products is not None and num_products < 1:
        raise WebShopConfigError(
            f"num_products must be >= 1 (or None with data_path), got {num_products}"
        )
    if num_products is None and data_path is None:
        raise WebShopConfigError(
            "num_products=None (all products) needs data_path; the generated catalog needs a size"
        )
    root = cache_root(cache_dir).resolve()
    path = None if data_path is None else str(Path(data_path).expanduser().resolve())
    return _load(num_products, catalog_seed, path, str(root), goal_source, goal_seed)


@functools.lru_cache(maxsize=4)
def _load(
    num_products: int | None,
    catalog_seed: int,
    data_path: str | None,
    root: str,
    goal_source: str,
    goal_seed: int,
) -> World:
    catalog, index_dir = _catalog(num_products, catalog_seed, data_path, Path(root))
    engine = SearchEngine.load_or_build(catalog, index_dir)
    return World(catalog, engine, GoalSet(catalog, goal_source, goal_seed))


def _catalog(
    num_products: int | None, seed: int, data_path: str | None, root: Path
) -> tuple[Catalog, Path]:
    if data_path is not None:
        files = find_data_files(data_path)
        cache = data_cache_dir(root, files, num_products)
        raw = read_data_files(files)
    else:
        assert num_products is not None  # load_world rejects None without data_path
        cache = generated_dir(root, num_products, seed)
        if (cache / "items_shuffle.json").is_file():
            raw = read_data_files(find_data_files(cache))
        else:
            raw = generate_catalog(num_products, seed)
            write_data_files(raw, cache)
    catalog = build_catalog(
        raw.items,
        raw.attributes,
        reviews=raw.reviews,
        human_instructions=raw.human_instructions,
        num_products=num_products,
        price_seed=seed,
    )
    return catalog, cache / f"bm25-v{INDEX_VERSION}"
