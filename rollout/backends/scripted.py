"""Scripted policies as a backend: an agent writes the text, the tokenizer makes it ids.

This is how an env is checked end to end (chat template, rollout, rewards,
renders, dumps) without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from agentgym.envs.scripted import Agent, make_agent
from agentgym.rollout.backends.base import Generation, GenerationError, SamplingParams

if TYPE_CHECKING:
    import torch

    from agentgym.envs.text_env import TextEnv


class ScriptedBackend:
    """Answer each request with a scripted agent's response to the request's env.

    Args:
        tokenizer: Tokenizes the agent's text; the response ends with EOS.
        agent: A name of :data:`agentgym.envs.scripted.AGENTS` (``"solver"``, ``"random"``).
        seed: Seed of the agents.
    """

    def __init__(self, tokenizer: Any, agent: str = "solver", seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self._factory: Callable[[], Agent] = lambda: make_agent(agent, seed)
        make_agent(agent, seed)  # fail fast on an unknown name
        self._agents: dict[int, Agent] = {}

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Write the agent's response to ``env``'s current state, as token ids."""
        if env is None:
            raise GenerationError("ScriptedBackend needs the request's env")
        agent = self._agents.get(id(env))
        if agent is None:
            agent = self._agents[id(env)] = self._factory()
        if env.num_steps == 0:  # the first turn of an episode
            agent.reset(env)
        text = agent.act(env)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        ids = [*ids[: params.max_new_tokens - 1], self.tokenizer.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Scripted agents have no weights."""

    async def close(self) -> None:
        """Nothing to release."""
