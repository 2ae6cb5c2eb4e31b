"""Text normalization shared by the reward, the catalog and the renderer."""

from __future__ import annotations

import re
import unicodedata

COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black",
    "blue", "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel",
    "champagne", "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark", "denim",
    "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite",
    "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki",
    "lavender", "lemon", "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve",
    "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom", "mustard", "natural",
    "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum", "purple",
    "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver",
    "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip
"""WebShop's colour vocabulary, in its order: the first one found in a value wins."""


def normalize_color(value: str) -> str:
    """The first colour of :data:`COLOR_SET` that occurs in ``value``, else ``value``.

    Matching is by substring, as in WebShop: ``"navy blue"`` becomes ``"blue"``
    (``blue`` comes before ``navy`` in the list) and ``"standard"`` becomes
    ``"tan"``. Values are expected lowercased, as the catalog stores them.

    Args:
        value: An option value.

    Returns:
        The normalized value.
    """
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def normalize_option_value(value: str) -> str:
    """An option value as WebShop stores it: stripped, ``/`` as ``" | "``, lowercased."""
    return value.strip().replace("/", " | ").lower()


def to_ascii(text: str) -> str:
    """``text`` in printable ASCII, for observations (accents dropped, symbols replaced).

    Args:
        text: Any text from the catalog.

    Returns:
        The text with ``›`` as ``>``, typographic quotes and dashes as ASCII,
        accents removed and any other non-ASCII character dropped.
    """
    if not text.isascii():
        text = unicodedata.normalize("NFKD", text.translate(_ASCII_LOOKALIKES))
        text = text.encode("ascii", "ignore").decode("ascii")
    return _CONTROL.sub("", text)


_CONTROL = re.compile(r"[^\x20-\x7e\t\n]")
_ASCII_LOOKALIKES = str.maketrans(
    {
        "›": ">",
        "‹": "<",
        "‘": "'",
        "’": "'",
        "“": '"',
        "”": '"',
        "–": "-",
        "—": "-",
        "…": "...",
        "×": "x",
        "\u00a0": " ",
    }
)
