"""The wire protocol of agentgym's env server (version 1): JSON over HTTP/1.1.

One server plays one registered env (:mod:`agentgym.envs.http.server`); a client
(:class:`~agentgym.envs.http.client.HttpEnv`) names its episode with an id of its own
making and drives it through four routes::

    GET    /health                  {"protocol": 1, "env": "sokoban", "episodes": 3}
    PUT    /episodes/{id}           {"kwargs": {...}}            -> the env's description
    POST   /episodes/{id}/reset     {"seed": 3, "options": null, "kwargs": {...}}
                                    -> {"observation", "info", "instructions", "tools"}
    POST   /episodes/{id}/step      {"action": "<answer>Up</answer>"}
                                    -> {"observation", "reward", "terminated", "truncated", "info"}
    DELETE /episodes/{id}           -> {"closed": true}

The description (``PUT``) is ``{"env", "instructions", "tools", "task_indexed",
"response_format", "max_steps"}``. A reset of an id the server does not hold (it was
restarted) makes the env again from the reset's ``kwargs``, so a reset can always be
repeated; a step of an unknown id is answered 404. Every error is
``{"error": {"type": ..., "message": ...}}`` with a 4xx status (the request was wrong)
or 500 (the env raised; ``type`` is its exception's class name).

Values are JSON: an info's tuples arrive as lists and numpy numbers as Python numbers
(:func:`encode`); the in-process env's info, passed through :func:`plain`, equals what the
client returns.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

PROTOCOL_VERSION = 1
"""Answered by ``GET /health``; the client refuses a server that speaks another."""

CLIENT_KWARGS = ("format_penalty", "max_steps", "response_format", "max_actions_per_turn")
"""Constructor arguments a client may set on the server's env (TextEnv's own options):
others are the server's to choose (an env argument may name a command or a file on
the server's machine)."""


class EnvServerError(RuntimeError):
    """The env server could not play a request: it is down, timed out, answered an
    error or answered garbage. Raised from ``reset``/``step``, it fails that episode
    (the rollout records it as an ``env_error`` naming this class and the server)."""


class EnvServerRequestError(ValueError):
    """A request the server refuses (4xx): a bad body, an argument the client may not
    set, an unknown episode."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def plain(value: Any) -> Any:
    """``value`` as JSON gives it back: tuples as lists, numpy scalars and arrays as
    Python numbers and lists, mapping keys as strings."""
    return json.loads(encode(value))


def encode(value: Any) -> bytes:
    """``value`` as UTF-8 JSON (numpy scalars and arrays as numbers and lists).

    Raises:
        TypeError: On a value JSON cannot hold (named with its type).
    """
    return json.dumps(value, default=_json_default, ensure_ascii=False).encode()


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"a {type(value).__name__} cannot be sent as JSON: {value!r:.80}")


def error_body(kind: str, message: str) -> bytes:
    """The body of an error answer."""
    return encode({"error": {"type": kind, "message": message}})
