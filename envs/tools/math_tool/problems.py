"""Procedural math problems: arithmetic, GSM8K-like word problems, and number
puzzles that want a program.

Every generator draws from a ``numpy.random.Generator`` and returns a
:class:`Problem` with the exact answer and a short Python program that prints
it (what the oracle sends to the ``python`` tool). Numbers are chosen so that
each answer is exact (whole numbers where the story needs them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import numpy as np

NAMES = (
    "Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Kemi", "Liam", "Mara", "Nico", "Olga", "Priya", "Quinn", "Rosa", "Sami", "Tara",
)  # fmt: skip
ITEMS = ("pencils", "stickers", "marbles", "cookies", "cards", "beads", "stamps", "apples")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


@dataclass(frozen=True)
class Problem:
    """One math problem.

    Attributes:
        kind: The generator's name (a key of :data:`GENERATORS`).
        question: The problem text.
        answer: The exact answer.
        code: A Python program that prints the answer.
        tolerance: Absolute tolerance of a correct answer (a cent where the
            question asks to round to cents); 0 means relative 1e-6.
    """

    kind: str
    question: str
    answer: Fraction
    code: str
    tolerance: float = 0.0

    def is_correct(self, text: str) -> bool:
        """Whether the last number in ``text`` is the answer (``1,234.5``, ``$3``, ``3/4`` ok)."""
        value = parse_number(text)
        if value is None:
            return False
        error = abs(float(value - self.answer))
        return error <= (self.tolerance or 1e-6 * max(1.0, abs(float(self.answer))))


def parse_number(text: str) -> Fraction | None:
    """The last number written in ``text``, exactly; None if there is none."""
    cleaned = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    found = _NUMBER.findall(cleaned)
    if not found:
        return None
    try:
        return Fraction(found[-1])
    except (ValueError, ZeroDivisionError):
        return None


def _cents(value: Fraction) -> Fraction:
    """Round half up to cents, as a shop (and Decimal.quantize) would."""
    exact = Decimal(value.numerator) / Decimal(value.denominator)
    return Fraction(exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def _in_cents(kind: str, question: str, exact: Fraction, name: str, expression: str) -> Problem:
    """A problem whose answer is ``exact`` rounded half up to cents, within a cent.

    Args:
        kind: The generator's name.
        question: The problem text.
        exact: The answer before rounding.
        name: The program's variable for the result.
        expression: The result in Python's ``Decimal`` arithmetic; the program
            rounds it the way :func:`_cents` does and prints it.
    """
    code = (
        "from decimal import Decimal, ROUND_HALF_UP\n"
        f"{name} = {expression}\n"
        f"print({name}.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP))"
    )
    return Problem(kind, question, _cents(exact), code, tolerance=0.01)


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    """A uniform integer in ``[low, high]``."""
    return int(rng.integers(low, high + 1))


def _pick(rng: np.random.Generator, options: tuple[str, ...], count: int = 1) -> list[str]:
    return [options[i] for i in rng.choice(len(options), size=count, replace=False)]


def arithmetic(rng: np.random.Generator) -> Problem:
    a, b, c, d = (_int(rng, 12, 999) for _ in range(4))
    divisor = _int(rng, 2, 25)
    e = _int(rng, 2, 99) * divisor  # divisible: every answer is a whole number
    forms: list[tuple[str, int]] = [
        (f"({a} + {b}) * {c} - {d}", (a + b) * c - d),
        (f"{a} * {b} - {c} * {d}", a * b - c * d),
        (f"{a} * {b} + {e} / {divisor}", a * b + e // divisor),
        (f"({a} - {b}) * ({c} + {d})", (a - b) * (c + d)),
        (f"{e} / {divisor} * {a} - {b}", e // divisor * a - b),
    ]
    expression, value = forms[int(rng.integers(len(forms)))]
    return Problem("arithmetic", f"Compute {expression}.", Fraction(value), f"print({expression})")


def shopping(rng: np.random.Generator) -> Problem:
    name = _pick(rng, NAMES)[0]
    item = _pick(rng, ITEMS)[0]
    friends, each = _int(rng, 2, 9), _int(rng, 3, 40)
    per_pack = _int(rng, 6, 24)
    packs = _int(rng, (friends * each) // per_pack + 2, (friends * each) // per_pack + 8)
    given = packs * per_pack - friends * each
    question = (
        f"{name} buys {packs} packs of {item} with {per_pack} {item} in each pack. "
        f"{name} gives {given} {item} to a neighbour and shares the rest equally among "
        f"{friends} friends. How many {item} does each friend get?"
    )
    code = f"packs, per_pack, given, friends = {packs}, {per_pack}, {given}, {friends}\n"
    code += "print((packs * per_pack - given) // friends)"
    return Problem("shopping", question, Fraction(each), code)


def travel(rng: np.random.Generator) -> Problem:
    v1, v2 = _int(rng, 30, 120), _int(rng, 30, 120)
    t1, t2 = _int(rng, 2, 9), _int(rng, 2, 9)
    question = (
        f"A train travels at {v1} km/h for {t1} hours, then at {v2} km/h for {t2} hours. "
        "What is its average speed over the whole trip, in km/h, to two decimal places?"
    )
    answer = Fraction(v1 * t1 + v2 * t2, t1 + t2)
    code = f"print(({v1} * {t1} + {v2} * {t2}) / ({t1} + {t2}))"
    return Problem("travel", question, answer, code, tolerance=0.01)


def discount(rng: np.random.Generator) -> Problem:
    price = Fraction(_int(rng, 1000, 40000), 100)
    off, tax = _int(rng, 5, 60), _int(rng, 2, 15)
    question = (
        f"A jacket costs ${float(price):.2f}. It is discounted by {off}%, and then a sales tax "
        f"of {tax}% is added to the discounted price. What is the final price in dollars, "
        "rounded to the nearest cent?"
    )
    exact = price * (100 - off) / 100 * (100 + tax) / 100
    expression = f"Decimal('{float(price):.2f}') * (100 - {off}) / 100 * (100 + {tax}) / 100"
    return _in_cents("discount", question, exact, "final", expression)


def ages(rng: np.random.Generator) -> Problem:
    first, second = _pick(rng, NAMES, 2)
    young, times, years = _int(rng, 3, 20), _int(rng, 2, 5), _int(rng, 2, 15)
    total = young * (times + 1) + 2 * years
    question = (
        f"{first} is {times} times as old as {second}. In {years} years the sum of their "
        f"ages will be {total}. How old is {first} now?"
    )
    code = f"young = ({total} - 2 * {years}) // ({times} + 1)\nprint({times} * young)"
    return Problem("ages", question, Fraction(times * young), code)


def wages(rng: np.random.Generator) -> Problem:
    name = _pick(rng, NAMES)[0]
    rate, hours = Fraction(_int(rng, 1200, 4500), 100), _int(rng, 41, 60)
    question = (
        f"{name} earns ${float(rate):.2f} per hour for the first 40 hours of a week and 1.5 "
        f"times that rate for every hour beyond 40. Last week {name} worked {hours} hours. "
        "How much did they earn, in dollars?"
    )
    answer = rate * 40 + rate * Fraction(3, 2) * (hours - 40)
    code = f"rate = {float(rate):.2f}\nprint(round(rate * 40 + rate * 1.5 * ({hours} - 40), 4))"
    return Problem("wages", question, answer, code)


def interest(rng: np.random.Generator) -> Problem:
    principal, rate, years = _int(rng, 5, 200) * 100, _int(rng, 1, 9), _int(rng, 2, 12)
    question = (
        f"A savings account starts with ${principal} and earns {rate}% interest per year, "
        f"compounded yearly. How much is in the account after {years} years, in dollars, "
        "rounded to the nearest cent?"
    )
    exact = principal * Fraction(100 + rate, 100) ** years
    expression = f"Decimal({principal}) * (Decimal(100 + {rate}) / 100) ** {years}"
    return _in_cents("interest", question, exact, "value", expression)


def bakery(rng: np.random.Generator) -> Problem:
    trays, per_tray = 4 * _int(rng, 1, 8), 5 * _int(rng, 2, 8)
    percent = int(rng.choice([10, 20, 25, 40, 50, 60, 75, 80]))
    total = trays * per_tray  # a multiple of 20: every percentage above is whole
    sold_noon = total * percent // 100
    later = _int(rng, 0, total - sold_noon)
    question = (
        f"A bakery bakes {trays} trays of {per_tray} muffins. It sells {percent}% of the "
        f"muffins by noon and {later} more in the afternoon. How many muffins are left?"
    )
    code = f"total = {trays} * {per_tray}\nprint(total - total * {percent} // 100 - {later})"
    return Problem("bakery", question, Fraction(total - sold_noon - later), code)


def multiples(rng: np.random.Generator) -> Problem:
    k, m, n = _int(rng, 3, 19), _int(rng, 3, 19), _int(rng, 1000, 100_000)
    while m % k == 0 or k % m == 0:  # neither may contain the other
        m += 1
    question = (
        f"What is the sum of all whole numbers from 1 to {n} inclusive that are multiples of "
        f"{k} or of {m}?"
    )
    answer = _multiples_sum(k, n) + _multiples_sum(m, n) - _multiples_sum(math.lcm(k, m), n)
    code = f"print(sum(i for i in range(1, {n} + 1) if i % {k} == 0 or i % {m} == 0))"
    return Problem("multiples", question, Fraction(answer), code)


def _multiples_sum(k: int, n: int) -> int:
    count = n // k
    return k * count * (count + 1) // 2


def modpow(rng: np.random.Generator) -> Problem:
    base, exponent, modulus = _int(rng, 2, 999), _int(rng, 10**4, 10**9), _int(rng, 7, 10**6)
    question = f"What is the remainder when {base}^{exponent} is divided by {modulus}?"
    answer = pow(base, exponent, modulus)
    return Problem(
        "modpow", question, Fraction(answer), f"print(pow({base}, {exponent}, {modulus}))"
    )


def digit_sum(rng: np.random.Generator) -> Problem:
    n = _int(rng, 20, 400)
    question = f"What is the sum of the decimal digits of 2^{n}?"
    answer = sum(int(digit) for digit in str(2**n))
    return Problem("digit_sum", question, Fraction(answer), f"print(sum(map(int, str(2**{n}))))")


GENERATORS: dict[str, Callable[[np.random.Generator], Problem]] = {
    "arithmetic": arithmetic,
    "shopping": shopping,
    "travel": travel,
    "discount": discount,
    "ages": ages,
    "wages": wages,
    "interest": interest,
    "bakery": bakery,
    "multiples": multiples,
    "modpow": modpow,
    "digit_sum": digit_sum,
}
"""Problem generators by name."""
