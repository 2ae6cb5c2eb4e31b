"""Shared WebShop fixtures: one 1,000-product shop cached in a temporary folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentgym.envs.webshop import WebShopEnv, World, load_world


@pytest.fixture(scope="session")
def webshop_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private cache folder, so tests never touch ~/.cache."""
    return tmp_path_factory.mktemp("webshop-cache")


@pytest.fixture(scope="session")
def world(webshop_cache: Path) -> World:
    """The default shop: 1,000 generated products (seed 0)."""
    return load_world(num_products=1000, cache_dir=webshop_cache)


@pytest.fixture
def make_env(webshop_cache: Path, world: World) -> Callable[..., WebShopEnv]:
    """Build a WebShopEnv over the shared shop; keyword arguments override."""

    def make(**kwargs: Any) -> WebShopEnv:
        return WebShopEnv(cache_dir=webshop_cache, **kwargs)

    return make
