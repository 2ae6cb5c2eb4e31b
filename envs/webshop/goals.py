"""Goals (instructions to shop for) and WebShop's train/eval/test splits.

Synthetic goals are WebShop's ``get_synthetic_goals``: for every product with
an ``items_ins_v2`` instruction, one goal per combination of its option
values (``"... with color: black, and size: large"``). Human goals come from
``items_human_ins``. Each product gets a ``price_upper`` as WebShop samples
it: of the first four multiples of $10 above its price, the larger of two
drawn at random (``", and price lower than 40.00 dollars"``), or no bound
(1,000,000) when fewer than two are left. Goals are then shuffled with a
fixed seed (WebShop's 233) and split by position: test 0-499, eval 500-1499,
train the rest.

Goals are materialized on demand: 100,000 products make about a million
synthetic goals, and only their indices are kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentgym.envs.webshop.catalog import Catalog, Product, WebShopConfigError
from agentgym.envs.webshop.reward import GoalSpec
from agentgym.errors import did_you_mean

NO_PRICE_BOUND = 1_000_000.0
PRICE_STEPS = 99  # WebShop's PRICE_RANGE: $10, $20, ..., $990
SPLITS: dict[str, tuple[int, int | None]] = {
    "test": (0, 500),
    "eval": (500, 1500),
    "train": (1500, None),
    "all": (0, None),
}
"""Split name -> goal positions ``[start, stop)``; None is the end."""

GOAL_SOURCES = ("synthetic", "human")


@dataclass(frozen=True)
class Goal:
    """One shopping task.

    Attributes:
        asin: The product the instruction was written for.
        instruction: What the shopper is told.
        attributes: Attributes the instruction asks for.
        options: Option name -> value it asks for.
        price_upper: The most the shopper will pay.
        spec: What the reward compares a purchase with.
    """

    asin: str
    instruction: str
    attributes: tuple[str, ...]
    options: dict[str, str]
    price_upper: float
    spec: GoalSpec

    def to_info(self) -> dict[str, Any]:
        """The goal for ``info["goal"]``: asin, instruction, attributes, options, price_upper."""
        return {
            "asin": self.asin,
            "instruction": self.instruction,
            "attributes": list(self.attributes),
            "options": dict(self.options),
            "price_upper": self.price_upper,
        }


def sample_price_upper(prices: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``[N]`` WebShop's ``price_upper`` for products at ``prices`` (``[N]``).

    Of the (at most four) multiples of $10 strictly above the price, two
    distinct ones are drawn and the larger kept; with fewer than two,
    :data:`NO_PRICE_BOUND`.
    """
    first = np.floor(prices / 10.0).astype(np.int64) + 1  # [N] smallest step above the price
    count = np.clip(PRICE_STEPS - first + 1, 0, 4)  # [N]
    draws = rng.random((len(prices), 2))  # [N, 2]
    a = np.floor(draws[:, 0] * count).astype(np.int64)
    b = np.floor(draws[:, 1] * np.maximum(count - 1, 1)).astype(np.int64)
    b = np.where(b >= a, b + 1, b)  # two distinct positions
    upper = 10.0 * (first + np.maximum(a, b))
    return np.where(count >= 2, upper, NO_PRICE_BOUND)


def _price_text(price_upper: float) -> str:
    return (
        "" if price_upper >= NO_PRICE_BOUND else f", and price lower than {price_upper:.2f} dollars"
    )


def _spec(
    product: Product,
    attributes: tuple[str, ...],
    options: tuple[tuple[str, str], ...],
    upper: float,
) -> GoalSpec:
    return GoalSpec(
        attributes, options, upper, product.query, product.product_category, product.title_nouns
    )


class GoalSet:
    """All goals of a catalog, in WebShop's shuffled order.

    Args:
        catalog: The shop's catalog.
        source: ``"synthetic"`` (instructions × option combinations) or ``"human"``.
        seed: Seed of the price bounds and of the shuffle (WebShop uses 233).

    Raises:
        WebShopConfigError: If ``source`` is unknown.
    """

    def __init__(self, catalog: Catalog, source: str = "synthetic", seed: int = 233) -> None:
        if source not in GOAL_SOURCES:
            raise WebShopConfigError(
                f"goal_source={source!r} is not supported; valid options: {list(GOAL_SOURCES)}"
            )
        self.catalog = catalog
        self.source = source
        rng = np.random.default_rng(seed)
        products: list[int] = []  # goal entry -> product position
        subs: list[int] = []  # goal entry -> option combination or human instruction
        for i, p in enumerate(catalog.products):
            if source == "synthetic":
                if p.instruction and p.instruction_attributes:
                    count = math.prod(len(v) for v in p.options.values())
                    products.extend([i] * count)
                    subs.extend(range(count))
            else:
                for j, h in enumerate(p.human_instructions):
                    if h.attributes:
                        products.append(i)
                        subs.append(j)
        self._product = np.asarray(products, dtype=np.int64)  # [G]
        self._sub = np.asarray(subs, dtype=np.int64)  # [G]
        if source == "synthetic":  # one bound per product, shared by its combinations
            self._upper = sample_price_upper(catalog.prices, rng)[self._product]  # [G]
        else:  # one bound per instruction
            self._upper = sample_price_upper(catalog.prices[self._product], rng)  # [G]
        self._order = rng.permutation(len(self._product))  # [G] shuffled position -> entry

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, position: int) -> Goal:
        entry = int(self._order[position])
        product = self.catalog.products[int(self._product[entry])]
        sub = int(self._sub[entry])
        upper = float(self._upper[entry])
        if self.source == "synthetic":
            options = _combination(product, sub)
            option_text = ", and ".join(f"{k}: {v}" for k, v in options.items())
            text = f"{product.instruction}{' with ' + option_text if option_text else ''}"
            attributes = product.instruction_attributes
        else:
            human = product.human_instructions[sub]
            options = _name_options(product, human.options)
            text = human.instruction.strip(".")
            attributes = human.attributes
        spec = _spec(product, attributes, tuple(options.items()), upper)
        return Goal(product.asin, text + _price_text(upper), attributes, options, upper, spec)

    def split(self, name: str) -> range:
        """Goal positions of a split: ``test`` 0-499, ``eval`` 500-1499, ``train`` the rest.

        Raises:
            WebShopConfigError: If the split is unknown or has no goals here.
        """
        if name not in SPLITS:
            hint = did_you_mean(name, SPLITS)
            raise WebShopConfigError(f"Unknown split {name!r}.{hint} Valid options: {list(SPLITS)}")
        start, stop = SPLITS[name]
        positions = range(start, len(self) if stop is None else min(stop, len(self)))
        if not positions:
            raise WebShopConfigError(
                f"split {name!r} (goals {start}-{'end' if stop is None else stop - 1}) is empty: "
                f"this catalog has {len(self)} {self.source} goals. Use more products "
                "(num_products) or split='all'."
            )
        return positions


def _combination(product: Product, index: int) -> dict[str, str]:
    """The ``index``-th option combination (itertools.product order over sorted names)."""
    names = sorted(product.options)
    chosen: dict[str, str] = {}
    for name in reversed(names):  # last name varies fastest
        values = product.options[name]
        index, pick = divmod(index, len(values))
        chosen[name] = values[pick]
    return {name: chosen[name] for name in names}


def _name_options(product: Product, values: tuple[str, ...]) -> dict[str, str]:
    """Give human-goal option values the product's option names (``option N`` if not found)."""
    named: dict[str, str] = {}
    for i, value in enumerate(values):
        name = next((n for n, vs in product.options.items() if value in vs), f"option {i + 1}")
        named[name if name not in named else f"{name} {i + 1}"] = value
    return named
