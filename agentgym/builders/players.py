"""Who plays a mode's episodes (``agent.kind``): the env manager's own loop, the envs'
own conversations, or agents through the OpenAI-compatible proxy."""

from __future__ import annotations

from agentgym.proxy.native import NativePlayer
from agentgym.proxy.players import AgentSettings, ProxyPlayers
from agentgym.rollout.loop import PlayerFactory
from agentgym.schema import TrainConfig


def episode_players(config: TrainConfig) -> PlayerFactory | None:
    """Who plays the episodes (``agent.kind``): None, the env manager's own loop; for
    ``native``, the envs' own conversations (:class:`NativePlayer`); for ``proxy``,
    agents through the OpenAI-compatible proxy (one server per event loop, shared by the
    train and validation episodes; under ``distributed=ray``, one in each engine's
    process)."""
    agent = config.agent
    if agent.kind == "env":
        return None
    if agent.kind == "native":  # the env owns the conversation (ROLL's agent-native envs)
        return NativePlayer
    return ProxyPlayers(
        AgentSettings(runner=agent.runner, timeout=agent.timeout, host=agent.host, port=agent.port),
        on_engines=config.distributed == "ray",
    )
