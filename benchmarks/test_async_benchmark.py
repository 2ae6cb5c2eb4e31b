"""Step time at ``async_generation_ratio`` 0, 1 and 2: the real recipe and trainer (the
tiny model, in process) against a simulated generation backend with long-tailed episodes.

Each episode draws a slowness factor from a log-normal distribution (σ = 1) when it
starts; each of its requests then takes ``BASE_SECONDS × factor`` (an
``asyncio.sleep``: the backend uses no CPU, so rollout and training can overlap even
on 2 cores). The ideal pipeline bound is ``max(rollout, train)`` per step, from the
synchronous run's own ``time/rollout`` and ``time/train``; the synchronous step is
their sum. Figures: the mean step time over the steps after the first (the first
fills the pipeline).

Run: ``python -m pytest benchmarks/test_async_benchmark.py --benchmark-only -s``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from dry import sized
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from agentgym.rollout.backends.base import Generation, SamplingParams

STEPS = sized(8, 2)  # dry: the figures are the steps after the first
BASE_SECONDS = sized(0.12, 0.01)
SIGMA = 1.0
SMALL = [
    "env=sokoban", "max_turns=3", "sequence_length=768", "generation=hf",
    "generation.max_new_tokens=8", "train_env_manager.env_groups=4",
    "train_env_manager.group_size=4", "rollout_mode=trajectory", "step_advantage_weight=0",
    "rollout_batch_size=16", "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=2", "ppo_epochs=2",
    "reward_normalization.method=identity", "drop_zero_variance_groups=false",
    "model.warm_start=null", "eval_steps=0", f"max_steps={STEPS}",
    f"save_steps={STEPS}", "old_logprobs=trainer",
]  # fmt: skip
"""``old_logprobs=trainer``: the backend's logprobs are made up (-1 a token), so as π_old
they put every PPO ratio outside the clip range and the trainer got zero gradients."""
RESULTS: dict[float, dict[str, float]] = {}


def use_backend(parts: Any, backend: Any) -> None:
    """Generate with ``backend`` in the parts' train and validation episodes (their
    rollout source plays ``parts.train``, so it sees the swap)."""
    for rollout in (parts.train, parts.val):
        if rollout is not None:
            rollout.backend = backend


class LongTailBackend:
    """Answers ``<answer>Up</answer>`` after ``base × factor`` seconds; ``factor`` is
    log-normal, drawn per episode (its first request)."""

    def __init__(self, response_ids: Sequence[int], base: float, sigma: float, seed: int) -> None:
        self.response_ids = list(response_ids)
        self.base, self.sigma = base, sigma
        self.random = random.Random(seed)
        self.factors: dict[int, float] = {}

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        if env.num_steps == 0:
            self.factors[id(env)] = math.exp(self.random.gauss(0.0, self.sigma))
        await asyncio.sleep(self.base * self.factors[id(env)])
        return Generation(self.response_ids, [-1.0] * len(self.response_ids), "stop")

    async def update_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        for _ in weights:  # read them, as an engine would
            pass

    async def close(self) -> None:
        return None


def run(ratio: float, output: Path, cache: Path) -> dict[str, float]:
    from agentgym.builders.train import build_train
    from agentgym.schema import validate
    from agentgym.trainers.grpo import train

    overrides = [*SMALL, f"model.cache_dir={cache}", f"output_dir={output}"]
    with initialize_config_module("agentgym.configs", version_base=None):
        raw: Any = OmegaConf.to_container(
            compose("config", overrides=[*overrides, f"async_generation_ratio={ratio}"]),
            resolve=True,
        )
    config, parts = build_train(validate(raw), raw)
    assert parts.train is not None
    tokenizer = parts.train.chat.tokenizer
    response = [*tokenizer.encode("<answer>Up</answer>"), tokenizer.eos_token_id]
    use_backend(parts, LongTailBackend(response, BASE_SECONDS, SIGMA, seed=0))
    train(config, parts)
    rows = [
        json.loads(line) for line in (output / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [row for row in rows if "time/step" in row and row["step"] > 1]
    return {
        key: statistics.mean(row[key] for row in steps)
        for key in ("time/step", "time/rollout", "time/train", "actor/grad_norm")
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.mark.parametrize("ratio", sized([0, 1, 2], [0, 1]))
def test_async_step_time_against_the_pipeline_bound(
    benchmark: Any, ratio: float, tmp_path: Path, cache: Path
) -> None:
    figures = benchmark.pedantic(run, args=(ratio, tmp_path / "run", cache), rounds=1, iterations=1)
    RESULTS[ratio] = figures
    assert figures["actor/grad_norm"] > 0  # the trainer does real work
    line = (
        f"\nratio {ratio}: step {figures['time/step']:.3f} s "
        f"(mean grad norm {figures['actor/grad_norm']:.3g})"
    )
    if 0 in RESULTS:
        sync = RESULTS[0]
        bound = max(sync["time/rollout"], sync["time/train"])
        line += (
            f"; synchronous rollout {sync['time/rollout']:.3f} s + train "
            f"{sync['time/train']:.3f} s = {sync['time/step']:.3f} s; bound max() = {bound:.3f} s; "
            f"bound / step = {bound / figures['time/step']:.0%}"
        )
        benchmark.extra_info["bound_fraction"] = bound / figures["time/step"]
    print(line)
