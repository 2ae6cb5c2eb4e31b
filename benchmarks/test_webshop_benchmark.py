"""WebShop speed with pytest-benchmark: catalog build + index, search, env steps.

At 1,000 and 100,000 products. The anchor is the issue's goal (search p50
at most 20 ms at 100,000 products on a 2-core machine); WebShop itself needs
Java and its downloaded data, so it cannot run here. The 100,000-product
build runs once (about 20 s); the shops are built once per session in a
temporary cache.

    python -m pytest benchmarks/test_webshop_benchmark.py --benchmark-only -p no:cacheprovider
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from dry import sized
from pytest_benchmark.fixture import BenchmarkFixture

from agentgym.envs.webshop import (
    SearchEngine,
    WebShopEnv,
    World,
    build_catalog,
    generate_catalog,
    load_world,
)

SIZES = sized([1000, 100_000], [200])


@pytest.fixture(scope="session")
def webshop_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("webshop-bench")


@pytest.fixture(scope="session", params=SIZES, ids=lambda n: f"{n}products")
def shop(request: pytest.FixtureRequest, webshop_cache: Path) -> World:
    return load_world(num_products=request.param, cache_dir=webshop_cache)


def _build(num_products: int) -> SearchEngine:
    raw = generate_catalog(num_products, 0)
    catalog = build_catalog(raw.items, raw.attributes, reviews=raw.reviews)
    return SearchEngine.build(catalog)


@pytest.mark.parametrize("num_products", SIZES, ids=lambda n: f"{n}products")
def test_catalog_build_and_index(benchmark: BenchmarkFixture, num_products: int) -> None:
    benchmark.group = "webshop build + index"
    if num_products > 10_000:
        engine = benchmark.pedantic(_build, args=(num_products,), rounds=1, iterations=1)
    else:
        engine = benchmark(_build, num_products)
    assert engine.num_docs == num_products


def test_search(benchmark: BenchmarkFixture, shop: World) -> None:
    benchmark.group = f"webshop search ({len(shop.catalog)} products)"
    queries = itertools.cycle(
        [shop.goals[i].instruction.lower() for i in range(min(1000, len(shop.goals)))]
    )
    results = benchmark(lambda: shop.engine.search(next(queries)))
    assert len(results) == 50


def _oracle_steps(env: WebShopEnv) -> Iterator[None]:
    for index in itertools.cycle(range(len(env.goal_positions))):
        env.reset(options={"goal_index": index})
        done = False
        while not done:
            *_, terminated, truncated, _ = env.step(env.oracle_response())
            done = terminated or truncated
            yield None


def test_env_step(benchmark: BenchmarkFixture, shop: World, webshop_cache: Path) -> None:
    benchmark.group = f"webshop oracle env step ({len(shop.catalog)} products)"
    env = WebShopEnv(num_products=len(shop.catalog), cache_dir=webshop_cache, split="eval")
    steps = _oracle_steps(env)
    benchmark(lambda: next(steps))
    assert env.num_steps >= 1
