"""Scripted agents that answer in an env's response format.

They stand in for a model: for evaluation baselines, smoke tests and expert
demonstrations. Each agent maps the env's state to the *text* a model would
write, so everything downstream (parsing, rewards) is exercised for real.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from agentgym.envs.parsing import ACTION_SEPARATOR
from agentgym.envs.text_env import TextEnv


def format_response(actions: Sequence[str], response_format: str, think: str = "") -> str:
    """Write actions the way a well-behaved model would.

    Args:
        actions: Action names, joined with ``||``.
        response_format: ``"answer"`` or ``"think_answer"``.
        think: Text of the think block (``think_answer`` only).

    Returns:
        For example ``"<answer>Up</answer>"``.
    """
    answer = f"<answer>{f' {ACTION_SEPARATOR} '.join(actions)}</answer>"
    if response_format == "think_answer":
        return f"<think>{think}</think>{answer}"
    return answer


class Agent(Protocol):
    """Something that writes a response to the env's current state."""

    def reset(self, env: TextEnv) -> None:
        """Called after each ``env.reset``."""

    def act(self, env: TextEnv) -> str:
        """The response text for the env's current state."""


class SolverAgent:
    """Plays the env's expert: ``env.oracle_response()`` where the env has one
    (the text an expert would write now, e.g. a tool call or WebShop action),
    else the plan of ``env.solve()``, one action per turn.

    Raises:
        TypeError: If the env has neither.
    """

    def __init__(self) -> None:
        self._plan: list[str] = []

    def reset(self, env: TextEnv) -> None:
        if callable(getattr(env, "oracle_response", None)):
            return
        solve = getattr(env, "solve", None)
        if solve is None:
            raise TypeError(
                f"{type(env).__name__} has neither oracle_response() nor solve(); use agent=random"
            )
        self._plan = list(solve() or [])

    def act(self, env: TextEnv) -> str:
        oracle = getattr(env, "oracle_response", None)
        if callable(oracle):
            return str(oracle())
        if not self._plan:  # unsolvable or off-plan: any action keeps the episode going
            return format_response([env.action_names[0]], env.response_format)
        return format_response([self._plan.pop(0)], env.response_format, think="solver plan")


class RandomAgent:
    """Picks uniformly random actions from the env's vocabulary.

    Args:
        seed: Seed of the agent's own generator.
    """

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def reset(self, env: TextEnv) -> None:
        return None

    def act(self, env: TextEnv) -> str:
        if not env.action_names:
            raise TypeError(
                f"{type(env).__name__} has no fixed action vocabulary for agent=random; "
                "use agent=solver or a model"
            )
        name = env.action_names[int(self._rng.integers(len(env.action_names)))]
        return format_response([name], env.response_format, think="random")


AGENTS: dict[str, Callable[[int], Agent]] = {
    "solver": lambda seed: SolverAgent(),
    "random": RandomAgent,
}
"""Scripted agent factories by config name; each takes a seed."""


def make_agent(name: str, seed: int = 0) -> Agent:
    """Build a scripted agent by name.

    Raises:
        ValueError: If ``name`` is not in :data:`AGENTS`.
    """
    if name not in AGENTS:
        raise ValueError(f"Unknown agent {name!r}; valid options: {sorted(AGENTS)}")
    return AGENTS[name](seed)
