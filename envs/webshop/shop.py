"""The shop's page graph: pages, what can be clicked on each, and where a click leads.

Pages and clickables are WebShop's (``web_agent_site``): the search page
(search bar), results (Back to Search, < Prev from page 2, Next >, product
links), an item (option radio buttons, Description, Features, Reviews,
Attributes when ``show_attrs``, < Prev, Buy Now), an item's sub-page (Back to
Search, < Prev) and the done page. Actions are ``search[keywords]`` where a
search bar is and ``click[text]`` on a current clickable; clickable texts are
lowercase, as in WebShop's ``get_available_actions``.

A :class:`PageState` is immutable, and :meth:`Shop.transition` is a pure
function of it, so an env can check a whole multi-action turn before playing it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from agentgym.envs.webshop.catalog import Catalog, Product
from agentgym.envs.webshop.goals import Goal
from agentgym.envs.webshop.normalize import to_ascii
from agentgym.envs.webshop.reward import RewardBreakdown, check_option_scoring, score_purchase
from agentgym.envs.webshop.search import SEARCH_RETURN_N, SearchEngine

PRODUCT_WINDOW = 10
"""Results per page."""

BACK_TO_SEARCH = "back to search"
PREV_PAGE = "< prev"
NEXT_PAGE = "next >"
BUY_NOW = "buy now"
SEARCH_BUTTON = "search"
SUB_PAGES = ("Description", "Features", "Reviews", "Attributes")

_ACTION = re.compile(r"\A\s*(search|click)\[(.+)\]\s*\Z", re.DOTALL | re.IGNORECASE)


def normalize_clickable(text: str) -> str:
    """How clickable texts are compared: ASCII, lowercased, runs of whitespace as one space."""
    return " ".join(to_ascii(text).split()).lower()


@dataclass(frozen=True)
class PageState:
    """Where the shopper is.

    Attributes:
        kind: ``"search"``, ``"results"``, ``"item"``, ``"sub"`` or ``"done"``.
        keywords: The last search (results, item and sub pages).
        page: Results page number, from 1.
        results: Catalog positions of the search's top products.
        asin: The product shown (item, sub and done pages).
        options: Options chosen on the item page, in the order first chosen.
        sub_page: Which sub-page (one of :data:`SUB_PAGES`).
        visited: Asins opened since the last Back to Search.
        purchase: The score of the purchase (done page).
    """

    kind: str = "search"
    keywords: str | None = None
    page: int = 1
    results: tuple[int, ...] = ()
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str | None = None
    visited: frozenset[str] = frozenset()
    purchase: RewardBreakdown | None = None


@dataclass(frozen=True)
class Transition:
    """The outcome of one valid action."""

    state: PageState
    reward: float
    done: bool


class Shop:
    """The catalog, its search engine and the page graph over them.

    Args:
        catalog: The products.
        engine: The search engine over ``catalog``.
        show_attrs: Whether item pages have an Attributes button (WebShop's
            ``show_attrs``, off by default there too).
        option_scoring: How purchases' options are scored: a key of
            :data:`~agentgym.envs.webshop.reward.OPTION_SCORINGS`.
    """

    def __init__(
        self,
        catalog: Catalog,
        engine: SearchEngine,
        *,
        show_attrs: bool = False,
        option_scoring: str = "webshop",
    ) -> None:
        self.catalog = catalog
        self.engine = engine
        self.show_attrs = show_attrs
        self.option_scoring = check_option_scoring(option_scoring)
        self._option_names: dict[str, dict[str, tuple[str, str]]] = {}

    def product(self, state: PageState) -> Product:
        """The product of an item, sub or done page."""
        if state.asin is None:
            raise ValueError(f"a {state.kind!r} page shows no product")
        return self.catalog.by_asin(state.asin)

    def page_products(self, state: PageState) -> list[Product]:
        """The products listed on a results page."""
        start = (state.page - 1) * PRODUCT_WINDOW
        return [self.catalog.products[i] for i in state.results[start : start + PRODUCT_WINDOW]]

    def available_actions(self, state: PageState) -> dict[str, Any]:
        """WebShop's ``get_available_actions``: ``{"has_search_bar", "clickables"}``."""
        return {"has_search_bar": state.kind == "search", "clickables": self.clickables(state)}

    def clickables(self, state: PageState) -> list[str]:
        """Lowercase texts of the buttons, product links and options on the page, in page order."""
        if state.kind == "search":
            return [SEARCH_BUTTON]
        if state.kind == "results":
            buttons = [BACK_TO_SEARCH] + ([PREV_PAGE] if state.page > 1 else []) + [NEXT_PAGE]
            return buttons + [p.asin.lower() for p in self.page_products(state)]
        if state.kind == "item":
            subs = [s.lower() for s in SUB_PAGES if s != "Attributes" or self.show_attrs]
            buttons = [BACK_TO_SEARCH, PREV_PAGE, *subs, BUY_NOW]
            options = self._options_of(self.product(state)).values()
            return buttons + [value for _, value in options if value not in buttons]
        if state.kind == "sub":
            return [BACK_TO_SEARCH, PREV_PAGE]
        return []

    def transition(self, state: PageState, action: str, goal: Goal) -> Transition | str:
        """Play ``search[...]`` or ``click[...]`` from ``state``.

        Args:
            state: The current page.
            action: The action text.
            goal: The episode's goal (scores a purchase).

        Returns:
            The new page, reward and whether the episode ended; or, for an
            action that is not available here, a message saying why.
        """
        match = _ACTION.match(action)
        if match is None:
            return f"{action!r} is not search[keywords] or click[text]"
        verb, argument = match.group(1).lower(), match.group(2)
        if verb == "search":
            if state.kind != "search":
                return "search[...] needs the search page; click[back to search] first"
            keywords = " ".join(argument.lower().split())
            if not keywords:
                return "search[...] needs keywords"
            results = tuple(self.engine.search(keywords, SEARCH_RETURN_N))
            new = PageState("results", keywords, 1, results, visited=state.visited)
            return Transition(new, 0.0, False)
        target = normalize_clickable(argument)
        clickables = {normalize_clickable(c) for c in self.clickables(state)}
        if target not in clickables or target == SEARCH_BUTTON:
            return f"click[{target}] is not on this page; see the available actions"
        return self._click(state, target, goal)

    def _click(self, state: PageState, target: str, goal: Goal) -> Transition:
        if target == BACK_TO_SEARCH:
            return Transition(PageState(), 0.0, False)
        if target == BUY_NOW:
            product = self.product(state)
            price = float(self.catalog.prices[self.catalog.index[product.asin]])
            purchase = score_purchase(
                product,
                goal.spec,
                price=price,
                chosen_options=state.options,
                option_scoring=self.option_scoring,
            )
            done = replace(state, kind="done", sub_page=None, purchase=purchase)
            return Transition(done, purchase.score, True)
        if state.kind == "results":
            if target in (NEXT_PAGE, PREV_PAGE):
                page = state.page + (1 if target == NEXT_PAGE else -1)
                return Transition(replace(state, page=page, options={}), 0.0, False)
            asin = target.upper()
            item = replace(
                state, kind="item", asin=asin, options={}, visited=state.visited | {asin}
            )
            return Transition(item, 0.0, False)
        if state.kind == "sub":  # only < prev is left
            return Transition(replace(state, kind="item", sub_page=None), 0.0, False)
        if target == PREV_PAGE:
            return Transition(replace(state, kind="results", asin=None, options={}), 0.0, False)
        for sub in SUB_PAGES:
            if target == sub.lower():
                return Transition(replace(state, kind="sub", sub_page=sub), 0.0, False)
        name, value = self._options_of(self.product(state))[target]
        return Transition(replace(state, options={**state.options, name: value}), 0.0, False)

    def _options_of(self, product: Product) -> dict[str, tuple[str, str]]:
        """Normalized option value -> (option name, value); a value in two groups: the last."""
        names = self._option_names.get(product.asin)
        if names is None:
            names = {
                normalize_clickable(v): (name, v)
                for name, values in product.options.items()
                for v in values
            }
            self._option_names[product.asin] = names
        return names
