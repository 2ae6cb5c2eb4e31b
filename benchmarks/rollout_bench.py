"""Helpers of the rollout benchmarks: an instant backend and an instant env.

With both instant, a rollout's wall time is the manager's own overhead per
env-turn: chat-template rendering, tokenization, asyncio scheduling, the
env thread pool hop and the bookkeeping of turns and trajectories.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import agentgym
from agentgym.envs.text_env import TextEnv
from agentgym.models.tiny import build_tokenizer
from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, collect

TURNS = 8


class InstantEnv(TextEnv):
    """A counter that never ends by itself: every step is a few microseconds."""

    action_names: ClassVar[tuple[str, ...]] = ("Up", "Down")

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        self.value = 0
        return {}

    def _apply(self, action: str) -> tuple[float, bool]:
        self.value += 1
        return 0.0, False

    def _observation(self) -> str:
        return f"value {self.value}"

    def _success(self) -> bool:
        return False


class InstantBackend:
    """Answers every request at once with the same ids."""

    def __init__(self, response_ids: Sequence[int]) -> None:
        self.response_ids = list(response_ids)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        return Generation(self.response_ids, [0.0] * len(self.response_ids), "stop")

    async def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass(frozen=True)
class OverheadFigures:
    envs: int
    env_turns: int
    seconds: float
    env_step_seconds: float
    peak_bytes: int

    @property
    def overhead_ms_per_env_turn(self) -> float:
        return 1000 * (self.seconds - self.env_step_seconds) / self.env_turns

    @property
    def bytes_per_env(self) -> float:
        return self.peak_bytes / self.envs


def setup(envs: int) -> tuple[EnvManager, InstantBackend, ChatTokenizer]:
    """Register the instant env and build a manager of ``envs`` envs and a tokenizer."""
    if "instant_bench" not in agentgym.list_envs():
        agentgym.register("instant_bench", InstantEnv)
    tokenizer = build_tokenizer(
        [InstantEnv().instructions, "value 12", "<answer>Up</answer>"] * 4, 300, "chatml"
    )
    manager = EnvManager(tags=["instant_bench"], env_groups=envs, group_size=1)
    response = [*tokenizer.encode("<answer>Up</answer>"), tokenizer.eos_token_id]
    return manager, InstantBackend(response), ChatTokenizer(tokenizer)


def timed_config(max_turns: int, *, prefix_check: str = "off", **options: Any) -> RolloutConfig:
    """The benchmarks' rollout: whole trajectories of ``max_turns`` turns in a 4096-token
    window, the prefix check off (timed, not verified) unless asked for."""
    return RolloutConfig(
        mode="trajectory",
        max_turns=max_turns,
        sequence_length=4096,
        prefix_check=prefix_check,
        **options,
    )


def run_overhead(envs: int, prefix_check: str = "off") -> OverheadFigures:
    """Collect ``envs`` × :data:`TURNS` env-turns with instant env and backend."""
    manager, backend, chat = setup(envs)
    config = timed_config(TURNS, prefix_check=prefix_check)
    env = InstantEnv()
    env.reset(seed=0)
    start = time.perf_counter()
    for _ in range(TURNS):
        env.step("<answer>Up</answer>")
    step_seconds = (time.perf_counter() - start) / TURNS
    start = time.perf_counter()
    result = asyncio.run(collect(manager, backend, chat, config))
    seconds = time.perf_counter() - start
    turns = sum(len(t.turns) for t in result.trajectories)
    assert turns == envs * TURNS
    # memory in a second run: tracing slows Python down several-fold
    manager, backend, chat = setup(envs)
    tracemalloc.start()
    asyncio.run(collect(manager, backend, chat, config))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return OverheadFigures(envs, turns, seconds, step_seconds * turns, peak)


def build_model(path: str) -> str:
    """The tests' tiny model (random Qwen2, BPE on env text) in ``path``."""
    from agentgym.models.tiny import TinyModelSpec, build_tiny_model

    corpus = []
    for name in ("sokoban", "frozen_lake"):
        env = agentgym.make(name).unwrapped
        assert isinstance(env, TextEnv)
        for seed in range(8):
            observation, _ = env.reset(seed=seed)
            corpus += [observation, env.instructions]
    return str(build_tiny_model(corpus * 4, TinyModelSpec(), path))


@dataclass(frozen=True)
class ThroughputFigures:
    backend: str
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


async def sokoban_throughput(
    backend: Any, model_path: str, name: str, groups: int = 8, max_turns: int = 5
) -> ThroughputFigures:
    """Generated tokens per second of a Sokoban rollout: ``groups`` (8) × 4 envs,
    ``max_turns`` (5) turns, 32 tokens."""
    from transformers import AutoTokenizer

    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_path))
    manager = EnvManager(tags=["sokoban"], env_groups=groups, group_size=4, seed=0)
    config = timed_config(max_turns, sampling=SamplingParams(max_new_tokens=32, seed=0))
    await collect(manager, backend, chat, config)  # warm-up
    start = time.perf_counter()
    result = await collect(manager, backend, chat, config)
    seconds = time.perf_counter() - start
    tokens = sum(len(turn.response_ids) for t in result.trajectories for turn in t.turns)
    return ThroughputFigures(name, tokens, seconds)
