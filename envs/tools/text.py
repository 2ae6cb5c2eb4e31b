"""Keep tool output inside the observation space's character set."""

from __future__ import annotations

from agentgym.envs.text_env import TEXT_CHARSET


def sanitize(text: str) -> str:
    r"""Escape every character outside :data:`TEXT_CHARSET` as ``\uXXXX`` (or ``\UXXXXXXXX``).

    Tool output (a program's prints, database strings) may hold any Unicode;
    observations may not. Escaping keeps the information for the model.
    """
    if all(char in TEXT_CHARSET for char in text):
        return text
    return "".join(
        char
        if char in TEXT_CHARSET
        else (f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}")
        for char in text
    )
