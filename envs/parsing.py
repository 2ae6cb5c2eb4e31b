"""Parse a model's raw text into env actions.

The parser never raises on model output: whatever the text, it returns a
:class:`ParsedResponse` whose ``is_valid`` says whether the text followed the
format. Invalid output is the env's business (a penalized no-op), not an
exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

RESPONSE_FORMATS = ("answer", "think_answer")
"""Names of the supported response formats."""

ACTION_SEPARATOR = "||"

# Chat-template control tokens a model may leave in its text: ChatML
# `<|im_end|>`, Llama `<|eot_id|>`, `<|endoftext|>`, SentencePiece `<s>`/`</s>`,
# Gemma `<eos>`/`<end_of_turn>`. They carry no meaning for the action.
_STRAY_TOKEN = re.compile(r"<\|[^<>|]{0,64}\|>|</?s>|<eos>|<bos>|<end_of_turn>|<start_of_turn>")
_ANSWER_ONLY = re.compile(r"\A\s*<answer>(?P<answer>.*?)</answer>\s*\Z", re.DOTALL | re.IGNORECASE)
_THINK_ANSWER = re.compile(
    r"\A\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*\Z",
    re.DOTALL | re.IGNORECASE,
)
_TAG = re.compile(r"</?(?:think|answer)>", re.IGNORECASE)
_FIRST_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class ParsedResponse:
    """What the parser made of one model response.

    Attributes:
        actions: Canonical action names, in order (empty when invalid).
        is_valid: True when the text followed the format and every action is
            in the vocabulary, within the per-turn limit.
        error: Why the response is invalid; None when valid.
        think: The content of the ``<think>`` block, if the format has one.
    """

    actions: tuple[str, ...]
    is_valid: bool
    error: str | None = None
    think: str | None = None


def strip_stray_tokens(text: str) -> str:
    """Remove chat-template control tokens such as ``<|im_end|>`` from ``text``."""
    return _STRAY_TOKEN.sub("", text)


def _invalid(error: str) -> ParsedResponse:
    return ParsedResponse(actions=(), is_valid=False, error=error)


def parse_response(
    text: str,
    vocabulary: Sequence[str],
    *,
    response_format: str = "answer",
    max_actions: int = 1,
) -> ParsedResponse:
    """Parse a model response into canonical action names.

    Formats: ``answer`` expects ``<answer>A || B</answer>``; ``think_answer``
    expects ``<think>...</think><answer>...</answer>`` (the think block is
    required). Only whitespace and chat-template control tokens may surround
    the blocks. Action names are matched case-insensitively against
    ``vocabulary``; at most ``max_actions`` may be given, separated by ``||``.

    Args:
        text: The raw model output.
        vocabulary: The env's action names (their canonical spelling).
        response_format: One of :data:`RESPONSE_FORMATS`.
        max_actions: The most actions allowed in one response.

    Returns:
        The parsed response; never raises on any ``text``.

    Raises:
        ValueError: If ``response_format`` or ``max_actions`` is invalid (a
            configuration error, not a model error).
    """
    pattern = _FORMATS.get(response_format)
    if pattern is None:
        raise ValueError(
            f"Unknown response_format {response_format!r}; valid options: {list(RESPONSE_FORMATS)}"
        )
    if max_actions < 1:
        raise ValueError(f"max_actions must be >= 1, got {max_actions}")
    match = pattern(strip_stray_tokens(text))
    if match is None:
        return _invalid(f"response does not follow the {response_format!r} format")
    answer = match.group("answer")
    think = match.groupdict().get("think")
    if _TAG.search(answer) or (think is not None and _TAG.search(think)):
        return _invalid("nested or repeated <think>/<answer> tags")
    names = [part.strip() for part in answer.split(ACTION_SEPARATOR)]
    if not any(names):
        return _invalid("empty answer")
    if len(names) > max_actions:
        return _invalid(f"{len(names)} actions given, at most {max_actions} allowed per turn")
    lookup = {name.lower(): name for name in vocabulary}
    actions = []
    for name in names:
        canonical = lookup.get(" ".join(name.split()).lower())
        if canonical is None:
            return _invalid(f"unknown action {name!r}; valid actions: {list(vocabulary)}")
        actions.append(canonical)
    return ParsedResponse(actions=tuple(actions), is_valid=True, think=think)


def parse_free_response(
    text: str, *, response_format: str = "answer", max_actions: int = 1
) -> ParsedResponse:
    """Parse a response whose actions are free text (``search[red shoes]``), not a vocabulary.

    The format is checked as by :func:`parse_response`; the actions are the
    whitespace-normalized texts inside the ``<answer>`` block.

    Args:
        text: The raw model output.
        response_format: One of :data:`RESPONSE_FORMATS`.
        max_actions: The most actions allowed in one response.

    Returns:
        The parsed response; never raises on any ``text``.
    """
    match = _FIRST_ANSWER.search(text)
    candidates = (
        [" ".join(part.split()) for part in match.group(1).split(ACTION_SEPARATOR) if part.strip()]
        if match is not None
        else []
    )
    return parse_response(
        text, candidates, response_format=response_format, max_actions=max_actions
    )


def format_instructions(response_format: str, example_action: str, max_actions: int) -> str:
    """Describe the expected response format, for an env's system prompt.

    Args:
        response_format: One of :data:`RESPONSE_FORMATS`.
        example_action: An action name used in the example.
        max_actions: The most actions allowed in one response.

    Returns:
        A short paragraph telling the model how to answer.
    """
    answer = f"<answer>{example_action}</answer>"
    if response_format == "think_answer":
        example = f"<think>your reasoning</think>{answer}"
        shape = "Think inside <think></think>, then give your action inside <answer></answer>."
    else:
        example = answer
        shape = "Give your action inside <answer></answer> and write nothing else."
    several = (
        f" You may give up to {max_actions} actions in one answer, separated by '||'."
        if max_actions > 1
        else " Give exactly one action per answer."
    )
    return f"{shape}{several} Example: {example}"


_FORMATS: dict[str, Callable[[str], re.Match[str] | None]] = {
    "answer": _ANSWER_ONLY.match,
    "think_answer": _THINK_ANSWER.match,
}
