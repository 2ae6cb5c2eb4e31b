"""What one turn does to an episode's conversation and record, for every player (the
loop's :class:`~agentgym.rollout.loop.EpisodeRunner`, the proxy's and the agent-native
ones): the env's answer recorded on the turn and the trajectory, observations as chat
messages, the window of a ``step``-mode prompt, ``<think>`` blocks dropped from history."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentgym.rollout.chat import Message
from agentgym.rollout.workers import EnvStep
from agentgym.trajectory import Trajectory, Turn

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL | re.IGNORECASE)


def step_window(messages: Sequence[Message], history_length: int) -> int:
    """Where a ``step``-mode prompt's window of ``messages`` starts (the system prompt,
    ``messages[0]``, is always kept): the last ``history_length`` turns, each with the
    observation it answered, then the new observation."""
    assistant_positions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant_positions or history_length == 0:
        return assistant_positions[-1] + 1 if assistant_positions else 1
    start = assistant_positions[-history_length:][0]
    while start > 1 and messages[start - 1]["role"] != "assistant":
        start -= 1  # keep the observation the first kept response answered
    return start


def has_think(text: str) -> bool:
    """Whether ``text`` holds a ``<think>`` block."""
    return _THINK.search(text) is not None


def strip_think(text: str) -> str:
    """``text`` without its ``<think>`` blocks (``strip_think_history``)."""
    return _THINK.sub("", text)


def record_step(trajectory: Trajectory, turn: Turn, outcome: EnvStep) -> None:
    """What the env made of ``turn`` (its step's ``outcome``), on the turn and the
    trajectory: reward, validity and effect, actions, frame, score, success and the
    observation the episode is at."""
    info = outcome.info
    if outcome.frame is not None:
        trajectory.frames.append(outcome.frame)
    turn.reward = float(outcome.reward)
    turn.action_is_valid = bool(info["action_is_valid"])  # the env contract
    turn.action_is_effective = info.get("action_is_effective")
    turn.actions = list(info.get("actions", []))
    trajectory.final_observation = outcome.observation
    trajectory.unreported_info += bool(info.get("unreported_info"))
    trajectory.score += turn.reward
    trajectory.success = bool(info.get("success", False))


def observation_messages(observation: str, info: dict[str, Any]) -> list[Message]:
    """Tool results become ``tool`` messages; anything else is a ``user`` message."""
    results = info.get("tool_results")
    if results:
        return [{"role": "tool", "content": str(result)} for result in results]
    return [{"role": "user", "content": observation}]
