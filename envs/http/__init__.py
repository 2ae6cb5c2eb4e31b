"""Envs behind HTTP: an env server for any registered env, and the ``http`` client env
that plays it from another process or host (docs/http_envs.md)."""

from agentgym.envs.http.client import HttpEnv
from agentgym.envs.http.protocol import EnvServerError
from agentgym.envs.http.server import EnvServer, EnvServerThread

__all__ = ["EnvServer", "EnvServerError", "EnvServerThread", "HttpEnv"]
