"""The GRPO recipe: one function that reads top to bottom.

rollout → advantages → ``ppo_epochs`` of mini-batch updates → weight sync →
metrics → validation every ``eval_steps`` (with renders) → checkpoint every
``save_steps``. :mod:`agentgym.train` builds the parts from the config.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from agentgym.rollout.backends.base import GenerationBackend
from agentgym.rollout.backends.hf import HFBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, collect
from agentgym.rollout.render import dump_trajectories, render_trajectories
from agentgym.trainers.advantages import (
    anchor_state_advantages,
    compute_advantages,
    normalize_rewards,
)
from agentgym.trainers.checkpoint import (
    latest_checkpoint,
    rng_state,
    save_checkpoint,
    save_json_atomic,
    set_rng_state,
)
from agentgym.trainers.losses import (
    aggregate_loss,
    kl_penalty,
    logprob_gap_metrics,
    policy_loss,
    truncated_is_weights,
)
from agentgym.trainers.strategy import ModelOutputs, TorchStrategy, forward, micro_batches
from agentgym.trainers.tracking import Tracker, progress
from agentgym.trajectory import RolloutBatch

OLD_LOGPROBS = ("trainer", "engine")  # where π_old of the PPO ratio comes from


@dataclass(frozen=True)
class GRPOConfig:
    """The algorithm's settings (see ``configs/config.yaml`` for each one's meaning)."""

    max_steps: int
    save_steps: int
    logging_steps: int
    eval_steps: int
    ppo_epochs: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    adv_estimator: str
    gamma: float
    whiten_advantages: bool
    reward_clip: float | None
    advantage_clip: float | None
    grouping: str
    normalization: str
    drop_zero_variance_groups: bool
    clip_ratio_low: float
    clip_ratio_high: float
    dual_clip_ratio_c: float | None
    loss_agg_mode: str
    use_kl_loss: bool
    kl_loss_coef: float
    kl_penalty: str
    add_token_level_kl: bool
    init_kl_coef: float
    entropy_loss_coef: float
    tis_cap: float | None
    val_renders: int
    seed: int
    old_logprobs: str
    step_score: str = "turn"
    step_advantage_weight: float = 0.0
    step_gamma: float = 0.95

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference model is needed (a KL term is used)."""
        return self.use_kl_loss or self.add_token_level_kl


@dataclass
class TrainParts:
    """Everything the recipe runs on, built by :func:`agentgym.train.build`."""

    strategy: TorchStrategy
    reference: Any | None
    backend: GenerationBackend
    chat: ChatTokenizer
    train_manager: EnvManager
    val_manager: EnvManager
    train_rollout: RolloutConfig
    val_rollout: RolloutConfig
    tracker: Tracker
    checkpoint_dir: Path
    render_dir: Path | None
    dump_dir: Path | None
    meta: dict[str, Any]
    pad_token_id: int


def train(config: GRPOConfig, parts: TrainParts, *, resume: bool | str = False) -> None:
    """Run GRPO from step 1 (or after the checkpoint ``resume`` names) to ``max_steps``."""
    loop = asyncio.new_event_loop()
    step = restore(parts, resume) if resume else 0
    try:
        if step == 0 and config.eval_steps:
            validate(config, parts, loop, step=0)
        while step < config.max_steps:
            step += 1
            started = time.perf_counter()
            parts.strategy.model.eval()
            episodes = len(parts.train_manager.slots) * parts.train_manager.max_traj_per_env
            with progress(episodes, f"step {step} rollout", enabled=sys.stderr.isatty()) as bar:
                rollout = loop.run_until_complete(
                    collect(
                        parts.train_manager,
                        parts.backend,
                        parts.chat,
                        parts.train_rollout,
                        policy_version=step - 1,
                        on_trajectory=lambda _: bar.update(1),
                    )
                )
            metrics = {f"train/{key}": value for key, value in rollout.metrics.items()}
            metrics["time/rollout"] = time.perf_counter() - started
            if parts.dump_dir is not None:
                dump_trajectories(
                    rollout.trajectories, parts.dump_dir, name=f"step_{step}", meta=parts.meta
                )

            batch = prepare_batch(config, parts, rollout.trajectories, metrics)
            trained = time.perf_counter()
            if batch is not None:
                metrics.update(update_policy(config, parts, batch, step))
                sync_weights(parts, loop)
            metrics["time/train"] = time.perf_counter() - trained

            metrics["time/step"] = time.perf_counter() - started
            if step % config.logging_steps == 0 or step == config.max_steps:
                parts.tracker.log(metrics, step)
            if config.eval_steps and (step % config.eval_steps == 0 or step == config.max_steps):
                validate(config, parts, loop, step=step)
            if step % config.save_steps == 0 or step == config.max_steps:
                checkpoint(parts, step)
    finally:
        loop.run_until_complete(parts.backend.close())
        loop.close()
        parts.tracker.close()


def prepare_batch(
    config: GRPOConfig, parts: TrainParts, trajectories: list[Any], metrics: dict[str, float]
) -> RolloutBatch | None:
    """Pad the samples, recompute π_old (and the reference), and compute advantages.

    Returns None when no sample carries a learning signal (all groups dropped).
    """
    try:
        batch = RolloutBatch.from_trajectories(
            trajectories,
            pad_token_id=parts.pad_token_id,
            step_score=config.step_score,
            step_gamma=config.step_gamma,
        )
    except ValueError:
        metrics["train/kept_samples"] = 0.0
        return None
    step_advantages = step_level_advantages(config, batch, metrics)  # [B] or None
    if config.drop_zero_variance_groups:
        keep = varied_groups(batch.scores, batch.group_ids)  # [B]
        if step_advantages is not None:
            keep |= step_advantages != 0
        metrics["train/kept_samples"] = float(keep.sum())
        if not bool(keep.any()):
            return None
        if step_advantages is not None:
            step_advantages = step_advantages[keep]
        batch = batch.rows(keep.nonzero()[:, 0], width=int(batch.attention_mask[keep].sum(1).max()))
    mask = batch.loss_mask.float()  # [B, T]
    if config.old_logprobs == "engine":
        # π_old is the policy that sampled: the engine's logprobs, no forward pass
        batch.old_logprobs = batch.engine_logprobs * mask
    else:
        batch.old_logprobs = parts.strategy.logprobs(batch, config.micro_batch_size) * mask
        metrics.update(
            {f"actor/engine_{k}": float(v) for k, v in
             logprob_gap_metrics(batch.old_logprobs, batch.engine_logprobs, mask).items()}
        )  # fmt: skip
    if config.tis_cap is not None:
        batch.is_weights = truncated_is_weights(
            batch.old_logprobs, batch.engine_logprobs, mask, config.tis_cap
        )
    scores = batch.scores
    token_rewards = batch.token_rewards
    if config.needs_reference:
        batch.ref_logprobs = reference_logprobs(parts.reference, batch, config.micro_batch_size)
        if config.add_token_level_kl:
            kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, config.kl_penalty) * mask
            token_rewards = token_rewards - config.init_kl_coef * kl
            scores = scores - config.init_kl_coef * kl.sum(1)
            metrics["actor/token_level_kl"] = float(kl.sum() / mask.sum().clamp(min=1))
    normalized = normalize_rewards(
        scores,
        grouping=config.grouping,
        method=config.normalization,
        group_ids=batch.group_ids,
        tags=batch.tags,
        reward_clip=config.reward_clip,
    )
    if step_advantages is not None:
        normalized = normalized + config.step_advantage_weight * step_advantages
    batch.advantages = compute_advantages(
        config.adv_estimator,
        normalized_scores=normalized,
        token_rewards=token_rewards,
        loss_mask=batch.loss_mask,
        gamma=config.gamma,
        whiten=config.whiten_advantages,
        clip=config.advantage_clip,
    )
    return batch


def update_policy(
    config: GRPOConfig, parts: TrainParts, batch: RolloutBatch, step: int
) -> dict[str, float]:
    """``ppo_epochs`` passes of mini-batch updates; returns the averaged loss metrics."""
    minibatch = config.micro_batch_size * config.gradient_accumulation_steps
    generator = torch.Generator().manual_seed(config.seed * 100_003 + step)
    totals: dict[str, float] = {}
    updates = 0
    total = config.ppo_epochs * -(-len(batch) // minibatch)
    bar = progress(total, f"step {step} update", enabled=sys.stderr.isatty())
    for _ in range(config.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for start in range(0, len(batch), minibatch):
            rows = order[start : start + minibatch]
            chunk = batch.rows(rows, width=int(batch.attention_mask[rows].sum(1).max()))
            # normalizers of the whole mini-batch: the micro-batch losses then add up to it
            num_tokens = chunk.loss_mask.sum().clamp(min=1)
            num_seqs = (chunk.loss_mask.sum(1) > 0).sum().clamp(min=1)
            step_metrics = parts.strategy.train_step(
                list(micro_batches(chunk, config.micro_batch_size)),
                make_loss(config, parts.reference, num_tokens=num_tokens, num_seqs=num_seqs),
                sum_parts=True,
                with_entropy=config.entropy_loss_coef != 0,
                with_logits=config.use_kl_loss and config.kl_penalty == "full",
            )
            for key, value in step_metrics.items():
                totals[key] = totals.get(key, 0.0) + value
            updates += 1
            bar.update(1)
    bar.close()
    return {f"actor/{key}": value / updates for key, value in totals.items()} | {
        "actor/updates": float(updates)
    }


def make_loss(
    config: GRPOConfig,
    reference: Any | None,
    *,
    num_tokens: torch.Tensor | None = None,
    num_seqs: torch.Tensor | None = None,
) -> Callable[[ModelOutputs, RolloutBatch], tuple[torch.Tensor, dict[str, float]]]:
    """The per-micro-batch loss: PPO-clip, plus KL and entropy terms when configured.

    ``num_tokens``/``num_seqs`` are the mini-batch's counts, so that each
    micro-batch's loss is its share of the mini-batch loss (exact accumulation).
    """

    def loss_fn(outputs: ModelOutputs, part: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        assert part.old_logprobs is not None
        assert part.advantages is not None
        mask = part.loss_mask.float()
        loss, raw = policy_loss(
            outputs.logprobs,
            part.old_logprobs,
            part.advantages,
            mask,
            clip_ratio_low=config.clip_ratio_low,
            clip_ratio_high=config.clip_ratio_high,
            dual_clip=config.dual_clip_ratio_c,
            loss_agg_mode=config.loss_agg_mode,
            is_weights=part.is_weights,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
        )
        metrics = {key: float(value) for key, value in raw.items()}
        metrics["pg_loss"] = float(loss.detach())
        if config.use_kl_loss:
            assert part.ref_logprobs is not None
            ref_logits = None
            if config.kl_penalty == "full":
                with torch.no_grad():
                    ref_logits = forward(reference, part, with_logits=True).logits
            kl = kl_penalty(
                outputs.logprobs,
                part.ref_logprobs,
                config.kl_penalty,
                logits=outputs.logits,
                ref_logits=ref_logits,
            )
            kl_loss = aggregate_loss(
                kl, mask, config.loss_agg_mode, num_tokens=num_tokens, num_seqs=num_seqs
            )
            loss = loss + config.kl_loss_coef * kl_loss
            metrics["kl"] = float(kl_loss.detach())
        if config.entropy_loss_coef:
            assert outputs.entropy is not None
            entropy = aggregate_loss(
                outputs.entropy,
                mask,
                config.loss_agg_mode,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
            )
            loss = loss - config.entropy_loss_coef * entropy
            metrics["entropy"] = float(entropy.detach())
        metrics["loss"] = float(loss.detach())
        return loss, metrics

    return loss_fn


def sync_weights(parts: TrainParts, loop: asyncio.AbstractEventLoop) -> None:
    """Send the new weights to the generation backend (HF sharing the model needs nothing)."""
    backend = parts.backend
    if isinstance(backend, HFBackend) and backend.model is parts.strategy.model:
        return
    loop.run_until_complete(backend.update_weights(parts.strategy.export_weights()))


def validate(
    config: GRPOConfig, parts: TrainParts, loop: asyncio.AbstractEventLoop, *, step: int
) -> None:
    """Run the validation episodes (fixed seeds), log ``val/*`` and render some of them."""
    parts.strategy.model.eval()
    result = loop.run_until_complete(
        collect(
            parts.val_manager, parts.backend, parts.chat, parts.val_rollout, policy_version=step
        )
    )
    parts.tracker.log({f"val/{key}": value for key, value in result.metrics.items()}, step)
    if parts.render_dir is not None and config.val_renders:
        render_trajectories(result.trajectories[: config.val_renders], parts.render_dir, step)


def checkpoint(parts: TrainParts, step: int) -> Path:
    """Save model, optimizer, scheduler, RNG, step, seed cursor and tracker run id, atomically."""

    def write(directory: Path) -> None:
        parts.strategy.save(directory)
        torch.save(rng_state(), directory / "rng.pt")
        save_json_atomic(
            directory / "trainer_state.json",
            {
                "step": step,
                "train_env_manager": parts.train_manager.state_dict(),
                "tracker_run_id": parts.tracker.run_id,
            },
        )

    return save_checkpoint(parts.checkpoint_dir, step, write)


def restore(parts: TrainParts, resume: bool | str) -> int:
    """Load the latest checkpoint (or the one ``resume`` names); return its step
    (0 when ``resume`` is True and no checkpoint exists yet).

    Raises:
        FileNotFoundError: If the checkpoint ``resume`` names is not a complete one.
    """
    import json

    path = Path(resume) if isinstance(resume, str) else latest_checkpoint(parts.checkpoint_dir)
    if path is None and resume is True:
        print(f"resume_from_checkpoint: no checkpoint in {parts.checkpoint_dir} yet; from step 0")
        return 0
    if path is None or not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(
            f"resume_from_checkpoint: no complete checkpoint in {parts.checkpoint_dir} "
            f"(got {resume!r}); set resume_from_checkpoint=false to start afresh"
        )
    state = json.loads((path / "trainer_state.json").read_text())
    parts.strategy.load(path)
    parts.train_manager.load_state_dict(state["train_env_manager"])
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    return int(state["step"])


def step_level_advantages(
    config: GRPOConfig, batch: RolloutBatch, metrics: dict[str, float]
) -> torch.Tensor | None:
    """GiGPO's step-level term ``[B]`` (see :func:`anchor_state_advantages`); None when off."""
    if not config.step_advantage_weight:
        return None
    if batch.step_returns is None or batch.state_ids is None:
        raise ValueError("GiGPO needs the batch's step_returns and state_ids (from_trajectories)")
    sizes = torch.bincount(batch.state_ids)[batch.state_ids]  # [B]
    metrics["train/anchor_state_share"] = float((sizes > 1).float().mean())
    metrics["train/anchor_state_groups"] = float(torch.unique(batch.state_ids).numel())
    return anchor_state_advantages(batch.step_returns, batch.state_ids, config.normalization)


def varied_groups(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``[B]`` True for samples whose GRPO group's scores are not all equal."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1
    high = torch.full((groups,), -torch.inf).scatter_reduce(0, inverse, scores, "amax")
    low = torch.full((groups,), torch.inf).scatter_reduce(0, inverse, scores, "amin")
    return (high > low)[inverse]


@torch.no_grad()
def reference_logprobs(reference: Any, batch: RolloutBatch, micro_batch_size: int) -> torch.Tensor:
    """``[B, T]`` log-probabilities under the frozen reference model."""
    width = batch.input_ids.shape[1]
    parts = []
    for part in micro_batches(batch, micro_batch_size):
        values = forward(reference, part).logprobs
        parts.append(torch.nn.functional.pad(values, (0, width - values.shape[1])))
    return torch.cat(parts) * batch.loss_mask


def with_seed(config: RolloutConfig, seed: int | None) -> RolloutConfig:
    """``config`` with its sampling seed set."""
    return replace(config, sampling=replace(config.sampling, seed=seed))
