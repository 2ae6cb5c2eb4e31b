"""Trinity-RFT's ``math_workflow`` prompt and its ``MathRewardFn``, rewritten here.

The reward is the sum of two terms, as in Trinity's ``MathRewardFn``:

- ``accuracy``: 1.0 when ``math_verify`` finds the response's answer equal to
  the reference, else 0.0. The response's answer is the text inside the first
  ``<answer>...</answer>`` on one line (Trinity's regex has no DOTALL), or the
  whole response when there is none; both sides go through ``math_verify.parse``
  with its default extraction, and ``verify(answer, reference)``.
- ``format_score``: +0.1 when the response matches
  ``.*?<think>.*?</think>\\s*<answer>.*?</answer>\\s*$`` (``re.DOTALL | re.MULTILINE``:
  ``$`` may match at the end of any line), else -0.1.

One deviation: the reference is the number after GSM8K's ``####`` when the
reference text has one (Trinity parses the whole worked solution, whose last
number is that one); see docs/math_workflow.md for the agreement figures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e.,\n"
    "<think> reasoning process here </think>\n"
    "<answer> answer here </answer>.\n"
)
"""Trinity's ``MathWorkflow`` system prompt, character for character (trailing newline included)."""

FORMAT_PATTERN = re.compile(
    r".*?<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL | re.MULTILINE
)
"""Trinity's ``MathRewardFn.DEFAULT_FORMAT_PATTERN`` with ``FormatReward``'s flags."""

FORMAT_SCORE = 0.1
"""The format term: +FORMAT_SCORE when the format matches, -FORMAT_SCORE otherwise."""

_ANSWER = re.compile(r"<answer>(.*?)</answer>")  # no DOTALL, as Trinity's simple_answer_parser
_GSM8K_FINAL = re.compile(r"####\s*(\S.*?)\s*$", re.DOTALL)


@dataclass(frozen=True)
class MathScore:
    """The two terms of the reward.

    Attributes:
        accuracy: 1.0 when the answer equals the reference, else 0.0.
        format_score: +0.1 for ``<think>...</think><answer>...</answer>``, else -0.1.
    """

    accuracy: float
    format_score: float

    @property
    def format_ok(self) -> bool:
        """Whether the response followed the format."""
        return self.format_score > 0

    @property
    def total(self) -> float:
        """The reward: ``accuracy + format_score``."""
        return self.accuracy + self.format_score


def reference_answer(truth: str) -> str:
    """The reference's final answer: the text after the last ``####`` (GSM8K), else all of it."""
    _, marker, tail = truth.rpartition("####")
    if marker:
        final = _GSM8K_FINAL.match(marker + tail)
        if final:
            return final.group(1)
    return truth


def parse_answer(text: str) -> list[Any]:
    """``math_verify.parse`` of the first one-line ``<answer>`` block's text, or of all of it.

    Runs without math_verify's signal-based timeout, which works only in the main
    thread (envs step in a thread pool), as Trinity's ``parse_with_timeout`` does.
    """
    from math_verify import parse  # type: ignore[import-untyped]

    found = _ANSWER.search(text)
    return list(parse(found.group(1) if found else text, parsing_timeout=None))


def accuracy(response: str, truth: str) -> float:
    """1.0 when ``math_verify`` finds the response's answer equal to the reference, else 0.0."""
    from math_verify import verify

    try:
        # Trinity's argument order: the response's answer as gold, the reference as target
        return float(verify(parse_answer(response), parse_answer(reference_answer(truth)),
                            timeout_seconds=None))  # fmt: skip
    except Exception:  # Trinity scores a failed verification 0, as here
        return 0.0


def math_reward(response: str, truth: str) -> MathScore:
    """Trinity's ``MathRewardFn`` on one response: accuracy and format terms.

    Args:
        response: The model's response text.
        truth: The reference (a GSM8K worked solution ending in ``#### N``, or an answer).

    Returns:
        Both terms; :attr:`MathScore.total` is the reward.
    """
    matched = FORMAT_PATTERN.match(response) is not None
    return MathScore(accuracy(response, truth), FORMAT_SCORE if matched else -FORMAT_SCORE)
