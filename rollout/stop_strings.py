"""Stop strings (ROLL's ``generating_args.stop_strings``): a response ends with the first
one it writes, as vLLM's ``stop`` ends it, on every backend.

The engine generates as usual and the response is then cut after the shortest prefix of
its tokens whose text holds a stop string: sampling is sequential, so that prefix is
exactly what a stop inside the engine would have returned (the tokens, their logprobs),
and the ids stay the engine's (token-in-token-out). The stop string is kept, as
``include_stop_str_in_output`` keeps it, so the env sees the closing tag it parses
(``</code>``, ``</search>``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from agentgym.rollout.backends.base import Generation


def cut_at_stop_string(
    generation: Generation, stop_strings: Sequence[str], decode: Callable[[list[int]], str]
) -> Generation:
    """``generation`` up to and including the first stop string it writes.

    Args:
        generation: The engine's response.
        stop_strings: The strings that end a response.
        decode: Token ids → text (the chat's response decoding).

    Returns:
        The shortest prefix whose text holds a stop string, with ``finish_reason``
        ``"stop"``; ``generation`` itself when it writes none.
    """
    ids = generation.token_ids

    def stops(length: int) -> bool:
        text = decode(list(ids[:length]))
        return any(stop in text for stop in stop_strings)

    if not stop_strings or not stops(len(ids)):
        return generation
    low, high = 1, len(ids)  # a prefix's text only grows: the first that stops, by bisection
    while low < high:
        middle = (low + high) // 2
        if stops(middle):
            high = middle
        else:
            low = middle + 1
    return replace(
        generation,
        token_ids=list(ids[:low]),
        logprobs=list(generation.logprobs[:low]),
        finish_reason="stop",
    )
