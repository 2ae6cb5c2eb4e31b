"""Pages as observations: ``text``, ``text_rich`` and ``html``.

Each page is first laid out as a list of :class:`Element` (the visible
strings of WebShop's templates, in page order, each with its role); the three
modes are views of that list:

* ``text``: the strings joined with ``" [SEP] "`` (WebShop's simple mode);
* ``text_rich``: one string a line, buttons as ``[button] X [button_]``,
  chosen options and visited products as ``[clicked button] X [clicked button_]``,
  with ``You have clicked X.`` lines first (WebShop's rich mode);
* ``html``: a small page with WebShop's ids and classes (``search_input``,
  ``btn``, ``product-link``, radio inputs), for HTML-reading agents.

All text is reduced to printable ASCII.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass

from agentgym.envs.webshop.normalize import to_ascii
from agentgym.envs.webshop.shop import SUB_PAGES, PageState, Shop

OBSERVATION_MODES = ("text", "text_rich", "html")


@dataclass(frozen=True)
class Element:
    """One visible string of a page.

    Attributes:
        text: The string.
        role: ``"text"``, ``"button"``, ``"link"`` (a product), ``"option"``,
            or ``"search_input"`` (no text).
        group: The option's name (options only).
        active: A chosen option or a visited product.
    """

    text: str
    role: str = "text"
    group: str = ""
    active: bool = False


def layout(shop: Shop, state: PageState, instruction: str) -> list[Element]:
    """The visible elements of the page ``state`` shows."""
    if state.kind == "done":
        score = state.purchase.score if state.purchase is not None else 0.0
        return [
            Element("Thank you for shopping with us!"),
            Element("Your score (min 0.0, max 1.0)"),
            Element(f"{score}"),
        ]
    head = [Element("Instruction:"), Element(to_ascii(instruction))]
    if state.kind == "search":
        return [Element("WebShop"), *head, Element("", "search_input"), Element("Search", "button")]
    head.append(Element("Back to Search", "button"))
    if state.kind == "results":
        total = len(state.results)
        elements = [*head, Element(f"Page {state.page} (Total results: {total})")]
        if state.page > 1:
            elements.append(Element("< Prev", "button"))
        elements.append(Element("Next >", "button"))
        for p in shop.page_products(state):
            elements += [
                Element(p.asin, "link", active=p.asin in state.visited),
                Element(to_ascii(p.title)),
                Element(to_ascii(p.price_tag)),
            ]
        return elements
    product = shop.product(state)
    head.append(Element("< Prev", "button"))
    if state.kind == "sub":
        return head + [Element(to_ascii(t)) for t in _sub_page_texts(shop, state)]
    elements = list(head)
    for name, values in product.options.items():
        elements.append(Element(to_ascii(name)))
        chosen = state.options.get(name)
        for value in values:
            elements.append(Element(to_ascii(value), "option", name, value == chosen))
    elements += [
        Element(to_ascii(product.title)),
        Element(to_ascii(f"Price: {product.price_tag}")),
        Element(to_ascii(f"Rating: {product.rating}")),
    ]
    elements += [Element(s, "button") for s in SUB_PAGES if s != "Attributes" or shop.show_attrs]
    elements.append(Element("Buy Now", "button"))
    return elements


def _sub_page_texts(shop: Shop, state: PageState) -> list[str]:
    product = shop.product(state)
    if state.sub_page == "Description":
        return [product.description]
    if state.sub_page == "Features":
        return list(product.bullet_points)
    if state.sub_page == "Reviews":
        texts = []
        for r in product.reviews:
            texts += [f'"{r.title}"', f"{r.score:g}", r.body]
        return texts
    return [*product.attributes, product.category, product.query, product.product_category]


def to_text(elements: list[Element]) -> str:
    """WebShop's ``text`` mode: visible strings joined with ``" [SEP] "``."""
    return " [SEP] ".join(e.text for e in elements if e.text)


def to_text_rich(elements: list[Element]) -> str:
    """WebShop's ``text_rich`` mode: one string a line, clickables marked."""
    clicked = [f"You have clicked {e.text}.\n" for e in elements if e.role == "option" and e.active]
    lines = []
    for e in elements:
        if e.role == "button":
            lines.append(f"[button] {e.text} [button_]")
        elif e.role == "option":
            mark = "clicked button" if e.active else "button"
            lines.append(f"  [{mark}] {e.text} [{mark}_]")
        elif e.role == "link":
            mark = "clicked button" if e.active else "button"
            lines.append(f"\n[{mark}] {e.text} [{mark}_]")
        elif e.text:
            lines.append(e.text)
    return "".join(reversed(clicked)) + "".join(line + "\n" for line in lines)


def to_html(elements: list[Element]) -> str:
    """A minimal HTML page with WebShop's ids and classes."""
    body = []
    for e in elements:
        text = html.escape(e.text)
        if e.role == "search_input":
            body.append('<input id="search_input" type="text" name="search_query">')
        elif e.role == "button":
            body.append(f'<button class="btn" type="submit">{text}</button>')
        elif e.role == "link":
            body.append(f'<a class="product-link">{text}</a>')
        elif e.role == "option":
            group = html.escape(e.group)
            checked = " checked" if e.active else ""
            body.append(
                f'<input type="radio" name="{group}" value="{text}"{checked}><label>{text}</label>'
            )
        else:
            body.append(f"<p>{text}</p>")
    return "<html><body>\n" + "\n".join(body) + "\n</body></html>"


RENDERERS: dict[str, Callable[[list[Element]], str]] = {
    "text": to_text,
    "text_rich": to_text_rich,
    "html": to_html,
}
"""Observation mode -> renderer."""
