"""agentgym: reinforcement learning for LLM agents in multi-turn text environments.

Quick use::

    import agentgym

    env = agentgym.make("sokoban")
    observation, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("<answer>Up</answer>")
"""

from agentgym.registry import (
    EnvSpec,
    PluginError,
    UnknownEnvError,
    list_envs,
    make,
    register,
    spec,
)

import agentgym.envs  # noqa: E402, F401  (registers the built-in envs)

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
]
