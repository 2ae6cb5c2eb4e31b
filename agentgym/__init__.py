"""agentgym: reinforcement learning for LLM agents in multi-turn text environments.

Quick use::

    import agentgym

    env = agentgym.make("sokoban")
    observation, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("<answer>Up</answer>")
"""

import agentgym.envs  # noqa: F401  (registers the built-in envs)
from agentgym.registry import (
    EnvSpec,
    PluginError,
    UnknownEnvError,
    list_envs,
    make,
    register,
    spec,
    unregister,
)

__version__ = "0.1.0"

__all__ = [
    "EnvSpec",
    "PluginError",
    "UnknownEnvError",
    "__version__",
    "list_envs",
    "make",
    "register",
    "spec",
    "unregister",
]
