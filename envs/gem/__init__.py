"""``gem``: the envs of GEM (the ``gem-llm`` package), with GEM's tool wrapper (docs/gem.md)."""

from agentgym.envs.gem.env import GemEnv

__all__ = ["GemEnv"]
