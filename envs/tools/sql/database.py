"""A small shop database generated per seed: customers, products, orders, order items."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCHEMA = """\
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    city TEXT NOT NULL,
    signup_year INTEGER NOT NULL
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    price REAL NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(id),
    order_year INTEGER NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE order_items (
    order_id INTEGER NOT NULL REFERENCES orders(id),
    product_id INTEGER NOT NULL REFERENCES products(id),
    quantity INTEGER NOT NULL
);"""
"""The tables, as shown to the model."""

CITIES = (
    "Northport", "Lakeview", "Ashford", "Brightwater", "Cedar Falls",
    "Eastham", "Fairmont", "Glenrock", "Highbury", "Ironbridge",
)  # fmt: skip
FIRST_NAMES = (
    "Alma", "Bruno", "Cleo", "Dario", "Edith", "Felix", "Gemma", "Hugo", "Iris", "Jasper",
    "Kira", "Leon", "Maya", "Nils", "Opal", "Pavel", "Rhea", "Silas", "Thea", "Umar",
)  # fmt: skip
LAST_NAMES = (
    "Abbott", "Brandt", "Castillo", "Dunne", "Ellis", "Fischer", "Garza", "Holm",
    "Ibarra", "Jensen", "Kowal", "Lindqvist", "Moreau", "Novak", "Okafor", "Price",
)  # fmt: skip
CATEGORIES = ("books", "garden", "kitchen", "toys", "sports", "music", "office")
ADJECTIVES = ("Blue", "Compact", "Deluxe", "Classic", "Smart", "Rustic", "Silent", "Golden")
NOUNS = ("Lamp", "Kettle", "Notebook", "Racket", "Puzzle", "Shovel", "Guitar", "Stapler", "Mug")
STATUSES = ("shipped", "pending", "cancelled")
YEARS = tuple(range(2019, 2025))


@dataclass(frozen=True)
class ShopData:
    """The generated rows, for question templates to draw parameters from.

    Attributes:
        customers: ``(id, name, city, signup_year)`` rows.
        products: ``(id, name, category, price)`` rows.
        orders: ``(id, customer_id, order_year, status)`` rows.
        order_items: ``(order_id, product_id, quantity)`` rows.
    """

    customers: list[tuple[int, str, str, int]]
    products: list[tuple[int, str, str, float]]
    orders: list[tuple[int, int, int, str]]
    order_items: list[tuple[int, int, int]]


def _unique_names(
    rng: np.random.Generator, first: tuple[str, ...], last: tuple[str, ...], n: int
) -> list[str]:
    pairs = rng.choice(len(first) * len(last), size=n, replace=False)
    return [f"{first[p // len(last)]} {last[p % len(last)]}" for p in pairs]


def generate_shop(rng: np.random.Generator) -> ShopData:
    """Draw a shop: 10-16 customers, 10-16 products, 20-40 orders of 1-3 products each."""
    cities = [CITIES[i] for i in rng.choice(len(CITIES), size=5, replace=False)]
    categories = [CATEGORIES[i] for i in rng.choice(len(CATEGORIES), size=4, replace=False)]
    n_customers, n_products = (int(rng.integers(10, 17)) for _ in range(2))
    customers = [
        (i + 1, name, cities[int(rng.integers(5))], int(rng.choice(YEARS)))
        for i, name in enumerate(_unique_names(rng, FIRST_NAMES, LAST_NAMES, n_customers))
    ]
    products = [
        (i + 1, name, categories[int(rng.integers(4))], int(rng.integers(200, 20000)) / 100)
        for i, name in enumerate(_unique_names(rng, ADJECTIVES, NOUNS, n_products))
    ]
    orders = []
    items = []
    for order_id in range(1, int(rng.integers(20, 41)) + 1):
        customer = int(rng.integers(1, n_customers + 1))
        status = STATUSES[int(rng.choice(3, p=[0.6, 0.25, 0.15]))]
        orders.append((order_id, customer, int(rng.choice(YEARS)), status))
        for product in rng.choice(n_products, size=int(rng.integers(1, 4)), replace=False):
            items.append((order_id, int(product) + 1, int(rng.integers(1, 6))))
    return ShopData(customers, products, orders, items)


def write_database(data: ShopData, path: Path) -> None:
    """Create the SQLite file at ``path`` (which must not exist) with the shop's rows."""
    conn = sqlite3.connect(path)
    try:
        # A scratch file that lives for one episode: no journal, no fsync.
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?)", data.customers)
        conn.executemany("INSERT INTO products VALUES (?, ?, ?, ?)", data.products)
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", data.orders)
        conn.executemany("INSERT INTO order_items VALUES (?, ?, ?)", data.order_items)
        conn.commit()
    finally:
        conn.close()
