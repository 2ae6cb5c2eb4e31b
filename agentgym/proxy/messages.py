"""OpenAI chat messages as the proxy compares and renders them.

An agent sends its whole conversation with every request, in OpenAI's shape
(content as a string or as text parts, ``tool_calls`` with JSON-string arguments,
fields the SDK fills with None). :func:`canonical` reduces a message to what the
chat template reads, so that the proxy can tell whether a request extends the
previous one; :func:`template_message` gives the chat template its form of it
(tool-call arguments as objects, as Hugging Face templates expect).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

Message = dict[str, Any]

_ROLES = ("system", "developer", "user", "assistant", "tool")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class MessageError(ValueError):
    """A message the proxy cannot read (an unknown role, content of the wrong type)."""


def canonical(message: Mapping[str, Any]) -> Message:
    """``message`` as the proxy compares it: role, content (text parts joined with a
    newline, None as ""), and where present ``tool_calls``, ``tool_call_id`` and
    ``name``; fields set to None and any others are dropped.

    Raises:
        MessageError: For an unknown role or content that is neither text nor text parts.
    """
    role = message.get("role")
    if role not in _ROLES:
        raise MessageError(f"message role {role!r} is not one of {list(_ROLES)}")
    out: Message = {"role": "system" if role == "developer" else role}
    out["content"] = _text(message.get("content"))
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_tool_call(call) for call in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = str(message[key])
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise MessageError(f"content part of type {kind!r}: the proxy takes text only")
            parts.append(str(part.get("text", "")))
        return "\n".join(parts)
    raise MessageError(f"message content of type {type(content).__name__}: use a string")


def _tool_call(call: Any) -> Message:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        raise MessageError("a tool call needs a 'function' with 'name' and 'arguments'")
    function = call["function"]
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {
        "id": str(call.get("id", "")),
        "type": "function",
        "function": {"name": str(function.get("name", "")), "arguments": arguments},
    }


def template_message(message: Message) -> Message:
    """The chat template's form of a canonical ``message``: tool-call arguments parsed
    into objects (Hugging Face templates write them with ``tojson``)."""
    if "tool_calls" not in message:
        return message
    calls = []
    for call in message["tool_calls"]:
        function = dict(call["function"])
        with contextlib.suppress(json.JSONDecodeError):  # else the string as it is
            function["arguments"] = json.loads(function["arguments"])
        calls.append({**call, "function": function})
    return {**message, "tool_calls": calls}


def parse_tool_calls(text: str, call_id: str) -> tuple[str, list[Message]]:
    """Split a response into its text and its Hermes-style ``<tool_call>`` blocks (the
    format of Qwen2.5's and Qwen3's templates), in OpenAI's shape.

    A block whose JSON is not ``{"name": ..., "arguments": {...}}`` is not a call:
    the text is returned whole and no calls, so the agent sees what the model wrote.

    Args:
        text: The response text.
        call_id: A prefix for the calls' ids (``{call_id}_{i}``).

    Returns:
        The text before the first block (stripped), and the calls.
    """
    blocks = list(_TOOL_CALL.finditer(text))
    calls = []
    for index, block in enumerate(blocks):
        try:
            body = json.loads(block.group(1))
        except json.JSONDecodeError:
            return text, []
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return text, []
        arguments = body.get("arguments", {})
        calls.append(
            {
                "id": f"{call_id}_{index}",
                "type": "function",
                "function": {
                    "name": body["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    if not calls:
        return text, []
    return text[: blocks[0].start()].strip(), calls


def last_observation(messages: Sequence[Message]) -> str:
    """The observation a request answers: the content of the user and tool messages
    after the last assistant or system message (the state key of GiGPO's step groups)."""
    tail: list[str] = []
    for message in reversed(messages):
        if message["role"] in ("assistant", "system"):
            break
        tail.append(message["content"])
    return "\n".join(reversed(tail))
