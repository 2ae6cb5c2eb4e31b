"""Our rollout's own overhead beside ``compare_trl.py``'s runs: the wall time of 128
single-turn Sokoban episodes with an instant backend whose answers differ inside a
group, less the time spent in the env's own ``reset``/``step`` during that rollout, in
trajectory mode (with the prefix check) and step mode.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from compare_trl_runs import GROUP_SIZE, GROUPS, SEED, build_model, env_config

ANSWERS = (
    "<answer>Up</answer>",
    "<answer>Down</answer>",
    "<answer>Left</answer>",
    "<answer>Right</answer>",
    "<think>push the box up</think><answer>Up</answer>",
    "<think>the target is below</think><answer>Down</answer>",
    "Left",
    "<answer>Right, then Up</answer>",
)
"""What the overhead's instant backend answers, in turn: a group's 8 members answer
differently, as sampled answers do, so no member reuses another's prefix check."""


class VariedBackend:
    """Answers every request at once, cycling through ``answers`` (token ids)."""

    def __init__(self, answers: list[list[int]]) -> None:
        self.answers = answers
        self.calls = 0

    async def generate(self, prompt_ids: Any, params: Any, *, env: Any = None) -> Any:
        from agentgym.rollout.backends.base import Generation

        ids = self.answers[self.calls % len(self.answers)]
        self.calls += 1
        return Generation(ids, [0.0] * len(ids), "stop")

    async def update_weights(self, weights: Any) -> None:
        return None

    async def close(self) -> None:
        return None


OVERHEAD_SETUPS = (("step", "warn"), ("trajectory", "off"), ("trajectory", "warn"))
"""The overhead table's rows: (mode, prefix_check). Step mode is the Sokoban config's
(the compared training runs'); the prefix check runs in trajectory mode only."""


def rollout_overhead(
    mode: str = "trajectory",
    prefix_check: str = "warn",
    episodes: int = GROUPS * GROUP_SIZE,
    repeats: int = 20,
    model: Path | None = None,
) -> dict[str, Any]:
    """Our rollout's own milliseconds per ``episodes`` single-turn Sokoban episodes in
    ``mode`` with ``prefix_check``: the wall time with an instant backend, less the
    time spent inside the env's own ``reset`` and ``step`` during that rollout (median
    of ``repeats``; ``model``: the tokenizer's folder, default the compared runs')."""
    from transformers import AutoTokenizer

    from agentgym.envs.text_env import TextEnv
    from agentgym.rollout.chat import ChatTokenizer
    from agentgym.rollout.env_manager import EnvManager
    from agentgym.rollout.loop import RolloutConfig, collect

    model = model or build_model(Path(tempfile.gettempdir()) / "agentgym-compare-trl")
    tokenizer = AutoTokenizer.from_pretrained(model)
    chat = ChatTokenizer(tokenizer)
    config = env_config()
    answers = [
        [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        for text in ANSWERS
    ]
    backend = VariedBackend(answers)
    rollout = RolloutConfig(mode=mode, max_turns=1, sequence_length=4096, prefix_check=prefix_check)
    manager = EnvManager(  # built once and reused, as a training run does
        tags=["sokoban"],
        env_groups=episodes // GROUP_SIZE,
        group_size=GROUP_SIZE,
        seed=SEED,
        env_configs={"sokoban": {"name": "sokoban", "kwargs": config["kwargs"]}},
    )
    inside = [0.0]
    reset, step = TextEnv.reset, TextEnv.step

    def timed(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - start

        return call

    TextEnv.reset, TextEnv.step = timed(reset), timed(step)  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()
    walls, envs = [], []
    try:
        for _ in range(repeats + 1):  # the first call warms the loop's thread pool
            inside[0] = 0.0
            start = time.perf_counter()
            result = loop.run_until_complete(collect(manager, backend, chat, rollout))
            walls.append(time.perf_counter() - start)
            envs.append(inside[0])
            assert len(result.trajectories) == episodes
            assert len({tuple(t.input_ids) for t in result.trajectories}) >= episodes // 2
    finally:
        TextEnv.reset, TextEnv.step = reset, step  # type: ignore[method-assign]
        loop.close()
    walls, envs = walls[1:], envs[1:]
    return {
        "mode": mode,
        "prefix_check": prefix_check if mode == "trajectory" else "-",
        "episodes": episodes,
        "wall_ms": 1000 * statistics.median(walls),
        "env_ms": 1000 * statistics.median(envs),
        "overhead_ms": 1000 * statistics.median([w - e for w, e in zip(walls, envs, strict=True)]),
    }


def print_overhead(overhead: list[dict[str, Any]]) -> None:
    """Print one line per :func:`rollout_overhead` result."""
    for row in overhead:
        print(
            f"rollout overhead, {row['mode']} mode, prefix check {row['prefix_check']}: "
            f"{row['overhead_ms']:.1f} ms per "
            f"{row['episodes']} single-turn episodes (wall {row['wall_ms']:.1f} ms, "
            f"inside the env {row['env_ms']:.1f} ms)"
        )
