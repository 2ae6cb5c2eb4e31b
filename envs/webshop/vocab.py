"""Vocabularies of the synthetic WebShop catalog: product types, attributes, options.

Each category (WebShop's five: beauty, fashion, garden, electronics, grocery)
has ten product types. A type is one search ``query`` of the original data
collection, with its Amazon-style breadcrumb, the head nouns its titles use,
the attribute phrases its products may have, the option kinds it sells in and
a price range. Attribute phrases are chosen so that no two of one type are
fuzzy matches of each other (the reward's ``token_set_ratio > 85``), which is
what makes near-duplicate products distinguishable by reading.

The words live in ``vocab.json`` beside this module (read once, at import);
this module gives them their types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATEGORIES = ("beauty", "fashion", "garden", "electronics", "grocery")
"""WebShop's five categories ("garden" holds home & kitchen, patio and garden)."""


@dataclass(frozen=True)
class ProductType:
    """One product type (one WebShop ``query``).

    Attributes:
        category: One of :data:`CATEGORIES`.
        query: The search query the products were collected with.
        breadcrumb: ``product_category`` parts, outermost first.
        heads: Head noun phrases for titles (every word a noun).
        attributes: Attribute phrases products of this type may have.
        options: Keys of :data:`OPTION_POOLS` the products sell in.
        price: ``(low, high)`` dollars.
    """

    category: str
    query: str
    breadcrumb: tuple[str, ...]
    heads: tuple[str, ...]
    attributes: tuple[str, ...]
    options: tuple[str, ...]
    price: tuple[float, float]


_DATA: dict[str, Any] = json.loads(
    Path(__file__).with_name("vocab.json").read_text(encoding="utf-8")
)


def _product_type(record: dict[str, Any]) -> ProductType:
    low, high = record["price"]
    return ProductType(
        category=record["category"],
        query=record["query"],
        breadcrumb=tuple(record["breadcrumb"]),
        heads=tuple(record["heads"]),
        attributes=tuple(record["attributes"]),
        options=tuple(record["options"]),
        price=(low, high),
    )


OPTION_POOLS: dict[str, tuple[str, tuple[str, ...]]] = {
    key: (pool["name"], tuple(pool["values"])) for key, pool in _DATA["option_pools"].items()
}
"""Option kinds: the name shown on the page and the values products choose from."""

PRODUCT_TYPES: tuple[ProductType, ...] = tuple(map(_product_type, _DATA["product_types"]))
"""Ten product types per category."""

MATERIALS: tuple[str, ...] = tuple(_DATA["materials"])
"""Marketing adjectives used in descriptions (never attributes or options)."""

BRAND_SYLLABLES: tuple[str, ...] = tuple(_DATA["brand_syllables"])
"""Syllables combined into brand names (proper nouns, as spaCy would tag them)."""

NON_NOUN_WORDS = frozenset(_DATA["non_noun_words"])
"""Words the noun heuristic for real data never counts as nouns."""
