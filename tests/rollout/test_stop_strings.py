"""Stop strings cut a response after the first one it writes, keeping the engine's ids."""

from __future__ import annotations

from agentgym.rollout.backends.base import Generation
from agentgym.rollout.stop_strings import cut_at_stop_string

PIECES = ["Let", " me", " run", " <co", "de>", "print(2)", "</co", "de>", " then", "</code>"]


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def test_the_response_ends_with_the_token_that_completes_the_first_stop_string() -> None:
    generation = Generation(list(range(10)), [-0.1 * i for i in range(10)], "length")
    cut = cut_at_stop_string(generation, ["</code>"], decode)
    # "</co" + "de>" completes the string at token 7, split across two tokens
    assert cut.token_ids == [0, 1, 2, 3, 4, 5, 6, 7]
    assert cut.logprobs == generation.logprobs[:8]
    assert cut.finish_reason == "stop"
    assert decode(cut.token_ids).endswith("print(2)</code>")
    # the earliest of several strings wins; "<code>" is complete at token 4
    assert cut_at_stop_string(generation, ["</code>", "<code>"], decode).token_ids == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_a_response_without_a_stop_string_is_left_as_it_is() -> None:
    generation = Generation([0, 1, 2], [-1.0, -2.0, -3.0], "length")
    assert cut_at_stop_string(generation, ["</search>"], decode) is generation
    assert cut_at_stop_string(generation, [], decode) is generation
