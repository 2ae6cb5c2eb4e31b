"""``http``: an env played on an env server (:mod:`agentgym.envs.http.server`), in
another process or on another host.

To the rollout it is the env itself: the observations, rewards, ``terminated`` /
``truncated`` and info of the server's env, as JSON carries them
(:mod:`agentgym.envs.http.protocol`). What can go wrong with a server fails the
episode by name, never hangs it:

* every request has a timeout (``timeout``);
* a reset is retried, with exponential backoff, while the server cannot be reached
  (connection refused while it starts or restarts; 503), for up to ``connect_timeout``
  seconds. A reset may be repeated: the same seed gives the same episode, and a server
  that lost the episode (restarted) makes its env again;
* a step is sent once. It changes the episode's state, and a step whose answer was lost
  may have been played: a failed step (down, timed out, an error or garbage answered)
  raises :class:`~agentgym.envs.http.protocol.EnvServerError`, which the rollout records
  as that episode's ``env_error``; the next reset starts afresh.

Without ``base_url`` the client serves ``env`` itself, on a loopback server in a thread
of this process (one per env and arguments), which is how ``env=http`` trains as written.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar, TypeGuard
from urllib.parse import urlsplit

import gymnasium

from agentgym.envs.http.protocol import PROTOCOL_VERSION, EnvServerError, encode
from agentgym.envs.http.server import EnvServer, EnvServerThread, env_config_kwargs
from agentgym.envs.text_env import REQUIRED_INFO, TextEnv, text_space

RETRYABLE_STATUS = (502, 503, 504)
"""Answers a reset is repeated after (a proxy or a server that is starting)."""

_LOCAL_SERVERS: dict[str, EnvServerThread] = {}
_LOCAL_LOCK = threading.Lock()


def local_server(env: str, kwargs: Mapping[str, Any]) -> str:
    """The URL of this process's loopback server of ``env`` with ``kwargs`` (started on
    first use; it lives as long as the process)."""
    key = json.dumps([env, kwargs], sort_keys=True, default=str)
    with _LOCAL_LOCK:
        found = _LOCAL_SERVERS.get(key)
        if found is None:
            found = _LOCAL_SERVERS[key] = EnvServerThread(EnvServer(env, kwargs))
        return found.url


class _Connection:
    """One kept-alive HTTP connection to the server (a client's requests are sequential)."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be http://HOST:PORT or https://..., got {base_url!r}")
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname, parts.port
        self.prefix = parts.path.rstrip("/")
        self._http: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any, timeout: float) -> tuple[int, bytes]:
        """Send one request; its status and body. Raises OSError and http.client's errors."""
        connection = self._http
        if connection is None:
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            connection = kind(self.host, self.port, timeout=timeout)
        elif connection.sock is not None:
            connection.sock.settimeout(timeout)
        connection.timeout = timeout
        try:
            payload = None if body is None else encode(body)
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            connection.request(method, self.prefix + path, body=payload, headers=headers)
            answer = connection.getresponse()
            data = answer.read()
        except BaseException:
            connection.close()
            self._http = None
            raise
        self._http = connection
        return answer.status, data

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


class HttpEnv(TextEnv):
    """An env played on an env server over HTTP (see the module docstring).

    Args:
        base_url: The server (``http://HOST:PORT``, as ``agentgym serve-env`` prints
            it); None serves ``env`` on a loopback server of this process.
        env: The env the server must play (checked against it; None: whatever it
            plays). Without ``base_url``, the env to serve (default ``sokoban``).
        env_kwargs: Without ``base_url``: the served env's constructor arguments
            (None: those ``env=<env>`` trains with, its ``configs/env`` file's). With
            one: arguments set on the server's env for this client (only those the
            server lets clients set: TextEnv's own, such as ``max_steps``).
        format_penalty: The env's ``format_penalty``, set on the server's env (the
            env manager passes a run's ``format_penalty`` here); None keeps the server's.
        timeout: Seconds one request may take.
        connect_timeout: Seconds to reach the server: at construction, and each
            reset's retries together.
        render_mode: ``"ansi"`` (the observation) or None.

    Raises:
        EnvServerError: If the server cannot be reached within ``connect_timeout``,
            speaks another protocol, plays another env or refuses the arguments.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    action_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        *,
        base_url: str | None = None,
        env: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        format_penalty: float | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 60.0,
        render_mode: str | None = None,
    ) -> None:
        # TextEnv's own arguments belong to the server's env: its __init__ is not ours
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported by HttpEnv; "
                f"valid options: {self.metadata['render_modes']}"
            )
        kwargs = dict(env_kwargs or {})
        if base_url is None:
            env = env or "sokoban"
            served = env_config_kwargs(env) if env_kwargs is None else kwargs
            base_url, kwargs = local_server(env, served), {}
        if format_penalty is not None:
            kwargs["format_penalty"] = float(format_penalty)
        self.base_url = base_url.rstrip("/")
        self.timeout, self.connect_timeout = float(timeout), float(connect_timeout)
        self.render_mode = render_mode
        self.kwargs = kwargs
        self.episode_id = uuid.uuid4().hex
        self.observation_space = self.action_space = text_space()
        self.num_steps, self._done, self._observation_text = 0, True, ""
        self._connection = _Connection(self.base_url)
        health = self._retrying("GET", "/health", None, "health")
        if health.get("protocol") != PROTOCOL_VERSION:
            raise EnvServerError(
                f"base_url {self.base_url} speaks protocol {health.get('protocol')!r}, not "
                f"{PROTOCOL_VERSION}: is it an agentgym server of this version?"
            )
        if env is not None and health.get("env") != env:
            raise EnvServerError(
                f"base_url {self.base_url} serves env {health.get('env')!r}, not {env!r}"
            )
        description = self._retrying("PUT", self._path(""), {"kwargs": kwargs}, "open")
        self.env = str(description.get("env"))
        self._instructions = str(description.get("instructions", ""))
        self._tools = list(description.get("tools") or [])
        self.uses_task_index = bool(description.get("task_indexed"))
        self.response_format = str(description.get("response_format") or "answer")

    # -- TextEnv's public API, played on the server -------------------------------------

    @property
    def instructions(self) -> str:
        """The server env's instructions (as of the last reset)."""
        return self._instructions

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The server env's tools (OpenAI function schemas)."""
        return self._tools

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Reset on the server (retried with backoff while it cannot be reached).

        Raises:
            EnvServerError: The server stayed down for ``connect_timeout`` seconds, or
                answered an error or garbage.
        """
        gymnasium.Env.reset(self, seed=seed)  # Gymnasium's contract: np_random follows seed
        self._done = True
        body = {"seed": seed, "options": options, "kwargs": self.kwargs}
        answer = self._retrying("POST", self._path("/reset"), body, "reset")
        observation, info = answer.get("observation"), answer.get("info")
        if not (isinstance(observation, str) and _is_info(info)):
            raise self._garbage("reset", answer)
        self._instructions = str(answer.get("instructions", self._instructions))
        self._tools = list(answer.get("tools") or [])
        self.num_steps, self._done, self._observation_text = 0, False, observation
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play ``action`` on the server: one request, never repeated.

        Raises:
            EnvServerError: The server is down, timed out, or answered an error or garbage.
        """
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self._done = True  # until the server's answer says otherwise
        answer = self._once("POST", self._path("/step"), {"action": action}, "step")
        observation, reward, info = (
            answer.get("observation"),
            answer.get("reward"),
            answer.get("info"),
        )
        terminated, truncated = answer.get("terminated"), answer.get("truncated")
        if not (
            isinstance(observation, str)
            and isinstance(reward, int | float)
            and not isinstance(reward, bool)
            and isinstance(terminated, bool)
            and isinstance(truncated, bool)
            and _is_info(info)
        ):
            raise self._garbage("step", answer)
        self.num_steps += 1
        self._done, self._observation_text = terminated or truncated, observation
        return observation, float(reward), terminated, truncated, info

    def close(self) -> None:
        """Let the server close the episode's env (best effort: it may be gone)."""
        with contextlib.suppress(OSError, http.client.HTTPException):
            self._connection.request("DELETE", self._path(""), None, min(self.timeout, 5.0))
        self._connection.close()

    # -- requests -----------------------------------------------------------------------

    def _path(self, tail: str) -> str:
        return f"/episodes/{self.episode_id}{tail}"

    def _retrying(self, method: str, path: str, body: Any, what: str) -> dict[str, Any]:
        """A request repeated with exponential backoff (0.05 s doubling to 2 s) while the
        server cannot be reached or answers 502-504, for ``connect_timeout`` seconds."""
        deadline = time.monotonic() + self.connect_timeout
        delay, attempts = 0.05, 0
        while True:
            attempts += 1
            try:
                status, data = self._connection.request(method, path, body, self.timeout)
                if status not in RETRYABLE_STATUS:
                    return self._decode(status, data, what)
                why = f"it answered {status}"
            except (OSError, http.client.HTTPException) as error:
                why = f"{type(error).__name__}: {error}"
            if time.monotonic() + delay > deadline:
                raise EnvServerError(
                    f"no answer from base_url {self.base_url} to {what} of episode "
                    f"{self.episode_id} within {self.connect_timeout:g} s ({attempts} attempts; "
                    f"last: {why})"
                )
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _once(self, method: str, path: str, body: Any, what: str) -> dict[str, Any]:
        try:
            status, data = self._connection.request(method, path, body, self.timeout)
        except (OSError, http.client.HTTPException) as error:
            raise EnvServerError(
                f"the server at {self.base_url} failed during {what} of episode "
                f"{self.episode_id}: {type(error).__name__}: {error}"
            ) from error
        return self._decode(status, data, what)

    def _decode(self, status: int, data: bytes, what: str) -> dict[str, Any]:
        try:
            answer = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            answer = None
        if not isinstance(answer, dict):
            raise EnvServerError(
                f"the server at {self.base_url} answered garbage to {what} of episode "
                f"{self.episode_id} (status {status}): {data[:200]!r}"
            )
        if status != 200:
            error = answer.get("error") or {}
            raise EnvServerError(
                f"the server at {self.base_url} answered {status} to {what} of episode "
                f"{self.episode_id}: {error.get('type', 'error')}: {error.get('message', answer)}"
            )
        return answer

    def _garbage(self, what: str, answer: Mapping[str, Any]) -> EnvServerError:
        return EnvServerError(
            f"the server at {self.base_url} answered garbage to {what} of episode "
            f"{self.episode_id}: {json.dumps(answer, default=str)[:300]}"
        )

    # -- TextEnv's hooks: the server's env plays, these are not called ------------------

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError("HttpEnv resets on the server")

    def _observation(self) -> str:
        return self._observation_text

    def _success(self) -> bool:
        raise NotImplementedError("HttpEnv's success is the server's info['success']")


def _is_info(info: Any) -> TypeGuard[dict[str, Any]]:
    return isinstance(info, dict) and all(key in info for key in REQUIRED_INFO)
