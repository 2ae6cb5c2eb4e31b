"""What each spawned rank of the Megatron tests runs (importable by the children)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentgym.builders.recipe import default_grpo_config
from agentgym.trainers.strategies.optim import OptimizerConfig
from agentgym.trainers.updates import update_policy
from agentgym.trajectory import RolloutBatch
from tests.trainers.megatron.launch import Dealt
from tests.trainers.test_update_path import ragged_batch

# lr 1e-3: Adam turns a weight's near-zero gradient into a full-size step, so two
# implementations' float noise (summation order) shows up at lr × noise; at 1e-3
# that stays under 1e-5 while every weight still moves by ~1e-3 per step.
SETTINGS: dict[str, Any] = {
    "optimizer": OptimizerConfig(learning_rate=1e-3, max_grad_norm=1.0),
    "temperature": 0.7,
    "micro_batch_size": 2,
}
LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def grpo_config(mode: str = "seq-mean-token-mean") -> Any:
    return default_grpo_config(
        micro_batch_size=1,
        gradient_accumulation_steps=6,
        loss_agg_mode=mode,
        entropy_loss_coef=0.01,
        clip_ratio_low=0.1,
        clip_ratio_high=0.1,
    )


def megatron(model_dir: Path, rank: int, world: int, **config: Any) -> Dealt:
    from agentgym.trainers.strategies.megatron.strategy import MegatronStrategy

    return Dealt(MegatronStrategy(model_dir, **(SETTINGS | config)), rank, world)


def weights(strategy: Any) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in strategy.export_weights()}


PROMPT = 5
"""The prompt of :func:`prompted`'s rows: no loss on their first 5 positions."""


def prompted(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` with no loss on its first :data:`PROMPT` positions, as behind a prompt."""
    keep = (torch.arange(batch.input_ids.shape[1]) >= PROMPT).long()  # [T]
    batch.loss_mask = batch.loss_mask * keep
    for name in ("old_logprobs", "ref_logprobs", "advantages", "engine_logprobs"):
        setattr(batch, name, getattr(batch, name) * keep)
    return batch


def two_steps(strategy: Any, steps: tuple[int, ...] = (1, 2), *, prompt: bool = False) -> Any:
    """``update_policy`` on ragged batches (seeds 0, 1; :func:`prompted` ones with
    ``prompt``); metrics and the exported weights."""
    batches = [ragged_batch(step - 1) for step in steps]
    if prompt:
        batches = [prompted(batch) for batch in batches]
    metrics = [
        update_policy(grpo_config(), strategy, batch, step)
        for step, batch in zip(steps, batches, strict=True)
    ]
    return metrics, weights(strategy)


def prompted_steps(rank: int, world: int, model_dir: Path, config: dict[str, Any]) -> Any:
    """:func:`two_steps` on :func:`prompted` batches, and the positions every rank's LM
    head ran on in each pass."""
    import torch.distributed as dist

    dealt = megatron(model_dir, rank, world, **config)
    seen: list[int] = []
    head = getattr(dealt.strategy.model, "output_layer", None)
    if head is not None:  # the last pipeline stage's
        head.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[0]))
    run = two_steps(dealt, prompt=True)
    every: list[Any] = [None] * world
    dist.all_gather_object(every, seen)
    return run, [positions for rank_seen in every for positions in rank_seen]


def train_two_steps(rank: int, world: int, model_dir: Path, config: dict[str, Any]) -> Any:
    return two_steps(megatron(model_dir, rank, world, **config))


def every_loss_agg_mode(rank: int, world: int, model_dir: Path) -> list[dict[str, float]]:
    strategy = megatron(model_dir, rank, world)
    return [
        update_policy(grpo_config(mode), strategy, ragged_batch(index), index + 1)
        for index, mode in enumerate(LOSS_AGG_MODES)
    ]


def forward_checks(rank: int, world: int, model_dir: Path, config: dict[str, Any]) -> Any:
    """Logprobs at the sampling temperature, the full logits (PP = 1) and the
    exported weights."""
    from megatron.core import tensor_parallel

    from agentgym.trainers.strategies.megatron.cpu import device_mode

    strategy = megatron(model_dir, rank, world, **config)
    batch = ragged_batch(0)
    logprobs = strategy.logprobs(batch)
    logits = None
    if config.get("pipeline_model_parallel_size", 1) == 1:
        with device_mode(), torch.no_grad():
            local = strategy.model(batch.input_ids, batch.position_ids, None)  # [B, T, V/tp]
            logits = tensor_parallel.gather_from_tensor_model_parallel_region(local)
    return logprobs, logits, weights(strategy)


def step_save_step(
    rank: int, world: int, model_dir: Path, config: dict[str, Any], out: Path
) -> Any:
    strategy = megatron(model_dir, rank, world, **config)
    two_steps(strategy, (1,))
    strategy.save(out)
    return two_steps(strategy, (2,))


def save_step(rank: int, world: int, model_dir: Path, config: dict[str, Any], out: Path) -> Any:
    """A checkpoint before the first optimizer step (as when no sample was kept)."""
    strategy = megatron(model_dir, rank, world, **config)
    strategy.save(out)
    return two_steps(strategy, (2,))


def only_step(rank: int, world: int, model_dir: Path, config: dict[str, Any]) -> Any:
    return two_steps(megatron(model_dir, rank, world, **config), (2,))


def load_step(rank: int, world: int, model_dir: Path, config: dict[str, Any], out: Path) -> Any:
    strategy = megatron(model_dir, rank, world, **config)
    strategy.load(out)
    return two_steps(strategy, (2,))


LAYOUTS: dict[str, dict[str, Any]] = {
    "tp1_dp2": {},
    "tp2": {"tensor_model_parallel_size": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
}
"""The parallel layouts of two ranks (each rebuilds megatron-core's groups)."""


def forward_every_layout(rank: int, world: int, model_dir: Path) -> dict[str, Any]:
    return {
        name: forward_checks(rank, world, model_dir, config) for name, config in LAYOUTS.items()
    }


def train_every_layout(rank: int, world: int, model_dir: Path) -> dict[str, Any]:
    runs = {
        name: train_two_steps(rank, world, model_dir, config) for name, config in LAYOUTS.items()
    }
    prompted_runs = {
        name: prompted_steps(rank, world, model_dir, config) for name, config in LAYOUTS.items()
    }
    return {
        "runs": runs,
        "prompted": prompted_runs,
        "loss_agg_modes": every_loss_agg_mode(rank, world, model_dir),
        "unclipped": train_two_steps(rank, world, model_dir, {"optimizer": UNCLIPPED}),
    }


UNCLIPPED = OptimizerConfig(learning_rate=1e-3, max_grad_norm=None)
"""No gradient clipping: the step still reports the gradient's norm."""
