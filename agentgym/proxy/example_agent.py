"""The smallest complete agent that trains through the proxy (docs/agents.md shows it):
plain ``openai`` client code that knows nothing of agentgym but its base URL, key and
task. Train it with ``agent=proxy agent.runner=agentgym.proxy.example_agent:SokobanAgent``."""

from __future__ import annotations

import openai

import agentgym
from agentgym.proxy.runners import AgentResult, AgentTask


class SokobanAgent:
    """Plays the task's env with its own copy of it, one chat completion per move."""

    def run(self, task: AgentTask, base_url: str, api_key: str) -> AgentResult:
        client = openai.OpenAI(base_url=base_url, api_key=api_key)
        env = agentgym.make(task.env_name)
        observation, info = env.reset(seed=task.seed)
        messages = [
            {"role": "system", "content": env.unwrapped.instructions},  # type: ignore[attr-defined]
            {"role": "user", "content": observation},
        ]
        score = 0.0
        for _ in range(task.max_turns):
            reply = client.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
            action = reply.choices[0].message.content or ""
            observation, reward, terminated, truncated, info = env.step(action)
            score += float(reward)
            if terminated or truncated:
                break
            messages += [
                {"role": "assistant", "content": action},
                {"role": "user", "content": observation},
            ]
        client.close()
        return AgentResult(reward=score, success=bool(info.get("success", False)))
