"""The tool-call protocol: Hermes/Qwen-style ``<tool_call>`` blocks and ``<answer>``.

A response either calls tools, one ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` block per call (several per response allowed), or ends the
episode with ``<answer>...</answer>``. Free text (reasoning) may surround the
blocks. Parsing never raises: a block that is not a well-formed call becomes a
:class:`ToolCall` with an ``error``, and a response that breaks the protocol
gets a turn-level ``error``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentgym.envs.parsing import strip_stray_tokens

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_FIRST = re.compile(r"\A\s*<think>.*?</think>", re.DOTALL)
_ANY_TAG = re.compile(r"</?(?:tool_call|answer)>")


@dataclass(frozen=True)
class ToolCall:
    """One ``<tool_call>`` block.

    Attributes:
        name: The tool's name; None when the block could not be read.
        arguments: The call's arguments (empty when unreadable).
        error: Why the block is not a well-formed call; None when it is.
    """

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """What the parser made of one response.

    Attributes:
        calls: The tool-call blocks, in order (well-formed or not).
        answer: The content of the ``<answer>`` block, stripped; None if absent.
        error: Why the response breaks the protocol (no call and no answer,
            calls and an answer together, two answers, ...); None when it
            does not. Errors of single calls are on the calls.
    """

    calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    error: str | None = None


def parse_call(body: str) -> ToolCall:
    """Read the JSON inside one ``<tool_call>`` block.

    ``arguments`` may also be a JSON string holding an object (the OpenAI
    wire format); literal newlines inside strings are accepted.
    """
    try:
        obj = json.loads(body, strict=False)
    except json.JSONDecodeError as exc:
        return ToolCall(None, error=f"malformed JSON in <tool_call>: {exc}")
    except (ValueError, RecursionError) as exc:
        return ToolCall(None, error=f"malformed JSON in <tool_call>: {type(exc).__name__}")
    if not isinstance(obj, dict):
        return ToolCall(
            None, error='a tool call must be a JSON object: {"name": ..., "arguments": {...}}'
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, error='the tool call has no "name" string')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments, strict=False)
        except (ValueError, RecursionError):
            return ToolCall(name, error='"arguments" is a string that is not a JSON object')
    if not isinstance(arguments, dict):
        return ToolCall(name, error='"arguments" must be a JSON object')
    return ToolCall(name, arguments)


def parse_turn(text: str, *, require_think: bool = False) -> ParsedTurn:
    """Split a response into tool calls or an answer.

    Args:
        text: The model's raw response.
        require_think: The response must start with a ``<think>`` block.

    Returns:
        The parsed turn; never raises.
    """
    text = strip_stray_tokens(text)
    if require_think and not _THINK_FIRST.match(text):
        return ParsedTurn(error="the response must start with <think>...</think>")
    calls = [parse_call(body) for body in _TOOL_CALL.findall(text)]
    answers = _ANSWER.findall(text)
    rest = _ANSWER.sub("", _TOOL_CALL.sub("", text))
    if "<tool_call>" in rest:  # an unclosed block, e.g. generation stopped early
        calls.append(ToolCall(None, error="<tool_call> without a closing </tool_call>"))
    elif _ANY_TAG.search(rest):
        return ParsedTurn(tuple(calls), error="unbalanced <tool_call> or <answer> tags")
    if calls and answers:
        return ParsedTurn(
            tuple(calls), error="call tools or give the answer, not both in one response"
        )
    if len(answers) > 1:
        return ParsedTurn(error=f"{len(answers)} <answer> blocks; give exactly one")
    if answers:
        answer = answers[0].strip()
        if not answer:
            return ParsedTurn(error="empty <answer>")
        if _ANY_TAG.search(answer):
            return ParsedTurn(error="nested tags inside <answer>")
        return ParsedTurn(answer=answer)
    if not calls:
        return ParsedTurn(error="no <tool_call> and no <answer>")
    return ParsedTurn(tuple(calls))


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """Write a tool call the way a well-behaved model would."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def tool_instructions(
    *, example: str, max_calls_per_turn: int, max_tool_calls: int, think: bool
) -> str:
    """The protocol part of a tool env's system prompt.

    The tool schemas themselves go to the chat template's ``tools=``; this
    says how to call them and how to answer.
    """
    several = (
        f" You may make up to {max_calls_per_turn} calls in one response."
        if max_calls_per_turn > 1
        else " Make one call per response."
    )
    think_line = "Think inside <think></think> first, then call tools or answer.\n" if think else ""
    return (
        f'{think_line}To call a tool, write <tool_call>{{"name": <tool name>, "arguments": '
        f"{{<arguments as JSON>}}}}</tool_call>.{several} Each result comes back to you in "
        f"the next message. You have {max_tool_calls} tool calls in all.\n"
        "When you know the answer, write it inside <answer></answer>; that ends the episode. "
        "Do not call tools and answer in the same response.\n"
        f"Example call: {example}"
    )
