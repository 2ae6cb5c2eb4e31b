"""``agentgym serve-env ENV [--host H] [--port P] [key=value ...]``: serve a registered
env over HTTP (:mod:`agentgym.envs.http.server`), as ``env=ENV`` trains it
(``configs/env/ENV.yaml``'s arguments) with ``key=value`` constructor arguments on top
(values read as YAML). Arguments the env rejects fail before it serves (exit 2)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from agentgym import registry
from agentgym.envs.http.protocol import CLIENT_KWARGS
from agentgym.envs.http.server import (
    EnvServer,
    env_config_kwargs,
    listening_socket,
    uvicorn_server,
)
from agentgym.play import parse_overrides


def main(argv: Sequence[str] | None = None) -> None:
    """``agentgym serve-env ENV [--host H] [--port P] [key=value ...]``."""
    parser = argparse.ArgumentParser(
        prog="agentgym serve-env",
        description="Serve a registered env over HTTP (docs/http_envs.md): the env as "
        "env=ENV trains it, with key=value constructor arguments on top.",
    )
    parser.add_argument("env", help=f"env name; registered: {registry.list_envs()}")
    parser.add_argument("kwargs", nargs="*", metavar="key=value", help="constructor argument")
    parser.add_argument("--host", default="127.0.0.1", help="address (0.0.0.0: every one)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--allow-kwarg",
        action="append",
        default=[],
        metavar="NAME",
        help=f"a constructor argument clients may set too (always: {list(CLIENT_KWARGS)})",
    )
    parser.add_argument("--max-episodes", type=int, default=4096, help="episodes held at once")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=3600.0,
        help="seconds after which an idle episode's env is closed when room is needed",
    )
    args = parser.parse_intermixed_args(argv)  # key=value words before or after options
    try:
        kwargs = {**env_config_kwargs(args.env), **parse_overrides(args.kwargs)}
        server = EnvServer(
            args.env,
            kwargs,
            client_kwargs=(*CLIENT_KWARGS, *args.allow_kwarg),
            max_episodes=args.max_episodes,
            idle_timeout=args.idle_timeout,
        )
        probe = server.make({})  # arguments the env rejects fail here, not at a client's reset
        probe.reset(seed=0)
        probe.close()
    except (registry.UnknownEnvError, registry.PluginError, ValueError, TypeError) as error:
        parser.exit(2, f"error: {error}\n")
    sock = listening_socket(args.host, args.port)
    print(f"serving {args.env} on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    try:
        asyncio.run(uvicorn_server(server, signals=True).serve(sockets=[sock]))
    finally:
        server.close()


if __name__ == "__main__":
    main(sys.argv[1:])
