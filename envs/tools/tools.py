"""Tools: an OpenAI function schema plus the Python function that serves it.

:func:`dispatch` turns one parsed :class:`~agentgym.envs.tools.protocol.ToolCall`
into a :class:`ToolOutcome`; unknown tools, arguments that do not match the
schema and tools that fail all become error outcomes, never exceptions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentgym.envs.tools.protocol import ToolCall
from agentgym.errors import did_you_mean

logger = logging.getLogger(__name__)

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


class ToolError(Exception):
    """A tool could not do what it was asked; the message goes back to the model."""


class ToolServerDiedError(RuntimeError):
    """The process that serves a tool is gone (an MCP server that died): not the model's
    doing, so the episode fails, naming the server, instead of answering the model."""


@dataclass(frozen=True)
class Tool:
    """A tool the model can call.

    Attributes:
        name: The name the model calls it by.
        description: What it does, for the model.
        parameters: JSON schema of the arguments: an ``object`` with
            ``properties``, ``required`` and ``additionalProperties: false``.
        function: Called with the arguments as keyword arguments; returns the
            result text or raises :class:`ToolError`.
        concurrent: Whether several calls of one turn may run at once.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., str]
    concurrent: bool = False

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema, for the chat template's ``tools=``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class ToolOutcome:
    """The result of one call: the text for the model and whether the call was valid."""

    text: str
    ok: bool


def error_outcome(message: str) -> ToolOutcome:
    """An invalid call's outcome: ``Error: <message>``."""
    return ToolOutcome(f"Error: {message}", ok=False)


def validate_arguments(parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Check arguments against the subset of JSON schema that tools use.

    Checks required properties, unknown properties (when
    ``additionalProperties`` is false), each property's ``type`` and an
    integer's ``minimum`` / ``maximum``.

    Returns:
        What is wrong, or None when the arguments fit.
    """
    properties: Mapping[str, Any] = parameters.get("properties", {})
    missing = [name for name in parameters.get("required", []) if name not in arguments]
    if missing:
        return f"missing required argument(s) {missing}; expected {sorted(properties)}"
    if parameters.get("additionalProperties") is False:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"unknown argument(s) {unknown}; expected {sorted(properties)}"
    for name, value in arguments.items():
        spec = properties.get(name, {})
        expected = spec.get("type")
        types = _JSON_TYPES.get(expected, (object,)) if expected else (object,)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"argument {name!r} must be of type {expected}, got {type(value).__name__}"
        if "minimum" in spec and value < spec["minimum"]:
            return f"argument {name!r} must be >= {spec['minimum']}, got {value}"
        if "maximum" in spec and value > spec["maximum"]:
            return f"argument {name!r} must be <= {spec['maximum']}, got {value}"
    return None


def check_call(tools: Mapping[str, Tool], call: ToolCall) -> ToolOutcome | None:
    """The error outcome of a call that must not run, or None when it may."""
    if call.error is not None or call.name is None:
        return error_outcome(call.error or "unreadable tool call")
    tool = tools.get(call.name)
    if tool is None:
        hint = did_you_mean(call.name, tools)
        return error_outcome(f"unknown tool {call.name!r}.{hint} Available tools: {list(tools)}")
    problem = validate_arguments(tool.parameters, call.arguments)
    if problem is not None:
        return error_outcome(f"bad arguments for {call.name!r}: {problem}")
    return None


def run_call(tools: Mapping[str, Tool], call: ToolCall) -> ToolOutcome:
    """Run a call that passed :func:`check_call`; a failing tool gives an error outcome."""
    assert call.name is not None
    try:
        return ToolOutcome(tools[call.name].function(**call.arguments), ok=True)
    except ToolError as exc:
        return error_outcome(str(exc))
    except ToolServerDiedError:
        raise  # the episode fails by name (the rollout counts it)
    except Exception as exc:  # a bug in a tool must not end the rollout
        logger.exception("tool %r raised", call.name)
        return error_outcome(f"the tool {call.name!r} failed: {type(exc).__name__}")
