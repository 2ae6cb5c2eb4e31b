"""Questions about a generated shop, each with its gold SQL, and result-set comparison.

A template draws its parameters from the shop's rows and returns the question
and a gold query, or None when this shop makes the question degenerate (an
empty answer, a tie for "the most"); :func:`make_question` then tries another.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentgym.envs.tools.sql.database import ShopData


@dataclass(frozen=True)
class SQLQuestion:
    """A question with its gold query.

    Attributes:
        kind: The template's name (a key of :data:`TEMPLATES`).
        question: The question text.
        gold_sql: A query whose result set is the answer.
    """

    kind: str
    question: str
    gold_sql: str


Drawn = tuple[str, str] | None
"""What a template draws: the question and its gold query, or None (degenerate here)."""


def _choice(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def _city(rng: np.random.Generator, shop: ShopData) -> str:
    """A city where some customer lives."""
    return str(_choice(rng, sorted({c[2] for c in shop.customers})))


def _category(rng: np.random.Generator, shop: ShopData) -> str:
    """A category that some product is in."""
    return str(_choice(rng, sorted({p[2] for p in shop.products})))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def count_city(rng: np.random.Generator, shop: ShopData) -> Drawn:
    city = _city(rng, shop)
    return (
        f"How many customers live in {city}?",
        f"SELECT COUNT(*) FROM customers WHERE city = {_quote(city)}",
    )


def pricey_products(rng: np.random.Generator, shop: ShopData) -> Drawn:
    category = _category(rng, shop)
    prices = sorted(p[3] for p in shop.products if p[2] == category)
    threshold = prices[(len(prices) - 1) // 2] - 0.01  # at least half of them are above
    return (
        f"List the names of the products in the {category!r} category that cost more than "
        f"{threshold:.2f}.",
        f"SELECT name FROM products WHERE category = {_quote(category)} "
        f"AND price > {threshold:.2f}",
    )


def units_ordered(rng: np.random.Generator, shop: ShopData) -> Drawn:
    live = {o[0] for o in shop.orders if o[3] != "cancelled"}
    ordered = sorted({i[1] for i in shop.order_items if i[0] in live})
    if not ordered:
        return None
    name = shop.products[_choice(rng, ordered) - 1][1]
    return (
        f"How many units of the product {name!r} were ordered in total, counting only orders "
        "that were not cancelled?",
        "SELECT SUM(oi.quantity) FROM order_items oi JOIN orders o ON o.id = oi.order_id "
        f"JOIN products p ON p.id = oi.product_id WHERE p.name = {_quote(name)} "
        "AND o.status != 'cancelled'",
    )


def customers_in_year(rng: np.random.Generator, shop: ShopData) -> Drawn:
    year = _choice(rng, sorted({o[2] for o in shop.orders}))
    return (
        f"List the names of the customers who placed at least one order in {year}.",
        "SELECT DISTINCT c.name FROM customers c JOIN orders o ON o.customer_id = c.id "
        f"WHERE o.order_year = {year}",
    )


def revenue_by_category(rng: np.random.Generator, shop: ShopData) -> Drawn:
    return (
        "For each product category with shipped orders, give the category and its total "
        "revenue (quantity times price) from shipped orders.",
        "SELECT p.category, ROUND(SUM(oi.quantity * p.price), 2) FROM order_items oi "
        "JOIN orders o ON o.id = oi.order_id JOIN products p ON p.id = oi.product_id "
        "WHERE o.status = 'shipped' GROUP BY p.category",
    )


def top_customer(rng: np.random.Generator, shop: ShopData) -> Drawn:
    counts = Counter(o[1] for o in shop.orders).most_common(2)
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return None  # a tie: "the customer" would be ambiguous
    return (
        "Which customer placed the most orders? Give their name.",
        "SELECT c.name FROM customers c JOIN orders o ON o.customer_id = c.id "
        "GROUP BY c.id ORDER BY COUNT(*) DESC LIMIT 1",
    )


def average_price(rng: np.random.Generator, shop: ShopData) -> Drawn:
    category = _category(rng, shop)
    return (
        f"What is the average price of the products in the {category!r} category?",
        f"SELECT AVG(price) FROM products WHERE category = {_quote(category)}",
    )


def never_ordered(rng: np.random.Generator, shop: ShopData) -> Drawn:
    if len({o[1] for o in shop.orders}) == len(shop.customers):
        return None
    return (
        "List the names of the customers who have never placed an order.",
        "SELECT name FROM customers WHERE id NOT IN (SELECT customer_id FROM orders)",
    )


def status_in_city(rng: np.random.Generator, shop: ShopData) -> Drawn:
    city = _city(rng, shop)
    status = _choice(rng, ["shipped", "pending", "cancelled"])
    return (
        f"How many {status} orders were placed by customers who live in {city}?",
        "SELECT COUNT(*) FROM orders o JOIN customers c ON c.id = o.customer_id "
        f"WHERE o.status = {_quote(status)} AND c.city = {_quote(city)}",
    )


TEMPLATES: dict[str, Callable[[np.random.Generator, ShopData], Drawn]] = {
    template.__name__: template
    for template in (
        count_city,
        pricey_products,
        units_ordered,
        customers_in_year,
        revenue_by_category,
        top_customer,
        average_price,
        never_ordered,
        status_in_city,
    )
}
"""Question templates by name."""


def make_question(
    rng: np.random.Generator, shop: ShopData, kinds: Sequence[str], conn: sqlite3.Connection
) -> SQLQuestion:
    """Draw a question whose gold result is not empty on this shop.

    Raises:
        RuntimeError: If no template gives a usable question (never seen; the
            templates fall back on one another).
    """
    for _ in range(50):
        kind = _choice(rng, kinds)
        drawn = TEMPLATES[kind](rng, shop)
        if drawn is not None and conn.execute(drawn[1]).fetchall() not in ([], [(None,)]):
            return SQLQuestion(kind, *drawn)
    raise RuntimeError(f"no usable question among {list(kinds)} for this database")


def _row(values: Sequence[Any]) -> list[Any]:
    """A row with its columns in a canonical order (numbers first, by value)."""
    numbers = sorted(float(v) for v in values if isinstance(v, int | float))
    others = sorted((v for v in values if not isinstance(v, int | float)), key=repr)
    return [*numbers, *others]


def _same_row(a: list[Any], b: list[Any], tolerance: float) -> bool:
    if len(a) != len(b):
        return False
    return all(
        abs(x - y) <= tolerance if isinstance(x, float) and isinstance(y, float) else x == y
        for x, y in zip(a, b, strict=True)
    )


def same_result(
    gold: Sequence[Sequence[Any]], answer: Sequence[Sequence[Any]], tolerance: float = 0.01
) -> bool:
    """Whether two result sets hold the same rows, in any order.

    Column order is ignored, and numbers match within ``tolerance`` (so that
    ``ROUND(x, 2)`` and ``x`` agree, whatever the rounding of ties).
    """
    if len(gold) != len(answer):
        return False
    unmatched = [_row(row) for row in answer]
    for row in map(_row, gold):
        match = next(
            (i for i, other in enumerate(unmatched) if _same_row(row, other, tolerance)), None
        )
        if match is None:
            return False
        unmatched.pop(match)
    return True
