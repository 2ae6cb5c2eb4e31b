"""The generated catalog, prices and goals, BM25 search and the on-disk cache."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentgym.envs.webshop.world as world_module
from agentgym.envs.webshop import (
    GENERATOR_VERSION,
    World,
    build_catalog,
    generate_catalog,
    load_world,
)
from agentgym.envs.webshop.catalog import Catalog, parse_pricing
from agentgym.envs.webshop.goals import NO_PRICE_BOUND, GoalSet, _combination, sample_price_upper
from agentgym.envs.webshop.search import SearchEngine, analyze, document_text
from agentgym.envs.webshop.vocab import CATEGORIES
from tests.envs.webshop.helpers import make_product

REQUIRED = {
    "asin",
    "name",
    "full_description",
    "small_description",
    "pricing",
    "customization_options",
    "category",
    "query",
    "product_category",
    "average_rating",
    "title_nouns",
}


def test_same_seed_same_catalog_other_seed_other_catalog() -> None:
    assert generate_catalog(200, seed=3) == generate_catalog(200, seed=3)
    assert generate_catalog(200, seed=3).items != generate_catalog(200, seed=4).items


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), size=st.integers(1, 80))
def test_generated_records_follow_webshop_schema(seed: int, size: int) -> None:
    raw = generate_catalog(size, seed)
    assert len(raw.items) == size
    asins = {item["asin"] for item in raw.items}
    assert len(asins) == size
    for item in raw.items:
        assert set(item) >= REQUIRED
        assert item["category"] in CATEGORIES
        assert len(item["product_category"].split(" › ")) >= 3
        assert parse_pricing(item["pricing"])[0][0] > 0
        assert all(len(values) >= 2 for values in item["customization_options"].values())
        assert item["name"].isascii() and item["full_description"].isascii()
        attributes = raw.attributes[item["asin"]]
        assert set(attributes["instruction_attributes"]) <= set(attributes["attributes"])
        original = item.get("near_duplicate_of")
        if original is not None:
            assert original in asins
    catalog = build_catalog(raw.items, raw.attributes, reviews=raw.reviews)
    assert len(catalog) == size


def test_default_catalog_has_variety_and_near_duplicates(world: World) -> None:
    products = world.catalog.products
    assert {p.category for p in products} == set(CATEGORIES)
    assert len({p.query for p in products}) == 50
    assert sum(bool(p.options) for p in products) > 0.9 * len(products)


@pytest.mark.parametrize(
    ("pricing", "prices", "tag"),
    [
        ("$19.99", (19.99,), "$19.99"),
        ("$19.99 - $27.99", (19.99, 27.99), "$19.99 to $27.99"),
        ("$1,299.00", (1299.0,), "$1299.0"),
        ("", (100.0,), "$100.0"),
        (None, (100.0,), "$100.0"),
    ],
)
def test_parse_pricing(pricing: str | None, prices: tuple[float, ...], tag: str) -> None:
    assert parse_pricing(pricing) == (prices, tag)


def test_price_upper_is_the_larger_of_two_of_the_next_four_tens() -> None:
    rng = np.random.default_rng(0)
    # $25: candidates $30, $40, $50, $60; the larger of two distinct draws is never $30.
    uppers = sample_price_upper(np.full(2000, 25.0), rng)
    assert set(uppers) == {40.0, 50.0, 60.0}
    assert np.mean(uppers == 60.0) == pytest.approx(0.5, abs=0.05)  # 3 of 6 pairs hold $60
    # $30 exactly: the candidates start strictly above it, at $40.
    assert set(sample_price_upper(np.full(500, 30.0), rng)) == {50.0, 60.0, 70.0}
    # $975: only $980 and $990 are left, so $990; $985: one candidate, no bound.
    assert set(sample_price_upper(np.array([975.0, 985.0]), rng)) == {990.0, NO_PRICE_BOUND}


def test_option_combinations_follow_itertools_product_over_sorted_names() -> None:
    product = make_product(options={"size": ("s", "m", "l"), "color": ("red", "blue")})
    combos = [_combination(product, i) for i in range(6)]
    assert combos[0] == {"color": "red", "size": "s"}
    assert combos[1] == {"color": "red", "size": "m"}
    assert combos[3] == {"color": "blue", "size": "s"}
    assert len({tuple(c.items()) for c in combos}) == 6


def test_synthetic_goals_count_and_splits(world: World) -> None:
    expected = sum(
        math.prod(len(v) for v in p.options.values())
        for p in world.catalog.products
        if p.instruction and p.instruction_attributes
    )
    goals = world.goals
    assert len(goals) == expected
    assert goals.split("test") == range(500)
    assert goals.split("eval") == range(500, 1500)
    assert goals.split("train") == range(1500, expected)
    goal = goals[0]
    product = world.catalog.by_asin(goal.asin)
    option_text = ", and ".join(f"{k}: {v}" for k, v in goal.options.items())
    assert goal.instruction.startswith(f"{product.instruction} with {option_text}")
    assert set(goal.options) == set(product.options)
    assert world.catalog.prices[world.catalog.index[goal.asin]] < goal.price_upper


def test_goal_order_is_seeded(world: World) -> None:
    same = GoalSet(world.catalog, seed=233)
    other = GoalSet(world.catalog, seed=1)
    assert [same[i].instruction for i in range(20)] == [
        world.goals[i].instruction for i in range(20)
    ]
    assert [other[i].instruction for i in range(20)] != [same[i].instruction for i in range(20)]


def test_document_text_is_what_webshop_indexes() -> None:
    product = make_product(
        title="Acme Tee", description="Soft cotton.", bullet_points=("Slim fit", "Tag free")
    )
    assert document_text(product) == (
        "acme tee soft cotton. slim fit color: black, navy blue, and size: large, x-large"
    )


def test_analyzer_drops_possessives_and_stop_words_and_stems() -> None:
    assert analyze("Men's Running Shoes for the Road, 10.5") == [
        "men",
        "run",
        "shoe",
        "road",
        "10.5",
    ]


def _catalog(titles: list[str]) -> Catalog:
    products = [
        make_product(asin=f"B00000000{i}", title=t, description="", bullet_points=("",), options={})
        for i, t in enumerate(titles)
    ]
    return Catalog(products, np.full(len(products), 20.0))


def test_bm25_scores_match_lucene_formula_by_hand() -> None:
    engine = SearchEngine.build(_catalog(["red shoe", "blue shoe shoe", "red hat"]))
    # N = 3 docs of 2, 3, 2 terms (avgdl 7/3); "shoe" is in 2 docs.
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    norm = [0.9 * (1 - 0.4 + 0.4 * dl / (7 / 3)) for dl in (2, 3)]
    expected = [idf * 1 / (1 + norm[0]), idf * 2 / (2 + norm[1]), 0.0]
    assert engine.scores("shoe") == pytest.approx(expected, rel=1e-6)
    assert engine.search("shoe") == [1, 0]  # no-match docs are never returned
    assert engine.search("shoe shoe")[0] == 1  # a repeated term counts twice
    assert engine.search("umbrella") == []


def test_equal_scores_keep_catalog_order() -> None:
    engine = SearchEngine.build(_catalog(["green mug", "plate", "green mug", "green mug"]))
    assert engine.search("green mug") == [0, 2, 3]
    assert engine.search("green mug", k=2) == [0, 2]


def test_cache_is_reused_and_written_atomically(tmp_path: Path, monkeypatch) -> None:
    first = load_world(num_products=120, catalog_seed=5, cache_dir=tmp_path)
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert entries == [f"generated-v{GENERATOR_VERSION}-seed5-n120"]
    assert sorted(p.name for p in (tmp_path / entries[0]).iterdir()) == [
        "bm25-v1",
        "items_human_ins.json",
        "items_ins_v2.json",
        "items_shuffle.json",
        "reviews.json",
    ]

    def no_generation(*args, **kwargs):
        raise AssertionError("the cached catalog should be read, not generated")

    monkeypatch.setattr(world_module, "generate_catalog", no_generation)
    world_module._load.cache_clear()
    again = load_world(num_products=120, catalog_seed=5, cache_dir=tmp_path)
    assert again is not first
    assert [p.asin for p in again.catalog.products] == [p.asin for p in first.catalog.products]
    np.testing.assert_array_equal(again.catalog.prices, first.catalog.prices)
    assert again.engine.search("shampoo") == first.engine.search("shampoo")


def test_env_var_sets_the_cache_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTGYM_WEBSHOP_CACHE", str(tmp_path / "from-env"))
    load_world(num_products=30, catalog_seed=9)
    entry = tmp_path / "from-env" / f"generated-v{GENERATOR_VERSION}-seed9-n30"
    assert (entry / "items_shuffle.json").is_file()
