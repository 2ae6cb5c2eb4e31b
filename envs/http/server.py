"""An env server: any registered agentgym env, played over HTTP by many episodes at once.

``agentgym serve-env sokoban --port 8000`` (:mod:`agentgym.envs.http.serve`) serves the
env as ``env=sokoban`` trains it (its ``configs/env/sokoban.yaml`` arguments), plus
``key=value`` overrides;
:class:`EnvServerThread` serves one in a thread of this process (tests, and
:class:`~agentgym.envs.http.client.HttpEnv` without a ``base_url``). The routes are
:mod:`agentgym.envs.http.protocol`'s. Each episode id holds its own env; an env whose
calls are short pure-Python work (``inline_calls``) is played on the server's event
loop, others in its thread pool, so one slow episode does not hold the rest.

Starlette (FastAPI's core) served by uvicorn, as the proxy is: both are dependencies
of the package already.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agentgym import registry
from agentgym.envs.adapter import make_text_env
from agentgym.envs.http.protocol import (
    CLIENT_KWARGS,
    PROTOCOL_VERSION,
    EnvServerRequestError,
    encode,
    error_body,
)
from agentgym.envs.text_env import TextEnv

_T = TypeVar("_T")

KEEP_ALIVE = 3600
"""Seconds an idle connection stays open: a client's connection lives for its env's
life, and a step on a connection the server just closed could not be repeated safely."""

ENV_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "env"
"""Where ``configs/env/<name>.yaml`` lives (the arguments ``env=<name>`` trains with)."""


@dataclass
class _Episode:
    env: TextEnv
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    used: float = field(default_factory=time.monotonic)


class EnvServer:
    """The episodes of one env, behind the protocol's routes.

    Args:
        env: A registered env name or Gymnasium id.
        kwargs: The env's constructor arguments (the server's own).
        client_kwargs: The arguments a client may set on top (its reset's
            ``kwargs``); default :data:`~agentgym.envs.http.protocol.CLIENT_KWARGS`.
        max_episodes: Episodes held at once; a new one beyond is answered 503.
        idle_timeout: Seconds after its last request an episode's env is closed, when
            a new episode needs room (a client that died never closes its own).
        threads: Threads that play the calls of envs that are not ``inline_calls``.

    Raises:
        UnknownEnvError: If ``env`` is not registered.
    """

    def __init__(
        self,
        env: str,
        kwargs: Mapping[str, Any] | None = None,
        *,
        client_kwargs: Collection[str] = CLIENT_KWARGS,
        max_episodes: int = 4096,
        idle_timeout: float = 3600.0,
        threads: int = 64,
    ) -> None:
        registry.spec(env)  # an unknown name fails here, with its close matches
        self.env = env
        self.kwargs = dict(kwargs or {})
        self.client_kwargs = frozenset(client_kwargs)
        self.max_episodes = max_episodes
        self.idle_timeout = idle_timeout
        self.episodes: dict[str, _Episode] = {}
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="env-server")

    # -- the work of each route -------------------------------------------------------

    def make(self, kwargs: Mapping[str, Any]) -> TextEnv:
        """A new env from the server's arguments and a client's allowed ones.

        Raises:
            EnvServerRequestError: 400 on an argument the client may not set.
        """
        refused = sorted(set(kwargs) - self.client_kwargs)
        if refused:
            raise EnvServerRequestError(
                400,
                f"the {self.env!r} server: a client may not set {refused}; it may set "
                f"{sorted(self.client_kwargs)} (start the server with the others)",
            )
        return make_text_env(self.env, {**self.kwargs, **kwargs})

    def describe(self, env: TextEnv) -> dict[str, Any]:
        """What a client learns of the env before its first reset."""
        return {
            "env": self.env,
            "instructions": env.instructions,
            "tools": list(env.tools),
            "task_indexed": getattr(env, "uses_task_index", False) is True,
            "response_format": getattr(env, "response_format", None),
            "max_steps": getattr(env, "max_steps", None),
        }

    async def call(self, env: TextEnv, function: Callable[..., _T], *args: Any) -> _T:
        """Run an env call on the loop (``inline_calls``) or in the thread pool."""
        if getattr(env, "inline_calls", False):
            return function(*args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, function, *args)

    async def episode(self, name: str, kwargs: Mapping[str, Any] | None) -> _Episode:
        """Episode ``name``; made from ``kwargs`` when the server lacks it (None: 404)."""
        found = self.episodes.get(name)
        if found is not None:
            found.used = time.monotonic()
            return found
        if kwargs is None:
            raise EnvServerRequestError(
                404, f"the {self.env!r} server holds no episode {name!r} (restarted?)"
            )
        if len(self.episodes) >= self.max_episodes:
            self._close_idle()
        if len(self.episodes) >= self.max_episodes:
            raise EnvServerRequestError(
                503, f"the {self.env!r} server holds {self.max_episodes} episodes already"
            )
        env = await asyncio.get_running_loop().run_in_executor(self._pool, self.make, kwargs)
        kept = self.episodes.setdefault(name, _Episode(env))
        if kept.env is not env:  # two first requests of one id raced: one env is enough
            env.close()
        return kept

    def _close_idle(self) -> None:
        """Close the envs of episodes idle for ``idle_timeout`` seconds (not mid-call)."""
        stale = time.monotonic() - self.idle_timeout
        for name, episode in list(self.episodes.items()):
            if episode.used < stale and not episode.lock.locked():
                del self.episodes[name]
                episode.env.close()

    def close(self) -> None:
        """Close every env and the thread pool."""
        for episode in self.episodes.values():
            episode.env.close()
        self.episodes.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- routes -------------------------------------------------------------------------

    def app(self) -> Starlette:
        """The routes, as a Starlette app."""
        return Starlette(
            routes=[
                Route("/health", _answer(self._health), methods=["GET"]),
                Route("/episodes/{episode}", _answer(self._create), methods=["PUT"]),
                Route("/episodes/{episode}", _answer(self._close), methods=["DELETE"]),
                Route("/episodes/{episode}/reset", _answer(self._reset), methods=["POST"]),
                Route("/episodes/{episode}/step", _answer(self._step), methods=["POST"]),
            ]
        )

    async def _health(self, _: Request) -> dict[str, Any]:
        return {"protocol": PROTOCOL_VERSION, "env": self.env, "episodes": len(self.episodes)}

    async def _create(self, request: Request) -> dict[str, Any]:
        body = await _body(request)
        episode = await self.episode(request.path_params["episode"], _mapping(body, "kwargs"))
        return self.describe(episode.env)

    async def _reset(self, request: Request) -> dict[str, Any]:
        body = await _body(request)
        seed, options = body.get("seed"), body.get("options")
        if seed is not None and not isinstance(seed, int):
            raise EnvServerRequestError(400, f"seed must be an integer or null, got {seed!r}")
        if options is not None and not isinstance(options, dict):
            raise EnvServerRequestError(400, f"options must be an object or null, got {options!r}")
        episode = await self.episode(request.path_params["episode"], _mapping(body, "kwargs"))
        async with episode.lock:
            env = episode.env
            observation, info = await self.call(env, _reset, env, seed, options)
        return {
            "observation": observation,
            "info": info,
            "instructions": env.instructions,
            "tools": list(env.tools),
        }

    async def _step(self, request: Request) -> dict[str, Any]:
        body = await _body(request)
        action = body.get("action")
        if not isinstance(action, str):
            raise EnvServerRequestError(400, f"action must be a string, got {action!r:.80}")
        episode = await self.episode(request.path_params["episode"], None)
        async with episode.lock:
            result = await self.call(episode.env, episode.env.step, action)
        observation, reward, terminated, truncated, info = result
        return {
            "observation": observation,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "info": info,
        }

    async def _close(self, request: Request) -> dict[str, Any]:
        episode = self.episodes.pop(request.path_params["episode"], None)
        if episode is not None:
            await self.call(episode.env, episode.env.close)
        return {"closed": episode is not None}


def _reset(env: TextEnv, seed: int | None, options: dict[str, Any] | None) -> Any:
    if options is None:
        return env.reset(seed=seed)
    return env.reset(seed=seed, options=options)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise EnvServerRequestError(400, f"the request body is not JSON: {error}") from error
    if not isinstance(body, dict):
        raise EnvServerRequestError(400, "the request body must be a JSON object")
    return body


def _mapping(body: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key) or {}
    if not isinstance(value, dict):
        raise EnvServerRequestError(400, f"{key} must be an object, got {value!r:.80}")
    return value


def _answer(route: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """A route's result as a JSON answer; a refused request as 4xx, an env's error as 500."""

    async def answer(request: Request) -> Response:
        try:
            return Response(encode(await route(request)), media_type="application/json")
        except EnvServerRequestError as error:
            body = error_body(type(error).__name__, str(error))
            return Response(body, status_code=error.status, media_type="application/json")
        except Exception as error:  # the env's own error: the client fails its episode
            body = error_body(type(error).__name__, str(error))
            return Response(body, status_code=500, media_type="application/json")

    return answer


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket; ``IPPROTO_TCP`` so that asyncio sets ``TCP_NODELAY`` on the
    connections it accepts (without it each answer waits ~40 ms for a delayed ACK)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def uvicorn_server(server: EnvServer, *, signals: bool) -> Any:
    """uvicorn serving ``server``; without ``signals`` it leaves the process's signal
    handlers alone (a server in a thread)."""
    import uvicorn

    config = uvicorn.Config(
        server.app(),
        log_config=None,
        lifespan="off",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE,
    )
    if signals:
        return uvicorn.Server(config)

    class Quiet(uvicorn.Server):  # Ctrl-C stays the host process's
        def capture_signals(self) -> Any:
            return nullcontext()

    return Quiet(config)


class EnvServerThread:
    """An :class:`EnvServer` served in a daemon thread of this process.

    Args:
        server: What to serve.
        host: The address to listen on.
        port: The port; 0 picks a free one (see :attr:`url`).

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, server: EnvServer, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = server
        sock = listening_socket(host, port)
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        self._uvicorn = uvicorn_server(server, signals=False)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._uvicorn.serve(sockets=[sock])),
            daemon=True,
            name=f"env-server {server.env}",
        )
        self._thread.start()
        while not self._uvicorn.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the env server of {server.env!r} stopped as it started")
            self._thread.join(0.005)

    def close(self) -> None:
        """Stop serving and close the envs."""
        self._uvicorn.should_exit = True
        self._thread.join(timeout=10)
        self.server.close()

    def __enter__(self) -> EnvServerThread:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def env_config_kwargs(name: str) -> dict[str, Any]:
    """The arguments ``env=<name>`` trains with (``configs/env/<name>.yaml``); empty for
    an env without a config file."""
    path = ENV_CONFIGS / f"{name}.yaml"
    if not path.is_file():
        return {}
    return dict(yaml.safe_load(path.read_text()).get("kwargs") or {})
