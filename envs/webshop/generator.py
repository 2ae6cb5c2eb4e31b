"""A synthetic WebShop catalog, written in WebShop's own file schema.

No WebShop data can be downloaded here, so :func:`generate_catalog` makes
products of the same shape: ``items_shuffle`` records (asin, name,
full_description, small_description, pricing such as ``"$19.99 - $27.99"``,
customization_options, category, query, product_category joined with ``›``,
average_rating), ``items_ins_v2`` attributes and instructions,
``items_human_ins``-style instructions and ``reviews``. Products are drawn
from :mod:`agentgym.envs.webshop.vocab` (five categories, ten queries each,
attribute and option vocabularies per query).

About a third of the products get a *near duplicate*: a sibling of the same
brand and kind that differs in one attribute the instruction asks for, or
sells one option in values that WebShop's fuzzy match tells apart from all of
the original's option values (``token_set_ratio`` <= 85: not "12 inch" beside
"24 inch", which score 86). The generator checks, with the reward's own
matching rules, that buying the sibling cannot satisfy the original's
instructions (and the other way round); a sibling that fails the check is
dropped. Each record also carries ``title_nouns`` (the generator
knows which title words are nouns; spaCy is not available) and, for
siblings, ``near_duplicate_of``.

The same ``(num_products, seed)`` gives the same catalog on any machine
(a private ``random.Random``; :data:`GENERATOR_VERSION` changes whenever the
output would).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from thefuzz import fuzz  # type: ignore[import-untyped]  # no stubs; mypy config is shared

from agentgym.envs.webshop.normalize import (
    normalize_color,
    normalize_option_value,
)
from agentgym.envs.webshop.reward import FUZZY_THRESHOLD
from agentgym.envs.webshop.text_templates import (
    bullet_point,
    description,
    human_instruction,
    instruction,
    review,
)
from agentgym.envs.webshop.vocab import (
    BRAND_SYLLABLES,
    CATEGORIES,
    OPTION_POOLS,
    PRODUCT_TYPES,
    ProductType,
)

GENERATOR_VERSION = 3
"""Bumped whenever generated catalogs change; part of the cache key.

3: near duplicates told apart by WebShop's own option rule (sizes fuzzy,
goal options against every chosen value). 2: by agentgym's former rule.
"""

_ASIN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@dataclass
class RawCatalog:
    """A catalog as WebShop's data files hold it.

    Attributes:
        items: ``items_shuffle`` records.
        attributes: ``items_ins_v2``: asin -> attributes and instruction.
        human_instructions: ``items_human_ins``: asin -> instruction records.
        reviews: ``reviews.json`` records.
    """

    items: list[dict[str, Any]] = field(default_factory=list)
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    human_instructions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    reviews: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Draft:
    """A product before it is written out."""

    kind: ProductType
    brand: str
    head: str
    attributes: list[str]
    wanted: list[str]  # the attributes its instruction asks for
    options: dict[str, list[str]]  # option name as shown -> values as shown
    low: float
    high: float | None
    title_attribute: str
    near_duplicate_of: str | None = None


def generate_catalog(
    num_products: int = 1000, seed: int = 0, *, near_duplicate_rate: float = 0.35
) -> RawCatalog:
    """Generate ``num_products`` products in WebShop's schema.

    Args:
        num_products: How many products (near duplicates included).
        seed: Seed; the same seed gives the same catalog.
        near_duplicate_rate: Chance that a product is followed by a near duplicate.

    Returns:
        The records, shuffled as ``items_shuffle`` is.

    Raises:
        ValueError: If ``num_products < 1`` or the rate is outside [0, 1].
    """
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    if not 0.0 <= near_duplicate_rate <= 1.0:
        raise ValueError(f"near_duplicate_rate must be in [0, 1], got {near_duplicate_rate}")
    rng = random.Random(f"agentgym-webshop-{GENERATOR_VERSION}-{seed}")
    brands = {c: _brands(rng, 40) for c in CATEGORIES}
    by_category = {c: [t for t in PRODUCT_TYPES if t.category == c] for c in CATEGORIES}
    raw = RawCatalog()
    asins: set[str] = set()
    while len(raw.items) < num_products:
        kind = rng.choice(by_category[rng.choice(CATEGORIES)])
        draft = _draft(rng, kind, rng.choice(brands[kind.category]))
        asin = _write(rng, draft, raw, asins)
        if len(raw.items) < num_products and rng.random() < near_duplicate_rate:
            sibling = _near_duplicate(rng, draft)
            if sibling is not None:
                sibling.near_duplicate_of = asin
                _write(rng, sibling, raw, asins)
    rng.shuffle(raw.items)
    return raw


def _brands(rng: random.Random, n: int) -> list[str]:
    names: set[str] = set()
    while len(names) < n:
        parts = rng.sample(BRAND_SYLLABLES, rng.choice((2, 2, 3)))
        names.add("".join(parts).capitalize())
    return sorted(names)


def _draft(rng: random.Random, kind: ProductType, brand: str) -> _Draft:
    attributes = rng.sample(kind.attributes, rng.randint(3, 5))
    wanted = attributes[: rng.randint(1, min(3, len(attributes)))]
    options: dict[str, list[str]] = {}
    for pool in kind.options:
        if rng.random() < 0.85:
            name, values = OPTION_POOLS[pool]
            picked = set(rng.sample(range(len(values)), rng.randint(2, min(5, len(values)))))
            options[name] = [v for i, v in enumerate(values) if i in picked]
    low = round(rng.uniform(*kind.price), 2)
    high = round(low * rng.uniform(1.1, 1.6), 2) if rng.random() < 0.3 else None
    head = rng.choice(kind.heads)
    # No "Fine Hair Hair Shampoo": the title's attribute shares no word with the head.
    fitting = [a for a in attributes if not set(a.split()) & set(head.split())] or attributes
    return _Draft(
        kind, brand, head, attributes, wanted, options, low, high,
        title_attribute=rng.choice(fitting),
    )  # fmt: skip


def _near_duplicate(rng: random.Random, draft: _Draft) -> _Draft | None:
    """A sibling differing in one wanted attribute or one option's values, or None."""
    sibling = _Draft(**{**draft.__dict__, "options": dict(draft.options)})
    sibling.attributes = list(draft.attributes)
    sibling.wanted = list(draft.wanted)
    if draft.options and rng.random() < 0.5:
        name = rng.choice(sorted(draft.options))
        pool = next(v for n, v in (OPTION_POOLS[p] for p in draft.kind.options) if n == name)
        taken = [_normalized(v) for v in draft.options[name]]
        # WebShop matches each goal option against every chosen value, whatever its
        # name ("8" matches "8 ounce"), so the new values must differ from the other
        # options' values too; sizes are fuzzy as well ("12 inch" matches "24 inch").
        others = [_normalized(v) for n, vs in draft.options.items() if n != name for v in vs]
        if not all(_distinct(t, others) for t in taken):
            return None
        free = [v for v in pool if _distinct(_normalized(v), taken + others)]
        if len(free) < 2:
            return None
        sibling.options[name] = rng.sample(free, min(len(free), rng.randint(2, 4)))
        return sibling
    # The removed attribute must not fuzzy-match the ones the sibling keeps
    # ("uv resistant" vs "burst resistant" scores 86), nor the added one the original's.
    removable = [w for w in draft.wanted if _distinct(w, [a for a in draft.attributes if a != w])]
    if not removable:
        return None
    removed = rng.choice(removable)
    unused = [a for a in draft.kind.attributes if a not in draft.attributes]
    candidates = [a for a in unused if _distinct(a, draft.attributes)]
    if not candidates:
        return None
    added = rng.choice(candidates)
    swap = {removed: added}
    sibling.attributes = [swap.get(a, a) for a in draft.attributes]
    sibling.wanted = [swap.get(a, a) for a in draft.wanted]
    sibling.title_attribute = swap.get(draft.title_attribute, draft.title_attribute)
    if _mentions(sibling, removed) or _mentions(draft, added):
        return None
    return sibling


def _normalized(value: str) -> str:
    """An option value as the reward compares it."""
    return normalize_color(normalize_option_value(value))


def _distinct(value: str, others: list[str]) -> bool:
    """Whether no WebShop fuzzy match links ``value`` with any of ``others``."""
    return all(fuzz.token_set_ratio(value, o) <= FUZZY_THRESHOLD for o in others)


def _mentions(draft: _Draft, phrase: str) -> bool:
    """Whether ``phrase`` is in the draft's title, bullets or description (lowercased)."""
    text = " ".join([_title(draft), description(draft.brand, draft.head, draft.attributes)])
    text += " " + " ".join(bullet_point(a, draft.head) for a in draft.attributes)
    return phrase in text.lower()


def _title(draft: _Draft) -> str:
    return f"{draft.brand} {draft.title_attribute.title()} {draft.head.title()}"


def _write(rng: random.Random, draft: _Draft, raw: RawCatalog, asins: set[str]) -> str:
    asin = "B0" + "".join(rng.choices(_ASIN_CHARS, k=8))
    while asin in asins:
        asin = "B0" + "".join(rng.choices(_ASIN_CHARS, k=8))
    asins.add(asin)
    kind = draft.kind
    pricing = f"${draft.low:.2f}" + (f" - ${draft.high:.2f}" if draft.high else "")
    item: dict[str, Any] = {
        "asin": asin,
        "name": _title(draft),
        "full_description": description(draft.brand, draft.head, draft.attributes),
        "small_description": [bullet_point(a, draft.head) for a in draft.attributes],
        "pricing": pricing,
        "images": [f"images/{asin}.jpg"],
        "customization_options": {
            name: [{"value": v, "image": None, "is_selected": False} for v in values]
            for name, values in draft.options.items()
        },
        "category": kind.category,
        "query": kind.query,
        "product_category": " › ".join(kind.breadcrumb),
        "average_rating": f"{rng.uniform(3.0, 5.0):.1f} out of 5 stars",
        "title_nouns": sorted({draft.brand.lower(), *draft.head.replace("-", " ").split()}),
    }
    if draft.near_duplicate_of:
        item["near_duplicate_of"] = draft.near_duplicate_of
    raw.items.append(item)
    raw.attributes[asin] = {
        "attributes": list(draft.attributes),
        "instruction": instruction(rng, kind.query, draft.wanted),
        "instruction_attributes": list(draft.wanted),
    }
    lowered = {
        n.lower(): [normalize_option_value(v) for v in vs] for n, vs in draft.options.items()
    }
    chosen = {n: rng.choice(vs) for n, vs in lowered.items()}
    raw.human_instructions[asin] = [
        {
            "asin": asin,
            "instruction": human_instruction(rng, draft.head, draft.wanted, chosen),
            "instruction_attributes": list(draft.wanted),
            "instruction_options": list(chosen.values()),
        }
    ]
    raw.reviews.append(
        {
            "asin": asin,
            "average_rating": item["average_rating"].split()[0],
            "reviews": [review(rng, draft.head) for _ in range(rng.randint(0, 3))],
        }
    )
    return asin
