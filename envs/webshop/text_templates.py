"""Sentence templates of the synthetic catalog: descriptions, bullets, instructions, reviews.

Descriptions and bullet points are functions of the product alone (no
randomness), so the generator can re-render them to check what a product's
text mentions. Instructions are lowercase, like WebShop's.
"""

from __future__ import annotations

import random

_DESCRIPTION_OPENERS = (
    "Meet the {brand} {head}, designed for everyday use.",
    "The {brand} {head} brings thoughtful design to your routine.",
    "Upgrade your routine with the {brand} {head}.",
    "Crafted with care, this {head} from {brand} is built to last.",
)
_BULLETS = (
    "{attr}: made to deliver on every use of your {head}",
    "{attr}: a detail our customers love about this {head}",
    "{attr}: tested by our team for a better experience",
    "{attr}: one more reason to choose this {head}",
)
_INSTRUCTIONS = (
    "i need a {attrs} {query}",
    "i am looking for a {query} that is {attrs}",
    "i want to buy a {query} which is {attrs}",
    "find me a {attrs} {query}",
    "i would like a {query} with {attrs}",
    "i'm looking for {attrs} {query}",
)
_HUMAN = (
    "i'm looking for a {head} that is {attrs}{options}",
    "can you find me a {attrs} {head}{options}",
    "i want a {head}, {attrs}{options}",
    "please get me a {attrs} {head}{options}",
)
_REVIEW_TITLES = (
    "Great value",
    "Works as described",
    "Would buy again",
    "Not what I expected",
    "Solid choice",
    "Pretty good overall",
)
_REVIEW_BODIES = (
    "I have used this {head} for a few weeks and it does the job.",
    "The {head} arrived quickly and looks just like the pictures.",
    "Decent {head} for the price, although shipping took a while.",
    "My family likes this {head} a lot.",
)


def _join(phrases: list[str]) -> str:
    if len(phrases) == 1:
        return phrases[0]
    return ", ".join(phrases[:-1]) + " and " + phrases[-1]


def description(brand: str, head: str, attributes: list[str]) -> str:
    """The ``full_description`` of a product: an opener, then every attribute."""
    opener = _DESCRIPTION_OPENERS[len(head) % len(_DESCRIPTION_OPENERS)]
    return (
        f"{opener.format(brand=brand, head=head)} It is {_join(attributes)}. "
        f"Each {head} is checked before it ships."
    )


def bullet_point(attribute: str, head: str) -> str:
    """One ``small_description`` bullet about ``attribute``."""
    template = _BULLETS[len(attribute) % len(_BULLETS)]
    return template.format(attr=attribute.capitalize(), head=head)


def instruction(rng: random.Random, query: str, wanted: list[str]) -> str:
    """An ``items_ins_v2`` instruction asking for ``wanted`` attributes of a ``query``."""
    return rng.choice(_INSTRUCTIONS).format(query=query, attrs=_join(wanted))


def human_instruction(
    rng: random.Random, head: str, wanted: list[str], options: dict[str, str]
) -> str:
    """An ``items_human_ins``-style instruction that names the options inline."""
    text = ", ".join(f"{name} {value}" for name, value in options.items())
    return rng.choice(_HUMAN).format(
        head=head, attrs=_join(wanted), options=f" in {text}" if text else ""
    )


def review(rng: random.Random, head: str) -> dict[str, object]:
    """One ``reviews.json`` review (title, score, body)."""
    return {
        "title": rng.choice(_REVIEW_TITLES),
        "score": rng.randint(1, 5),
        "body": rng.choice(_REVIEW_BODIES).format(head=head),
    }
