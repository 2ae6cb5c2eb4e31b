"""GSM8K-format arithmetic word problems with known answers, generated from a seed.

Each problem is a row ``{"question": ..., "answer": ...}`` whose answer is a
worked solution in GSM8K's style (steps with ``<<a*b=c>>`` calculator notes)
ending in ``#### N``; answers of 1,000 and more are written with thousands
separators (``#### 1,600``), which the reward must read as 1600. The same
seed gives the same problems on any machine; only ASCII is used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Randy")
ITEMS = ("clips", "apples", "pencils", "stickers", "marbles", "cookies", "books", "cards")


def _n(value: int) -> str:
    return f"{value:,}"


def _calc(a: int, op: str, b: int, result: int) -> str:
    """A worked step with GSM8K's calculator note: ``a*b = <<a*b=c>>c``."""
    return f"{a}{op}{b} = <<{a}{op}{b}={result}>>{result}"


def _row(question: str, steps: list[str], result: int) -> dict[str, str]:
    """A row: ``question``, and its worked ``steps`` (a line each) ending in ``#### result``."""
    return {"question": question, "answer": "\n".join([*steps, f"#### {_n(result)}"])}


def _name_and_item(rng: np.random.Generator) -> tuple[str, str]:
    return str(rng.choice(NAMES)), str(rng.choice(ITEMS))


def _half_as_many(rng: np.random.Generator) -> dict[str, str]:
    name, item = _name_and_item(rng)
    april = 2 * int(rng.integers(5, 60))
    may = april // 2
    total = april + may
    return _row(
        f"{name} sold {item} to {april} of her friends in April, and then she sold "
        f"half as many {item} in May. How many {item} did {name} sell altogether in April "
        "and May?",
        [
            f"{name} sold {_calc(april, '/', 2, may)} {item} in May.",
            f"{name} sold {_calc(april, '+', may, total)} {item} altogether in April and May.",
        ],
        total,
    )


def _change(rng: np.random.Generator) -> dict[str, str]:
    name, item = _name_and_item(rng)
    count, price = int(rng.integers(2, 10)), int(rng.integers(2, 12))
    cost = count * price
    bill = 100 if cost < 100 else 200
    change = bill - cost
    return _row(
        f"{name} buys {count} packs of {item} at ${price} each and pays with a "
        f"${bill} bill. How much change, in dollars, does {name} get back?",
        [
            f"The packs cost {_calc(count, '*', price, cost)} dollars.",
            f"So {name} gets {_calc(bill, '-', cost, change)} dollars back.",
        ],
        change,
    )


def _boxes_left(rng: np.random.Generator) -> dict[str, str]:
    name, item = _name_and_item(rng)
    per_box, boxes = int(rng.integers(6, 25)), int(rng.integers(3, 12))
    total = per_box * boxes
    given = int(rng.integers(1, total))
    left = total - given
    return _row(
        f"A box holds {per_box} {item}. {name} has {boxes} full boxes and gives "
        f"away {given} {item}. How many {item} does {name} have left?",
        [
            f"{name} has {_calc(per_box, '*', boxes, total)} {item}.",
            f"After giving some away, {_calc(total, '-', given, left)} are left.",
        ],
        left,
    )


def _wages(rng: np.random.Generator) -> dict[str, str]:
    name = str(rng.choice(NAMES))
    wage, hours, days = int(rng.integers(8, 40)), int(rng.integers(2, 9)), int(rng.integers(3, 8))
    daily = wage * hours
    total = daily * days
    return _row(
        f"{name} earns ${wage} an hour and works {hours} hours a day. How many "
        f"dollars does {name} earn in {days} days?",
        [
            f"In a day {name} earns {_calc(wage, '*', hours, daily)} dollars.",
            f"In {days} days that is {_calc(daily, '*', days, total)} dollars.",
        ],
        total,
    )


def _free_seats(rng: np.random.Generator) -> dict[str, str]:
    rows, per_row = int(rng.integers(10, 60)), int(rng.integers(10, 40))
    seats = rows * per_row
    taken = int(rng.integers(1, seats))
    free = seats - taken
    return _row(
        f"A hall has {rows} rows of {per_row} seats. {_n(taken)} seats are taken. "
        "How many seats are free?",
        [
            f"The hall has {_calc(rows, '*', per_row, seats)} seats.",
            f"So {_calc(seats, '-', taken, free)} seats are free.",
        ],
        free,
    )


TEMPLATES: tuple[Callable[[np.random.Generator], dict[str, str]], ...] = (
    _half_as_many,
    _change,
    _boxes_left,
    _wages,
    _free_seats,
)
"""The problem kinds; a problem's kind is drawn from its seed."""

GENERATOR_VERSION = 1
"""Raised whenever the same seed would give different problems."""


def generate_problems(count: int, seed: int = 0) -> list[dict[str, str]]:
    """``count`` problems in GSM8K's format (``question``, ``answer`` ending in ``#### N``).

    Args:
        count: How many problems.
        seed: The same seed gives the same problems.

    Returns:
        The rows, in order.

    Raises:
        ValueError: If ``count`` is below 1.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = np.random.default_rng(seed)
    return [TEMPLATES[int(rng.integers(len(TEMPLATES)))](rng) for _ in range(count)]


def write_problems(path: str | Path, count: int, seed: int = 0) -> Path:
    """Write :func:`generate_problems` to a ``.jsonl`` file (one row a line) and return its path."""
    path = Path(path)
    lines = [json.dumps(row) for row in generate_problems(count, seed)]
    path.write_text("\n".join(lines) + "\n")
    return path
