"""Products as WebShop's engine sees them, built from records in WebShop's file schema.

The raw records are those of WebShop's data files: ``items_shuffle*.json``
(a list of products with ``asin``, ``name``, ``full_description``,
``small_description``, ``pricing``, ``customization_options``, ``category``,
``query``, ``product_category``, ...), ``items_ins_v2*.json`` (per asin:
``attributes``, ``instruction``, ``instruction_attributes``),
``items_human_ins.json`` (per asin: human instructions) and ``reviews.json``.
:func:`build_catalog` turns them into :class:`Product` objects the way
WebShop's ``load_products`` does: option names and values lowercased with
``/`` shown as ``" | "``, prices parsed from the pricing string, the first
``num_products`` records kept, bad or repeated asins skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.envs.webshop.normalize import normalize_option_value, to_ascii
from agentgym.envs.webshop.vocab import NON_NOUN_WORDS

DEFAULT_PRICE = 100.0


class WebShopDataError(ValueError):
    """WebShop data files are missing or not in WebShop's schema."""


class WebShopConfigError(ValueError):
    """A WebShop env option has a value that cannot work."""


@dataclass(frozen=True, slots=True)
class Review:
    """One product review (``reviews.json``)."""

    title: str
    score: float
    body: str


@dataclass(frozen=True, slots=True)
class HumanInstruction:
    """One ``items_human_ins``-style instruction for a product."""

    instruction: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Product:
    """A product as the shop engine and the reward see it.

    Attributes:
        asin: Amazon id, upper case (``B07XYZ1234``).
        title: The product name (``Title``).
        description: ``full_description`` (``Description``).
        bullet_points: ``small_description`` as a list (``BulletPoints``).
        pricing: One price or a ``(low, high)`` range, in dollars.
        price_tag: ``"$19.99"`` or ``"$19.99 to $27.99"``, as shown on pages.
        options: Option name -> values, lowercased, in page order.
        attributes: ``items_ins_v2`` attributes (``["DUMMY_ATTR"]`` when missing).
        category: One of WebShop's five categories.
        query: The collection query, lowercased and stripped.
        product_category: Breadcrumb joined with ``" › "``.
        rating: Average rating, or ``"N.A."``.
        reviews: Reviews shown on the Reviews page.
        title_nouns: Lowercased noun tokens of the title, for the type reward.
        instruction: ``items_ins_v2`` instruction (synthetic goals), or None.
        instruction_attributes: Attributes the instruction asks for.
        human_instructions: ``items_human_ins`` instructions.
    """

    asin: str
    title: str
    description: str
    bullet_points: tuple[str, ...]
    pricing: tuple[float, ...]
    price_tag: str
    options: dict[str, tuple[str, ...]]
    attributes: tuple[str, ...]
    category: str
    query: str
    product_category: str
    rating: str
    reviews: tuple[Review, ...] = ()
    title_nouns: frozenset[str] = field(default_factory=frozenset)
    instruction: str | None = None
    instruction_attributes: tuple[str, ...] = ()
    human_instructions: tuple[HumanInstruction, ...] = ()


@dataclass
class Catalog:
    """All products of a shop and the price each sells at.

    Attributes:
        products: The products, in file order.
        prices: ``[N]`` the price of each product: its single price, or a
            seeded uniform draw within its range (WebShop's
            ``generate_product_prices``); the reward compares it with the goal's
            ``price_upper``.
        index: asin -> position in ``products``.
    """

    products: list[Product]
    prices: np.ndarray  # [N] float64
    index: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.index = {p.asin: i for i, p in enumerate(self.products)}

    def __len__(self) -> int:
        return len(self.products)

    def by_asin(self, asin: str) -> Product:
        """The product with this asin (case-insensitive).

        Raises:
            KeyError: If no product has it.
        """
        return self.products[self.index[asin.upper()]]


def parse_pricing(pricing: str | None) -> tuple[tuple[float, ...], str]:
    """Parse a pricing string such as ``"$19.99 - $27.99"``.

    Args:
        pricing: The raw ``pricing`` field; empty or None means no price.

    Returns:
        ``(prices, price_tag)``: one price or the first two of a range, and the
        tag shown on pages. Without a price, WebShop's $100.0.
    """
    values = []
    for part in (pricing or "").split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            values.append(float(digits))
        except ValueError:
            continue
    if not values:
        return (DEFAULT_PRICE,), f"${DEFAULT_PRICE}"
    if len(values) == 1:
        return (values[0],), f"${values[0]}"
    return (values[0], values[1]), f"${values[0]} to ${values[1]}"


def heuristic_nouns(title: str) -> frozenset[str]:
    """Approximate the nouns spaCy finds in a title: alphabetic words minus known non-nouns.

    Used for real WebShop data, whose records carry no noun list (spaCy's
    models cannot be installed from PyPI).
    """
    words = re.findall(r"[a-z]+", to_ascii(title).lower())
    return frozenset(w for w in words if len(w) > 1 and w not in NON_NOUN_WORDS)


def build_catalog(
    items: Sequence[Mapping[str, Any]],
    attributes: Mapping[str, Mapping[str, Any]],
    *,
    reviews: Sequence[Mapping[str, Any]] = (),
    human_instructions: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    num_products: int | None = None,
    price_seed: int = 0,
) -> Catalog:
    """Build a catalog from records in WebShop's schema.

    Args:
        items: ``items_shuffle`` records.
        attributes: ``items_ins_v2``: asin -> ``attributes``, ``instruction``,
            ``instruction_attributes``.
        reviews: ``reviews.json`` records (``asin``, ``reviews``, ``average_rating``).
        human_instructions: ``items_human_ins``: asin -> instruction records.
        num_products: Keep the first this many records (all when None).
        price_seed: Seed of the draws that pick a price inside a price range.

    Returns:
        The catalog.

    Raises:
        WebShopDataError: If a record lacks a required field.
    """
    review_by_asin = {r["asin"]: r for r in reviews}
    human = human_instructions or {}
    products: list[Product] = []
    seen: set[str] = set()
    for position, item in enumerate(items[:num_products] if num_products else items):
        try:
            asin = str(item["asin"])
            if asin == "nan" or len(asin) > 10 or asin in seen:
                continue
            seen.add(asin)
            products.append(
                _product(
                    item, attributes.get(asin, {}), review_by_asin.get(asin), human.get(asin, ())
                )
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise WebShopDataError(
                f"items_shuffle record {position} (asin {item.get('asin')!r}) is not in "
                f"WebShop's schema: {type(exc).__name__}: {exc}. Required fields: asin, name, "
                "full_description, small_description, pricing, customization_options, "
                "category, query, product_category."
            ) from exc
    rng = np.random.default_rng(price_seed)
    low = np.array([p.pricing[0] for p in products], dtype=np.float64)
    high = np.array([p.pricing[-1] for p in products], dtype=np.float64)
    draws = rng.uniform(low, high) if len(products) else low
    prices = np.where(high > low, draws, low)
    return Catalog(products, prices)


def _product(
    item: Mapping[str, Any],
    attrs: Mapping[str, Any],
    review: Mapping[str, Any] | None,
    human: Sequence[Mapping[str, Any]],
) -> Product:
    title = str(item["name"])
    bullets = item["small_description"]
    bullet_points = tuple(bullets) if isinstance(bullets, list) else (str(bullets),)
    pricing, price_tag = parse_pricing(item.get("pricing"))
    options: dict[str, tuple[str, ...]] = {}
    for name, contents in (item.get("customization_options") or {}).items():
        if contents is None:
            continue
        options[name.lower()] = tuple(normalize_option_value(c["value"]) for c in contents)
    rating: Any = review.get("average_rating", "N.A.") if review else "N.A."
    if review is None and item.get("average_rating") is not None:
        rating = item["average_rating"]
    nouns = item.get("title_nouns")
    return Product(
        asin=str(item["asin"]).upper(),
        title=title,
        description=str(item["full_description"] or ""),
        bullet_points=bullet_points or ("",),
        pricing=pricing,
        price_tag=price_tag,
        options=options,
        attributes=tuple(attrs.get("attributes") or ("DUMMY_ATTR",)),
        category=str(item["category"]),
        query=str(item["query"]).lower().strip(),
        product_category=str(item["product_category"]),
        rating=str(rating),
        reviews=tuple(_review(r) for r in (review or {}).get("reviews", ())),
        title_nouns=frozenset(nouns) if nouns is not None else heuristic_nouns(title),
        instruction=attrs.get("instruction"),
        instruction_attributes=tuple(attrs.get("instruction_attributes") or ()),
        human_instructions=tuple(
            HumanInstruction(
                instruction=str(h["instruction"]),
                attributes=tuple(h.get("instruction_attributes") or ()),
                options=tuple(h.get("instruction_options") or ()),
            )
            for h in human
        ),
    )


def _review(record: Mapping[str, Any]) -> Review:
    score = record.get("score", record.get("stars", 0))
    try:
        value = float(score)
    except (TypeError, ValueError):
        value = 0.0
    return Review(
        str(record.get("title", "")), value, str(record.get("body", record.get("review", "")))
    )
