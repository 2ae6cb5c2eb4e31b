"""A Sokoban agent written with the OpenAI Agents SDK (``openai-agents``), as its users
write one: an ``Agent`` with instructions and a ``Runner`` loop, one run per move. Only
the client's base URL and key come from agentgym (the runner's arguments)."""

from __future__ import annotations

from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

import agentgym
from agentgym.proxy.runners import AgentResult, AgentTask

set_tracing_disabled(True)  # no traces to OpenAI's servers


class SokobanAgentsSDK:
    """Plays the task's Sokoban room: the SDK runs the model, the env judges each move."""

    async def run(self, task: AgentTask, base_url: str, api_key: str) -> AgentResult:
        env = agentgym.make(task.env_name)
        observation, info = env.reset(seed=task.seed)
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        agent = Agent(
            name="sokoban",
            instructions=env.unwrapped.instructions,  # type: ignore[attr-defined]
            model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        )
        history: list[Any] = [{"role": "user", "content": observation}]
        score, steps = 0.0, 0
        for _ in range(task.max_turns):
            result = await Runner.run(agent, history, max_turns=1)
            move = str(result.final_output)
            observation, reward, terminated, truncated, info = env.step(move)
            score, steps = score + float(reward), steps + 1
            if terminated or truncated:
                break
            history = [*result.to_input_list(), {"role": "user", "content": observation}]
        await client.close()
        return AgentResult(reward=score, success=bool(info.get("success", False)))
