"""Property tests of the action parser: total on any text, exact on valid text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentgym.envs.parsing import (
    RESPONSE_FORMATS,
    format_instructions,
    parse_response,
    strip_stray_tokens,
)

VOCAB = ("Up", "Down", "Left", "Right")
formats = st.sampled_from(RESPONSE_FORMATS)
limits = st.integers(min_value=1, max_value=4)
whitespace = st.text(alphabet=" \t\n\r", max_size=3)
stray = st.sampled_from(["", "<|im_end|>", "<|endoftext|>", "</s>", "<eos>", "<|eot_id|>"])


def spell(name: str, data: st.DataObject) -> str:
    """``name`` in random letter case with random surrounding whitespace."""
    flips = data.draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    cased = "".join(c.upper() if f else c.lower() for c, f in zip(name, flips, strict=True))
    return data.draw(whitespace) + cased + data.draw(whitespace)


def wrap(answer: str, response_format: str, data: st.DataObject) -> str:
    body = f"<answer>{answer}</answer>"
    if response_format == "think_answer":
        think = data.draw(st.text(max_size=30).filter(lambda t: "<" not in t))
        body = f"<think>{think}</think>{data.draw(whitespace)}{body}"
    return (
        data.draw(stray) + data.draw(whitespace) + body + data.draw(whitespace) + data.draw(stray)
    )


@given(text=st.text(max_size=300), response_format=formats, max_actions=limits)
def test_never_raises_and_is_consistent(text: str, response_format: str, max_actions: int) -> None:
    parsed = parse_response(text, VOCAB, response_format=response_format, max_actions=max_actions)
    assert parsed.is_valid == (parsed.error is None)
    if parsed.is_valid:
        assert 1 <= len(parsed.actions) <= max_actions
        assert set(parsed.actions) <= set(VOCAB)
    else:
        assert parsed.actions == ()


@given(
    text=st.text(alphabet="<>/answrthik|UpDownLeftRight \n", max_size=80),
    response_format=formats,
)
def test_never_raises_on_tag_soup(text: str, response_format: str) -> None:
    parsed = parse_response(text, VOCAB, response_format=response_format, max_actions=3)
    assert parsed.is_valid == (parsed.error is None)


@given(data=st.data(), response_format=formats, max_actions=limits)
def test_valid_responses_parse_to_canonical_names(
    data: st.DataObject, response_format: str, max_actions: int
) -> None:
    actions = data.draw(st.lists(st.sampled_from(VOCAB), min_size=1, max_size=max_actions))
    answer = "||".join(spell(a, data) for a in actions)
    text = wrap(answer, response_format, data)
    parsed = parse_response(text, VOCAB, response_format=response_format, max_actions=max_actions)
    assert parsed.is_valid, (text, parsed.error)
    assert parsed.actions == tuple(actions)


@given(data=st.data(), response_format=formats)
def test_unknown_action_names_are_flagged(data: st.DataObject, response_format: str) -> None:
    bogus = data.draw(
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=8).filter(
            lambda t: t not in {v.lower() for v in VOCAB}
        )
    )
    text = wrap(f"Up || {bogus}", response_format, data)
    parsed = parse_response(text, VOCAB, response_format=response_format, max_actions=2)
    assert not parsed.is_valid
    assert "unknown action" in (parsed.error or "")


@given(data=st.data(), extra=st.integers(min_value=1, max_value=3), max_actions=limits)
def test_too_many_actions_are_flagged(data: st.DataObject, extra: int, max_actions: int) -> None:
    actions = data.draw(
        st.lists(st.sampled_from(VOCAB), min_size=max_actions + extra, max_size=max_actions + extra)
    )
    text = wrap("||".join(actions), "answer", data)
    parsed = parse_response(text, VOCAB, response_format="answer", max_actions=max_actions)
    assert not parsed.is_valid
    assert "at most" in (parsed.error or "")


@given(prefix=st.text(min_size=1, max_size=20).filter(lambda t: strip_stray_tokens(t).strip()))
def test_text_outside_the_blocks_is_flagged(prefix: str) -> None:
    parsed = parse_response(f"{prefix}<answer>Up</answer>", VOCAB)
    assert not parsed.is_valid


@pytest.mark.parametrize(
    ("text", "response_format"),
    [
        ("Up", "answer"),
        ("<answer></answer>", "answer"),
        ("<answer>  ||  </answer>", "answer"),
        ("<answer>Up", "answer"),
        ("<answer>Up</answer><answer>Down</answer>", "answer"),
        ("<answer><answer>Up</answer></answer>", "answer"),
        ("<answer>Up</answer>", "think_answer"),  # the think block is required
        ("<answer>Up</answer><think>x</think>", "think_answer"),
        ("<think>x</think>", "think_answer"),
        ("<think><think></think><answer>Up</answer>", "think_answer"),
    ],
)
def test_malformed_responses_are_flagged(text: str, response_format: str) -> None:
    assert not parse_response(text, VOCAB, response_format=response_format).is_valid


def test_examples_parse() -> None:
    parsed = parse_response(
        "<|im_start|> <think>box is left</think>\n<answer> left </answer><|im_end|>",
        VOCAB,
        response_format="think_answer",
    )
    assert parsed.actions == ("Left",)
    assert parsed.think == "box is left"
    two = parse_response("<answer>UP||down</answer>", VOCAB, max_actions=2)
    assert two.actions == ("Up", "Down")


def test_configuration_errors_raise() -> None:
    with pytest.raises(ValueError, match="valid options"):
        parse_response("<answer>Up</answer>", VOCAB, response_format="json")
    with pytest.raises(ValueError, match="max_actions"):
        parse_response("<answer>Up</answer>", VOCAB, max_actions=0)


@pytest.mark.parametrize("response_format", RESPONSE_FORMATS)
def test_instruction_example_is_itself_valid(response_format: str) -> None:
    text = format_instructions(response_format, "Up", 2)
    example = text.split("Example: ", 1)[1]
    assert parse_response(example, VOCAB, response_format=response_format, max_actions=2).is_valid
