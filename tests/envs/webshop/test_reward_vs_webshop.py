"""The default reward against scores computed by WebShop's own ``get_reward``.

``data/webshop_scores.json`` holds 479 purchases in the default generated
catalog (1,000 products, seed 0): the goal's product with the goal's options,
with other options, with one option missing, over the price bound, every
option choice of the goal product's near duplicate, and a random product.
Their ``webshop_score`` was computed by ``get_reward`` of
princeton-nlp/WebShop (commit 64fa2a5, ``web_agent_site/engine/goal.py``),
run unchanged outside this repository with the goal options given as a list
of values (as WebShop's human goals give them) and spaCy replaced by the
catalog's ``title_nouns``. Only the numbers are stored here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.envs.webshop import GENERATOR_VERSION, GoalSet, World
from agentgym.envs.webshop.reward import score_purchase

SCORES = json.loads((Path(__file__).parent / "data" / "webshop_scores.json").read_text())


def test_the_scores_were_computed_on_this_catalog() -> None:
    assert SCORES["generator_version"] == GENERATOR_VERSION, (
        "the catalog generator changed: recompute data/webshop_scores.json with WebShop's "
        "get_reward on the new catalog"
    )
    kinds = {p["kind"] for p in SCORES["purchases"]}
    assert kinds == {
        "exact", "wrong_options", "missing_option", "over_budget", "near_duplicate",
        "other_product",
    }  # fmt: skip
    assert len(SCORES["purchases"]) >= 300


def test_default_reward_equals_webshop_get_reward(world: World) -> None:
    goal_sets = {"synthetic": world.goals, "human": GoalSet(world.catalog, "human")}
    differences = []
    for purchase in SCORES["purchases"]:
        goal = goal_sets[purchase["goal_source"]][purchase["goal"]]
        product = world.catalog.by_asin(purchase["asin"])
        ours = score_purchase(
            product, goal.spec, price=purchase["price"], chosen_options=purchase["options"]
        ).score
        if ours != pytest.approx(purchase["webshop_score"], abs=1e-9):
            differences.append((purchase, ours))
    assert differences == []


def test_no_near_duplicate_purchase_scores_one() -> None:
    near = [p for p in SCORES["purchases"] if p["kind"] == "near_duplicate"]
    assert len(near) >= 100
    assert max(p["webshop_score"] for p in near) < 1.0
    exact = [p for p in SCORES["purchases"] if p["kind"] == "exact"]
    assert all(p["webshop_score"] == 1.0 for p in exact)
