"""The WebShop text environment: search, read and buy what the instruction asks for."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

from agentgym.envs.parsing import ParsedResponse, format_instructions, parse_free_response
from agentgym.envs.scripted import format_response
from agentgym.envs.text_env import MAX_TEXT_LENGTH, TextEnv, TurnResult, require_reset
from agentgym.envs.webshop.generator import GENERATOR_VERSION
from agentgym.envs.webshop.goals import Goal, WebShopConfigError
from agentgym.envs.webshop.render import OBSERVATION_MODES, RENDERERS, layout
from agentgym.envs.webshop.shop import (
    BACK_TO_SEARCH,
    BUY_NOW,
    NEXT_PAGE,
    PREV_PAGE,
    PRODUCT_WINDOW,
    SEARCH_BUTTON,
    PageState,
    Shop,
    Transition,
    normalize_clickable,
)
from agentgym.envs.webshop.world import World, load_world


class WebShopEnv(TextEnv):
    """WebShop: find the product the instruction describes and buy it with the right options.

    A faithful, offline WebShop (Yao et al., 2022): the same page graph,
    actions, BM25 search and purchase score, over a generated catalog in
    WebShop's schema (or the real data, with ``data_path``). Each step's
    reward is 0 except on Buy Now, where it is the purchase score in [0, 1];
    ``info["score"]`` is that score and ``success`` is score == 1. An action
    that is not available on the page changes nothing and earns the format
    penalty.

    Args:
        num_products: Catalog size (1,000 by default; up to 100,000 and more).
            With ``data_path``, the first this many products (None: all).
        catalog_seed: Seed of the generated catalog and of price draws.
        data_path: Folder with WebShop's ``items_shuffle*.json`` and
            ``items_ins_v2*.json`` (and optionally ``items_human_ins*.json``,
            ``reviews*.json``); None uses the generated catalog.
        split: ``"train"`` (goals 1500 on), ``"eval"`` (500-1499), ``"test"``
            (0-499) or ``"all"``; the reset seed picks the goal within it.
        goal_source: ``"synthetic"`` (instruction × option combinations) or
            ``"human"`` (``items_human_ins``).
        goal_seed: Seed of goal price bounds and of the goal shuffle (WebShop's 233).
        observation_mode: ``"text"``, ``"text_rich"`` or ``"html"``.
        show_attrs: Whether item pages have an Attributes button.
        option_scoring: ``"webshop"`` (WebShop's ``get_option_reward``, the
            default) or ``"strict"`` (agentgym's opt-in deviation: each goal
            option must be chosen under its own name with the same value; see
            :mod:`agentgym.envs.webshop.reward`).
        cache_dir: Where generated catalogs and indexes are cached (default
            ``$AGENTGYM_WEBSHOP_CACHE`` or ``~/.cache/agentgym/webshop``).
        max_steps: Step limit per episode.
        **kwargs: :class:`TextEnv` options (``response_format``,
            ``max_actions_per_turn``, ``format_penalty``, ``render_mode``).

    Raises:
        WebShopConfigError: On an unknown split, goal source or observation mode.
        WebShopDataError: When ``data_path`` does not hold WebShop's files.
        UnknownOptionScoringError: On an unknown ``option_scoring``.
    """

    generator_version: ClassVar[int | None] = GENERATOR_VERSION
    """The catalog generator's version (with ``data_path``, WebShop's own files are used)."""

    def __init__(
        self,
        *,
        num_products: int | None = 1000,
        catalog_seed: int = 0,
        data_path: str | os.PathLike[str] | None = None,
        split: str = "train",
        goal_source: str = "synthetic",
        goal_seed: int = 233,
        observation_mode: str = "text",
        show_attrs: bool = False,
        option_scoring: str = "webshop",
        cache_dir: str | os.PathLike[str] | None = None,
        max_steps: int = 15,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps=max_steps, **kwargs)
        if observation_mode not in OBSERVATION_MODES:
            raise WebShopConfigError(
                f"observation_mode={observation_mode!r} is not supported; "
                f"valid options: {list(OBSERVATION_MODES)}"
            )
        self.observation_mode = observation_mode
        self.world: World = load_world(
            num_products=num_products,
            catalog_seed=catalog_seed,
            data_path=data_path,
            cache_dir=cache_dir,
            goal_source=goal_source,
            goal_seed=goal_seed,
        )
        self.split = split
        self.goal_positions = self.world.goals.split(split)
        self.shop = Shop(
            self.world.catalog,
            self.world.engine,
            show_attrs=show_attrs,
            option_scoring=option_scoring,
        )
        self.state = PageState()
        self.goal: Goal | None = None
        self._searches: list[str] = []

    # -- public API -------------------------------------------------------------

    @property
    def instructions(self) -> str:
        """How to shop and how to answer, for a system prompt."""
        answer = format_instructions(
            self.response_format, "search[red running shoes]", self.max_actions_per_turn
        )
        return f"{self._rules}\n{answer}"

    def get_available_actions(self) -> dict[str, Any]:
        """WebShop's available actions: ``{"has_search_bar": bool, "clickables": [...]}``."""
        return self.shop.available_actions(self.state)

    def oracle_response(self) -> str:
        """The response an expert who knows the goal writes now (for ``agent=solver``).

        It searches with the instruction (then, if the target was not among
        the results, with the target's title), pages to the target, opens it,
        chooses the goal's options and buys.
        """
        action = self._oracle_action()
        return format_response([action], self.response_format, think="oracle")

    @property
    def score(self) -> float:
        """The purchase score (0 until Buy Now)."""
        return self.state.purchase.score if self.state.purchase is not None else 0.0

    # -- TextEnv hooks ------------------------------------------------------------

    @property
    def _rules(self) -> str:
        return (
            "You are shopping on WebShop. Find the product that matches the instruction "
            "and buy it with the options the instruction asks for.\n"
            "Actions: search[keywords] on the search page; click[text] on a clickable text "
            "of the current page: a product id on the results, an option value, "
            "Back to Search, < Prev, Next >, Description, Features, Reviews, Buy Now. "
            "Each observation ends with the available actions. Buying ends the episode "
            "with a score between 0 and 1."
        )

    def _parse(self, text: str) -> ParsedResponse:
        return parse_free_response(
            text, response_format=self.response_format, max_actions=self.max_actions_per_turn
        )

    def _play(self, parsed: ParsedResponse) -> TurnResult:
        """Check the whole turn on the page graph, then play it; an unavailable action voids it."""
        if not parsed.is_valid:
            return TurnResult.invalid(parsed.error)
        transitions = self._plan(parsed.actions)
        if isinstance(transitions, str):
            return TurnResult.invalid(transitions)
        reward, terminated, played = 0.0, False, []
        for action, transition in zip(parsed.actions, transitions, strict=False):
            if self.state.kind == "search":
                self._searches.append(transition.state.keywords or "")
            self.state = transition.state
            reward += transition.reward
            terminated = transition.done
            played.append(action)
            if terminated or self.num_steps + len(played) >= self.max_steps:
                break
        return TurnResult(reward, terminated, actions=tuple(played), steps=len(played))

    def _plan(self, actions: tuple[str, ...]) -> list[Transition] | str:
        """The transitions of ``actions`` from the current page (pure), up to the one that
        ends the episode; or why one of them is not available."""
        state, transitions = self.state, []
        for action in actions:
            outcome = self.shop.transition(state, action, self._goal)
            if isinstance(outcome, str):
                return outcome
            transitions.append(outcome)
            state = outcome.state
            if outcome.done:
                break
        return transitions

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        if "goal_index" in options:
            index = int(options["goal_index"])
            if not 0 <= index < len(self.goal_positions):
                raise WebShopConfigError(
                    f"goal_index={index} is outside split {self.split!r} "
                    f"(0 to {len(self.goal_positions) - 1})"
                )
        else:
            index = int(self.np_random.integers(len(self.goal_positions)))
        self.goal = self.world.goals[self.goal_positions[index]]
        self.state = PageState()
        self._searches = []
        return {"goal": self.goal.to_info(), "goal_index": index}

    def _info(self) -> dict[str, Any]:
        purchase = self.state.purchase
        return {
            "score": self.score,
            "page": self.state.kind,
            "reward_breakdown": dataclasses.asdict(purchase) if purchase is not None else None,
        }

    def _observation(self) -> str:
        page = RENDERERS[self.observation_mode](
            layout(self.shop, self.state, self._goal.instruction)
        )
        if self.state.kind != "done":
            available = self.get_available_actions()
            actions = ["search[<your query>]"] if available["has_search_bar"] else []
            actions += [f"click[{c}]" for c in available["clickables"] if c != SEARCH_BUTTON]
            page += "\n\nAvailable actions: " + ", ".join(actions)
        return page[:MAX_TEXT_LENGTH]

    def _success(self) -> bool:
        return self.state.purchase is not None and self.state.purchase.score == 1.0

    # -- helpers ----------------------------------------------------------------

    @property
    def _goal(self) -> Goal:
        return require_reset(self.goal)

    def _oracle_action(self) -> str:
        goal, state = self._goal, self.state
        target = self.world.catalog.by_asin(goal.asin)
        if state.kind == "search":
            instruction = " ".join(goal.instruction.lower().split())
            query = target.title if instruction in self._searches else goal.instruction
            return f"search[{query}]"
        if state.kind == "results":
            rank = next(
                (
                    r
                    for r, i in enumerate(state.results)
                    if self.world.catalog.products[i].asin == goal.asin
                ),
                None,
            )
            if rank is None:
                return f"click[{BACK_TO_SEARCH}]"
            page = rank // PRODUCT_WINDOW + 1
            if page == state.page:
                return f"click[{goal.asin.lower()}]"
            return f"click[{NEXT_PAGE if page > state.page else PREV_PAGE}]"
        if state.kind == "sub" or (state.kind == "item" and state.asin != goal.asin):
            return f"click[{PREV_PAGE}]"
        offered = {normalize_clickable(v) for values in target.options.values() for v in values}
        for name, value in goal.options.items():
            if state.options.get(name) != value and normalize_clickable(value) in offered:
                return f"click[{value}]"
        return f"click[{BUY_NOW}]"
