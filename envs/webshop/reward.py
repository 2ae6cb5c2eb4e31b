"""WebShop's purchase score (``get_reward``), term by term.

score = (matched attributes + matched goal options + price ok)
        / (|goal attributes| + |goal options| + 1) × type reward

* A goal attribute matches when one of the product's attributes has thefuzz
  ``token_set_ratio > 85`` with it, or when it is a substring of the
  lowercased title, bullet points or description.
* The option term depends on ``option_scoring`` (see :data:`OPTION_SCORINGS`):

  - ``"webshop"`` (the default, WebShop's ``get_option_reward``): a *goal*
    option matches when, after colour normalization, one of the chosen
    option values has ``token_set_ratio > 85`` with it, whatever the option
    names. Sizes are fuzzy too ("12 inch" matches "24 inch": 86), and the
    product's text plays no part.
  - ``"strict"`` (an agentgym deviation, opt-in): a goal option matches only
    when the option of the same name was chosen with the same value after
    colour normalization. Every purchase it scores 1 also scores 1 under
    ``"webshop"``; published WebShop figures use ``"webshop"``.

* The price term is 1 when the price paid is at most ``price_upper``.
* The type reward is 1, 0.5, 0.1 or 0 from the query match, the breadcrumb
  match (two shared parts) and the share of the goal title's nouns found in
  the bought title.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from thefuzz import fuzz  # type: ignore[import-untyped]  # no stubs; mypy config is shared

from agentgym.envs.webshop.catalog import Product, WebShopConfigError
from agentgym.envs.webshop.normalize import normalize_color
from agentgym.errors import did_you_mean

FUZZY_THRESHOLD = 85
"""Matches need ``token_set_ratio`` strictly above this."""


class UnknownOptionScoringError(WebShopConfigError):
    """``option_scoring`` names no entry of :data:`OPTION_SCORINGS`."""


@dataclass(frozen=True)
class GoalSpec:
    """What the reward compares a purchase with.

    Attributes:
        attributes: Attribute phrases the instruction asks for.
        options: ``(option name, value)`` pairs the instruction asks for.
        price_upper: The most the buyer will pay.
        query: The goal product's query.
        product_category: The goal product's breadcrumb.
        title_nouns: Noun tokens of the goal product's title.
    """

    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    price_upper: float
    query: str
    product_category: str
    title_nouns: frozenset[str]


@dataclass(frozen=True)
class TypeReward:
    """The type term and what decided it."""

    r_type: float
    query_match: bool
    category_match: bool
    title_score: float


@dataclass(frozen=True)
class RewardBreakdown:
    """The score of one purchase and its parts (WebShop's verbose reward info).

    Attributes:
        score: The total, in [0, 1].
        r_type: Type reward (1, 0.5, 0.1 or 0).
        r_att: Share of goal attributes matched.
        r_option: Matched goal options / goal options; None when the goal has none.
        r_price: Whether the price is within ``price_upper``.
        query_match: Same query as the goal product.
        category_match: At least two shared breadcrumb parts.
        title_score: Share of the goal title's nouns in the bought title.
        w_att: Weight of the attribute term in the total.
        w_option: Weight of the option term; None when the goal has no options.
        w_price: Weight of the price term.
        num_attr_matches: Goal attributes matched.
        num_option_matches: Goal options matched.
    """

    score: float
    r_type: float
    r_att: float
    r_option: float | None
    r_price: bool
    query_match: bool
    category_match: bool
    title_score: float
    w_att: float
    w_option: float | None
    w_price: float
    num_attr_matches: int
    num_option_matches: int


def _in_text(phrase: str, product: Product) -> bool:
    return (
        phrase in product.title.lower()
        or phrase in " ".join(product.bullet_points).lower()
        or phrase in product.description.lower()
    )


def type_reward(product: Product, goal: GoalSpec) -> TypeReward:
    """Whether the bought product is the kind of thing the goal asks for.

    1.0 when the query matches, two breadcrumb parts match, or more than 20%
    of the goal title's nouns are in the bought title; else 0.5. Then 0.1 when
    that noun share is below 10%, and 0 when it is 0 (these override the
    matches). A goal title without nouns gives a noun share of 0.2.
    """
    query_match = product.query == goal.query
    bought_parts = {part.strip() for part in product.product_category.split("›")}
    goal_parts = {part.strip() for part in goal.product_category.split("›")}
    category_match = len(bought_parts & goal_parts) >= 2
    if goal.title_nouns:
        title_score = len(product.title_nouns & goal.title_nouns) / len(goal.title_nouns)
    else:
        title_score = 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return TypeReward(r_type, query_match, category_match, title_score)


def attribute_matches(product: Product, goal_attributes: Sequence[str]) -> int:
    """How many goal attributes the product has (fuzzy in its attributes, or in its text)."""
    matches = 0
    for wanted in goal_attributes:
        fuzzy = any(fuzz.token_set_ratio(h, wanted) > FUZZY_THRESHOLD for h in product.attributes)
        if fuzzy or _in_text(wanted, product):
            matches += 1
    return matches


def webshop_option_matches(
    goal_options: Sequence[tuple[str, str]], chosen: Mapping[str, str]
) -> int:
    """WebShop's rule: goal options fuzzily matched by any chosen value, names ignored."""
    chosen_values = [normalize_color(value) for value in chosen.values()]
    return sum(
        any(
            fuzz.token_set_ratio(value, normalize_color(wanted)) > FUZZY_THRESHOLD
            for value in chosen_values
        )
        for _, wanted in goal_options
    )


def strict_option_matches(
    goal_options: Sequence[tuple[str, str]], chosen: Mapping[str, str]
) -> int:
    """The strict rule: the goal's option name chosen with the same (colour-normalized) value."""
    return sum(
        name in chosen and normalize_color(chosen[name]) == normalize_color(wanted)
        for name, wanted in goal_options
    )


OPTION_SCORINGS: dict[str, Callable[[Sequence[tuple[str, str]], Mapping[str, str]], int]] = {
    "webshop": webshop_option_matches,
    "strict": strict_option_matches,
}
"""``option_scoring`` name -> how many goal options a choice of options matches."""


def check_option_scoring(name: str) -> str:
    """Return ``name`` if it is a key of :data:`OPTION_SCORINGS`.

    Raises:
        UnknownOptionScoringError: Naming the valid options and a close match.
    """
    if name not in OPTION_SCORINGS:
        hint = did_you_mean(name, OPTION_SCORINGS)
        raise UnknownOptionScoringError(
            f"option_scoring={name!r} is not supported.{hint} "
            f"Valid options: {list(OPTION_SCORINGS)}"
        )
    return name


def score_purchase(
    product: Product,
    goal: GoalSpec,
    *,
    price: float,
    chosen_options: Mapping[str, str],
    option_scoring: str = "webshop",
) -> RewardBreakdown:
    """WebShop's score for buying ``product`` at ``price`` with ``chosen_options``.

    Args:
        product: The product bought.
        goal: What the instruction asked for.
        price: The price paid (the catalog's price of the product).
        chosen_options: Option name -> value selected on the item page.
        option_scoring: A key of :data:`OPTION_SCORINGS`; ``"webshop"`` is WebShop's rule.

    Returns:
        The score and its parts.

    Raises:
        UnknownOptionScoringError: If ``option_scoring`` is unknown.
    """
    count_options = OPTION_SCORINGS[check_option_scoring(option_scoring)]
    kind = type_reward(product, goal)
    r_price = price <= goal.price_upper if goal.price_upper > 0 else None
    n_att = attribute_matches(product, goal.attributes)
    n_opt = count_options(goal.options, chosen_options)
    denominator = len(goal.attributes) + len(goal.options) + 1
    score = (n_att + n_opt + int(bool(r_price))) / denominator * kind.r_type
    return RewardBreakdown(
        score=score,
        r_type=kind.r_type,
        r_att=n_att / len(goal.attributes) if goal.attributes else 0.0,
        r_option=n_opt / len(goal.options) if goal.options else None,
        r_price=bool(r_price),
        query_match=kind.query_match,
        category_match=kind.category_match,
        title_score=kind.title_score,
        w_att=len(goal.attributes) / denominator,
        w_option=len(goal.options) / denominator if goal.options else None,
        w_price=1 / denominator,
        num_attr_matches=n_att,
        num_option_matches=n_opt,
    )
