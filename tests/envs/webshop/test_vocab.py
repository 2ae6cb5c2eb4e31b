"""The vocabulary tables read from ``vocab.json``: their shape and their types."""

from __future__ import annotations

from collections import Counter

from agentgym.envs.webshop.vocab import (
    BRAND_SYLLABLES,
    CATEGORIES,
    NON_NOUN_WORDS,
    OPTION_POOLS,
    PRODUCT_TYPES,
)


def test_each_category_has_ten_product_types_that_sell_in_known_option_pools() -> None:
    assert Counter(t.category for t in PRODUCT_TYPES) == dict.fromkeys(CATEGORIES, 10)
    assert len({t.query for t in PRODUCT_TYPES}) == len(PRODUCT_TYPES)
    for kind in PRODUCT_TYPES:
        assert set(kind.options) <= set(OPTION_POOLS), kind.query
        low, high = kind.price
        assert 0 < low < high, kind.query


def test_the_tables_load_as_tuples_of_strings() -> None:
    shampoo = PRODUCT_TYPES[0]
    assert shampoo.breadcrumb == (
        "Beauty & Personal Care",
        "Hair Care",
        "Shampoo & Conditioner",
        "Shampoos",
    )
    assert shampoo.options == ("volume", "scent")
    assert shampoo.price == (6.0, 38.0)
    assert all(isinstance(p, float) for t in PRODUCT_TYPES for p in t.price)
    assert OPTION_POOLS["pack"] == (
        "Item Package Quantity",
        ("1", "2", "3", "4", "6", "8", "12", "24"),
    )
    assert hash(shampoo)  # frozen, with tuple fields: usable as a key
    assert isinstance(BRAND_SYLLABLES, tuple)  # random.sample needs a sequence
    assert "wireless" in NON_NOUN_WORDS
