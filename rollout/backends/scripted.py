"""Scripted policies as a backend: an agent writes the text, the tokenizer makes it ids.

This is how an env is checked end to end (chat template, rollout, rewards,
renders, dumps) without a model. For an env on an env worker the agent
acts there, where the env's state is (:meth:`WorkerEnv.act
<agentgym.rollout.worker_client.WorkerEnv.act>`); only the text comes back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from agentgym.envs.scripted import Agent, make_agent
from agentgym.rollout.backends.base import Generation, GenerationError, SamplingParams
from agentgym.rollout.worker_client import WorkerEnv

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
        self.agent = agent
        self.seed = seed
        self._factory: Callable[[], Agent] = lambda: make_agent(agent, seed)
        make_agent(agent, seed)  # fail fast on an unknown name
        self._agents: dict[int, Agent] = {}
        self._owner = uuid.uuid4().hex  # names this backend's agents on env workers

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Write the agent's response to ``env``'s current state, as token ids.

        ``env`` is the env itself, or the :class:`~agentgym.rollout.worker_client.WorkerEnv`
        client of an env on a worker.
        """
        if env is None:
            raise GenerationError("ScriptedBackend needs the request's env")
        if isinstance(env, WorkerEnv):
            text = await env.act(self.agent, self.seed, self._owner)
        else:
            text = self._act(env)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        ids = [*ids[: params.max_new_tokens - 1], self.tokenizer.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")

    def _act(self, env: TextEnv) -> str:
        agent = self._agents.get(id(env))
        if agent is None:
            agent = self._agents[id(env)] = self._factory()
        if env.num_steps == 0:  # the first turn of an episode
            agent.reset(env)
        return agent.act(env)

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Scripted agents have no weights."""

    async def close(self) -> None:
        """Nothing to release."""
