"""WebShop's purchase score, case by case, with the expected values worked out by hand.

The base case (tests/envs/webshop/helpers.py): the goal asks for 1 attribute
("slim fit"), 2 options ("navy blue", "x-large") and a price up to $30, so
the denominator is 1 + 2 + 1 = 4 and each term is worth 0.25.

thefuzz's token_set_ratio compares the sorted token strings with an Indel
ratio, 1 - distance / (len1 + len2), rounded to an integer:
  "machine wash" vs "machine washable": 1 - 4/28 = 85.7 -> 86 (> 85, a match)
  "gentle wash"  vs "gentle washable":  1 - 4/26 = 84.6 -> 85 (not > 85)
"""

from __future__ import annotations

import pytest
from thefuzz import fuzz  # type: ignore[import-untyped]

from agentgym.envs.webshop.normalize import normalize_color
from agentgym.envs.webshop.reward import UnknownOptionScoringError, score_purchase, type_reward
from tests.envs.webshop.helpers import make_goal, make_product

RIGHT = {"color": "navy blue", "size": "x-large"}


def score(product=None, goal=None, price=20.0, chosen=None, option_scoring="webshop") -> float:
    return score_purchase(
        product or make_product(),
        goal or make_goal(),
        price=price,
        chosen_options=RIGHT if chosen is None else chosen,
        option_scoring=option_scoring,
    ).score


def test_everything_right_scores_one_with_its_breakdown() -> None:
    breakdown = score_purchase(make_product(), make_goal(), price=20.0, chosen_options=RIGHT)
    assert breakdown.score == 1.0
    assert (breakdown.r_type, breakdown.r_att, breakdown.r_option, breakdown.r_price) == (
        1.0,
        1.0,
        1.0,
        True,
    )
    assert (breakdown.w_att, breakdown.w_option, breakdown.w_price) == (0.25, 0.5, 0.25)


def test_fuzzy_attribute_match_just_above_85() -> None:
    assert fuzz.token_set_ratio("machine washable", "machine wash") == 86
    product = make_product(attributes=("machine washable",))
    goal = make_goal(attributes=("machine wash",))
    assert score(product, goal) == 1.0


def test_fuzzy_attribute_at_85_is_not_a_match() -> None:
    assert fuzz.token_set_ratio("gentle washable", "gentle wash") == 85
    product = make_product(attributes=("gentle washable",))
    goal = make_goal(attributes=("gentle wash",))
    assert score(product, goal) == pytest.approx(3 / 4)  # options 2 + price 1, attribute 0


def test_attribute_found_in_the_description_matches() -> None:
    product = make_product(attributes=("gentle washable",), description="Gentle washable cotton.")
    goal = make_goal(attributes=("gentle wash",))
    assert score(product, goal) == 1.0  # "gentle wash" is a substring of the description


def test_colour_normalization_matches_navy_with_royal_blue() -> None:
    assert normalize_color("navy blue") == normalize_color("royal blue") == "blue"
    assert score(chosen={"color": "royal blue", "size": "x-large"}) == 1.0


def test_colour_normalization_keeps_the_first_colour_of_the_list() -> None:
    # "light pink" -> "light" but "light blue" -> "blue" ("blue" precedes "light" in COLOR_SET).
    assert normalize_color("light pink") == "light"
    goal = make_goal(options=(("color", "light blue"), ("size", "x-large")))
    assert score(goal=goal, chosen={"color": "light pink", "size": "x-large"}) == pytest.approx(
        3 / 4
    )


# The three rules of agentgym's former option term that WebShop does not have
# (issue 15). Each goal below has 1 attribute (matched), the options shown
# and a price within the bound.


def test_case_1_sizes_are_fuzzy_12_inch_matches_24_inch() -> None:
    # Shared "inch"; "inch 12" vs "inch 24": longest common subsequence "inch 2" (6),
    # distance 14 - 2 * 6 = 2, 1 - 2/14 = 85.7 -> 86 > 85.
    assert fuzz.token_set_ratio("12 inch", "24 inch") == 86
    goal = make_goal(options=(("size", "12 inch"),))
    breakdown = score_purchase(make_product(), goal, price=20.0, chosen_options={"size": "24 inch"})
    assert (breakdown.r_option, breakdown.score) == (1.0, 1.0)  # (1 + 1 + 1) / 3
    strict = score_purchase(
        make_product(),
        goal,
        price=20.0,
        chosen_options={"size": "24 inch"},
        option_scoring="strict",
    )
    assert strict.score == pytest.approx(2 / 3)  # attribute + price, no option


def test_case_2_goal_options_are_counted_not_chosen_ones() -> None:
    # Goal quantity "6" and size "2 pound"; the buyer picks quantity "2" and size "2 pound".
    # "6" vs "2": 0, "6" vs "2 pound": 0, so only the size is matched: (1 + 1 + 1) / 4.
    assert fuzz.token_set_ratio("6", "2") == fuzz.token_set_ratio("6", "2 pound") == 0
    goal = make_goal(options=(("item package quantity", "6"), ("size", "2 pound")))
    chosen = {"item package quantity": "2", "size": "2 pound"}
    breakdown = score_purchase(make_product(), goal, price=20.0, chosen_options=chosen)
    assert breakdown.num_option_matches == 1
    assert breakdown.r_option == 0.5
    assert breakdown.score == pytest.approx(0.75)


def test_case_3_an_option_in_the_product_text_does_not_count() -> None:
    # "pro" is in "drop protection", but WebShop's option term never reads the text.
    assert fuzz.token_set_ratio("pro", "compact") == 20
    product = make_product(description="Rugged case with drop protection.")
    goal = make_goal(options=(("style", "compact"),))
    breakdown = score_purchase(product, goal, price=20.0, chosen_options={"style": "pro"})
    assert breakdown.r_option == 0.0
    assert breakdown.score == pytest.approx(2 / 3)  # (1 + 0 + 1) / 3


def test_a_goal_option_is_matched_by_a_value_chosen_under_another_name() -> None:
    # WebShop compares values only: "x-large" chosen as a "style" still matches the goal size.
    assert score(chosen={"color": "navy blue", "style": "x-large"}) == 1.0
    assert score(
        chosen={"color": "navy blue", "style": "x-large"}, option_scoring="strict"
    ) == pytest.approx(3 / 4)


def test_one_chosen_value_can_match_two_goal_options() -> None:
    # "large" vs "x-large": 100 (the tokens of "large" are a subset of "x large").
    assert fuzz.token_set_ratio("large", "x-large") == 100
    goal = make_goal(options=(("size", "x-large"), ("fit", "large")))
    assert score(goal=goal, chosen={"size": "large"}) == 1.0


def test_strict_scoring_needs_the_same_name_and_value() -> None:
    assert fuzz.token_set_ratio("x-large", "xx-large") == 93
    wrong_size = {"color": "navy blue", "size": "xx-large"}
    assert score(chosen=wrong_size) == 1.0  # 93 > 85
    assert score(chosen=wrong_size, option_scoring="strict") == pytest.approx(3 / 4)
    assert score(chosen={"color": "royal blue", "size": "x-large"}, option_scoring="strict") == 1.0


def test_unknown_option_scoring_suggests_the_close_one() -> None:
    with pytest.raises(UnknownOptionScoringError, match="Did you mean 'strict'"):
        score(option_scoring="stirct")


def test_options_not_chosen_do_not_count() -> None:
    assert score(chosen={}) == pytest.approx(2 / 4)  # attribute + price


def test_price_at_the_bound_passes_and_a_cent_over_fails() -> None:
    assert score(price=30.0) == 1.0
    assert score(price=30.01) == pytest.approx(3 / 4)


def test_type_reward_query_match() -> None:
    kind = type_reward(make_product(product_category="A › B"), make_goal())
    assert (kind.query_match, kind.category_match, kind.r_type) == (True, False, 1.0)


def test_type_reward_category_match_needs_two_shared_parts() -> None:
    goal = make_goal(title_nouns=frozenset({"acme", "crew", "neck", "tee", "shirt"}))
    two_shared = make_product(
        query="running shoes",
        product_category="Clothing, Shoes & Jewelry › Men › Shoes",
        title_nouns=frozenset({"tee", "runner"}),  # 1 of 5 goal nouns: title score 0.2
    )
    kind = type_reward(two_shared, goal)
    assert (kind.query_match, kind.category_match, kind.title_score) == (False, True, 0.2)
    assert kind.r_type == 1.0
    one_shared = make_product(
        query="running shoes",
        product_category="Clothing, Shoes & Jewelry › Women › Shoes",
        title_nouns=frozenset({"tee", "runner"}),
    )
    assert type_reward(one_shared, goal).r_type == 0.5  # no match, title score not > 0.2
    assert score(one_shared, make_goal(title_nouns=goal.title_nouns)) == 0.5


def test_type_reward_title_score_above_0_2_is_a_match() -> None:
    product = make_product(query="other", product_category="X › Y", title_nouns={"acme", "tee"})
    kind = type_reward(product, make_goal())  # 2 of 4 nouns
    assert (kind.title_score, kind.r_type) == (0.5, 1.0)


def test_type_reward_title_score_below_0_1_gives_0_1_even_with_query_match() -> None:
    nouns = frozenset({"acme", *(f"noun{i}" for i in range(10))})  # 11 nouns
    product = make_product(title_nouns=frozenset({"acme"}))
    kind = type_reward(product, make_goal(title_nouns=nouns))
    assert kind.query_match
    assert kind.title_score == pytest.approx(1 / 11)
    assert kind.r_type == 0.1
    assert score(product, make_goal(title_nouns=nouns)) == pytest.approx(0.1)


def test_type_reward_no_shared_noun_gives_zero() -> None:
    product = make_product(title_nouns=frozenset({"mug"}))
    assert type_reward(product, make_goal()).r_type == 0.0
    assert score(product) == 0.0


def test_goal_title_without_nouns_counts_as_0_2() -> None:
    goal = make_goal(title_nouns=frozenset())
    assert type_reward(make_product(), goal).r_type == 1.0  # query match
    other = make_product(query="other", product_category="X › Y")
    kind = type_reward(other, goal)
    assert (kind.title_score, kind.r_type) == (0.2, 0.5)


def test_total_combines_the_terms_and_the_type_reward() -> None:
    # 2 attributes (1 matched) + 2 options (1 matched: "black" is neither "blue" nor
    # "x-large") + price (over): (1 + 1 + 0) / 5 = 0.4, times r_type 0.5 (other query
    # and breadcrumb, title score 0.2) = 0.2.
    goal = make_goal(
        attributes=("slim fit", "tag free"),
        title_nouns=frozenset({"acme", "crew", "neck", "tee", "shirt"}),
    )
    product = make_product(
        query="other",
        product_category="X › Y",
        title_nouns=frozenset({"acme"}),
    )
    breakdown = score_purchase(
        product, goal, price=31.0, chosen_options={"color": "black", "size": "x-large"}
    )
    assert breakdown.score == pytest.approx(0.2)
    assert (breakdown.r_att, breakdown.r_option, breakdown.r_price) == (0.5, 0.5, False)
    assert (breakdown.w_att, breakdown.w_option, breakdown.w_price) == (0.4, 0.4, 0.2)
    assert (breakdown.num_attr_matches, breakdown.num_option_matches) == (1, 1)
