"""``async_generation_ratio`` 0 against 1: the real recipe, with the HF engine and the
torch trainer in one process on the same device, and a long-tailed env.

As ``benchmarks/test_async_benchmark.py`` does on the CPU, but the engine is real and
the long tail is the env's: :class:`SlowSokobanEnv` sleeps ``step_seconds × factor``
before each step, ``factor`` log-normal (σ ``sigma``) drawn per episode from its
seed (as a tool call or a simulator would be slow for some episodes). Honest about
the hardware: one GPU is shared, so at ratio 1 generation and training compete for it
and what overlaps is mainly the env's waiting. Figures: the mean step time over the
steps after the first (the first fills the pipeline), from the run's own
``metrics.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any, ClassVar

from agentgym.envs.sokoban import SokobanEnv

from .runner import Context, Deadline

SLOW_ENV = "gpu_suite_slow_sokoban"


class SlowSokobanEnv(SokobanEnv):
    """Sokoban whose every step first sleeps ``step_seconds × factor`` (``factor``
    log-normal with σ ``sigma``, drawn at each reset from the reset's seed)."""

    inline_calls: ClassVar[bool] = False  # it waits: the rollout's thread pool runs it

    def __init__(self, *, step_seconds: float = 0.1, sigma: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_seconds, self.sigma = step_seconds, sigma
        self.factor = 1.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.factor = math.exp(random.Random(seed).gauss(0.0, self.sigma))
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        time.sleep(self.step_seconds * self.factor)
        return super().step(action)


def register_slow_env(step_seconds: float, sigma: float) -> None:
    """Register :class:`SlowSokobanEnv` under :data:`SLOW_ENV` (once per process)."""
    from agentgym.registry import register, unregister

    with contextlib.suppress(KeyError, ValueError):
        unregister(SLOW_ENV)
    register(SLOW_ENV, SlowSokobanEnv, kwargs={"step_seconds": step_seconds, "sigma": sigma})


def overrides(ctx: Context, ratio: float, output: Path) -> list[str]:
    """The run's Hydra overrides."""
    s = ctx.settings
    episodes = s.async_groups * s.async_group_size
    return [
        "env=sokoban", f"env.name={SLOW_ENV}", f"max_turns={s.async_turns}",
        "sequence_length=1024", "generation=hf", f"generation.max_new_tokens={s.async_new_tokens}",
        f"train_env_manager.env_groups={s.async_groups}",
        f"train_env_manager.group_size={s.async_group_size}",
        "rollout_mode=trajectory", "step_advantage_weight=0", f"rollout_batch_size={episodes}",
        f"actor_train.training_args.per_device_train_batch_size={min(episodes, 8)}",
        f"actor_train.training_args.gradient_accumulation_steps={max(1, episodes // 8)}",
        "reward_normalization.method=identity", "drop_zero_variance_groups=false",
        "model.warm_start=null", f"model.path={ctx.model(s.async_shape)}",
        f"model.dtype={s.dtype}", f"model.device={s.device}", "eval_steps=0",
        f"max_steps={s.async_steps}", f"save_steps={s.async_steps}", "render_save_dir=null",
        f"output_dir={output}", f"async_generation_ratio={ratio}",
    ]  # fmt: skip


def run_ratio(ctx: Context, ratio: float, output: Path) -> dict[str, float]:
    """One recipe run; the mean ``time/*`` of its steps after the first."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from agentgym.builders.train import build_train
    from agentgym.schema import validate
    from agentgym.trainers.grpo import train

    with initialize_config_module("agentgym.configs", version_base=None):
        raw: Any = OmegaConf.to_container(
            compose("config", overrides=overrides(ctx, ratio, output)), resolve=True
        )
    config, parts = build_train(validate(raw), raw)
    train(config, parts)
    rows = [
        json.loads(line) for line in (output / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [row for row in rows if "time/step" in row and row["step"] > 1]
    if not steps:
        raise RuntimeError(f"no step after the first in {output}/logs/metrics.jsonl")
    return {
        key: statistics.mean(row[key] for row in steps)
        for key in ("time/step", "time/rollout", "time/train")
    }


def async_ratio(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """Mean step time at ``async_generation_ratio`` 0 and 1 (one run each)."""
    s = ctx.settings
    register_slow_env(s.env_seconds, s.env_sigma)
    ctx.model(s.async_shape)  # built outside the timed runs
    sync = run_ratio(ctx, 0.0, ctx.work_dir / "async-ratio-0")
    ctx.release()
    overlapped = run_ratio(ctx, 1.0, ctx.work_dir / "async-ratio-1")
    return {
        "ratio0_step_s": sync["time/step"],
        "ratio0_rollout_s": sync["time/rollout"],
        "ratio0_train_s": sync["time/train"],
        "ratio1_step_s": overlapped["time/step"],
        "ratio1_train_s": overlapped["time/train"],
        "speedup": sync["time/step"] / overlapped["time/step"],
        "bound_fraction": max(sync["time/rollout"], sync["time/train"]) / overlapped["time/step"],
        "steps": float(s.async_steps),
    }
