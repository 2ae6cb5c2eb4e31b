"""Hand-made products and goals for the WebShop reward tests."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentgym.envs.webshop.catalog import Product
from agentgym.envs.webshop.reward import GoalSpec

BREADCRUMB = "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts"


def make_product(**overrides: Any) -> Product:
    """A plain t-shirt whose text mentions none of the phrases the tests look for."""
    base = Product(
        asin="B000000001",
        title="Acme Crew Neck Tee",
        description="A shirt.",
        bullet_points=("Soft.",),
        pricing=(20.0,),
        price_tag="$20.0",
        options={"color": ("black", "navy blue"), "size": ("large", "x-large")},
        attributes=("slim fit",),
        category="fashion",
        query="men's t-shirt",
        product_category=BREADCRUMB,
        rating="N.A.",
        title_nouns=frozenset({"acme", "crew", "neck", "tee"}),
    )
    return replace(base, **overrides)


def make_goal(**overrides: Any) -> GoalSpec:
    """A goal for the t-shirt above: one attribute, two options, $30 bound."""
    base = GoalSpec(
        attributes=("slim fit",),
        options=(("color", "navy blue"), ("size", "x-large")),
        price_upper=30.0,
        query="men's t-shirt",
        product_category=BREADCRUMB,
        title_nouns=frozenset({"acme", "crew", "neck", "tee"}),
    )
    return replace(base, **overrides)
