"""The GRPO recipe: one function that reads top to bottom.

rollout → advantages → ``ppo_epochs`` of mini-batch updates → weight sync →
metrics → validation every ``eval_steps`` (with renders) → checkpoint every
``save_steps``. The recipe sees only protocols (:class:`Strategy`,
:class:`GenerationBackend`, :class:`Tracker`); :mod:`agentgym.builders` makes
them from the config.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
import yaml

from agentgym.cluster import Cluster
from agentgym.fileio import write_json_atomic
from agentgym.rollout.backends.base import GenerationBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, RolloutResult, collect
from agentgym.rollout.metrics import failure_report
from agentgym.rollout.render import dump_trajectories, pick_renders, render_trajectories
from agentgym.rollout.router import Router
from agentgym.rollout.scheduler import AsyncRollout, PausableBackend, staleness_metrics
from agentgym.trainers.advantages import (
    anchor_state_advantages,
    compute_advantages,
    finish_advantages,
    normalize_rewards,
)
from agentgym.trainers.checkpoint import (
    latest_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from agentgym.trainers.correction import CorrectionConfig, correction_terms
from agentgym.trainers.gae import gae_advantages, value_loss
from agentgym.trainers.kl_control import KLController, current_kl, make_kl_controller
from agentgym.trainers.lifecycle import frames_of, phase_of, shut_down
from agentgym.trainers.loss_terms import group_difficulty, mix_losses, sample_weights, sft_loss
from agentgym.trainers.losses import (
    POLICY_LOSS_REDUCE,
    aggregate_loss,
    kl_penalty,
    policy_loss,
)
from agentgym.trainers.rewards import RunningMoments, process_rewards
from agentgym.trainers.strategies import (
    Critic,
    LossInputs,
    Metric,
    MetricReducer,
    ModelOutputs,
    Strategy,
    micro_batches,
)
from agentgym.trainers.tracking import Tracker, progress
from agentgym.trajectory import RolloutBatch, Trajectory

logger = logging.getLogger(__name__)
_R = TypeVar("_R")

RUN_CONFIG = "train_config.yaml"
"""The resolved config a run saves in its output folder and in each checkpoint."""

CRITIC_DIR = "critic"
"""The folder of a checkpoint that holds the critic (GAE's value model and optimizer)."""


class RolloutFailedError(RuntimeError):
    """More than ``max_failed_fraction`` of a step's episodes failed."""


class TrainingInterruptedError(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped the run; carries where it stopped: the step, the
    phase (:data:`~agentgym.trainers.lifecycle.PHASES`) and the last checkpoint."""

    def __init__(self, step: int, checkpoint: Path | None, phase: str = "training") -> None:
        super().__init__(step, checkpoint, phase)
        self.step = step
        self.checkpoint = checkpoint
        self.phase = phase


@dataclass(frozen=True)
class GRPOConfig:
    """The algorithm's settings; :mod:`agentgym.schema` documents each one and
    holds their defaults (``GRPOConfig.from_schema``-style builders pick them
    by name there, so a Python user and the command line get one algorithm)."""

    max_steps: int
    save_steps: int
    logging_steps: int
    eval_steps: int
    ppo_epochs: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    adv_estimator: str
    gamma: float
    lambd: float
    whiten_advantages: bool
    reward_clip: float | None
    use_reward_scaling: bool
    use_reward_norm: bool
    reward_norm: str | None
    reward_shift: bool
    reward_scale: bool
    whiten_rewards: bool
    advantage_clip: float | None
    grouping: str
    normalization: str
    drop_zero_variance_groups: bool
    clip_ratio_low: float
    clip_ratio_high: float
    dual_clip_ratio_c: float | None
    loss_agg_mode: str
    loss_scale_factor: int
    use_kl_loss: bool
    kl_loss_coef: float
    kl_penalty: str
    add_token_level_kl: bool
    init_kl_coef: float
    target_kl: float | None
    kl_horizon: int
    entropy_loss_coef: float
    sft_loss_coef: float
    rl_loss_coef: float
    use_topr_loss: bool
    length_loss_weight: bool
    difficulty_loss_weight: bool
    critic_warmup: int
    value_clip: float | None
    critic_micro_batch_size: int
    critic_gradient_accumulation_steps: int
    tis_cap: float | None
    val_renders: int
    seed: int
    old_logprobs: str
    train_infer_correction: CorrectionConfig
    step_score: str
    step_advantage_weight: float
    step_gamma: float
    max_failed_fraction: float
    rpc_timeout: float
    async_generation_ratio: float = 0.0
    """k > 0: rollout runs up to k steps ahead of training (docs/async.md)."""

    @property
    def uses_pipeline(self) -> bool:
        """Whether rollout runs ahead of training (``async_generation_ratio > 0``);
        ratio 0 is the synchronous recipe."""
        return self.async_generation_ratio > 0

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference model is needed (a KL term is used)."""
        return self.use_kl_loss or self.add_token_level_kl

    @property
    def processes_rewards(self) -> bool:
        """Whether the scores go through ROLL's reward processing (docs/rewards.md):
        with GAE, or any of ``use_reward_scaling``, ``reward_norm``, ``whiten_rewards``."""
        return (
            self.adv_estimator == "gae"
            or self.use_reward_scaling
            or self.reward_norm is not None
            or self.whiten_rewards
        )


@dataclass
class TrainParts:
    """Everything the recipe runs on, built by :func:`agentgym.builders.build_train`."""

    strategy: Strategy
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
    cluster: Cluster | None = None
    critic: Critic | None = None
    """GAE's value model (``adv_estimator: gae``)."""
    kl_controller: KLController | None = None
    """The beta of ``add_token_level_kl`` (:func:`kl_controller`)."""
    reward_moments: RunningMoments | None = None
    """Running reward statistics (``use_reward_scaling``, ``reward_norm: running``)."""


def train(config: GRPOConfig, parts: TrainParts, *, resume: bool | str = False) -> None:
    """Run GRPO from step 1 (or after the checkpoint ``resume`` names) to ``max_steps``.

    With ``async_generation_ratio`` k > 0 the rollout of the next steps runs while
    a step trains (:mod:`agentgym.rollout.scheduler`, docs/async.md); k = 0 is the
    synchronous recipe.

    Raises:
        RolloutFailedError: When too many of a step's episodes fail.
        TrainingInterruptedError: On Ctrl-C (or SIGTERM, :mod:`agentgym.stopping`), with
            the step, the phase and the last checkpoint.
        ShutdownError: When a part did not close at the end of the run.
        WeightSyncTimeoutError: When a weight sync under async generation hangs.
    """
    loop = asyncio.new_event_loop()
    step = 0
    pipeline: AsyncRollout | None = None
    try:
        if resume:
            step = restore(parts, resume)
            sync_weights(config, parts, loop)  # the engines sample with the checkpoint's weights
        if config.uses_pipeline:
            pipeline = start_async_rollout(config, parts, loop, step)
        if step == 0 and config.eval_steps:
            validate(config, parts, loop, step=0, pipeline=pipeline)
        while step < config.max_steps:
            step += 1
            started = time.perf_counter()
            parts.strategy.train(False)
            if pipeline is None:
                rollout = collect_step(parts, loop, step)
                metrics = {f"train/{key}": value for key, value in rollout.metrics.items()}
            else:
                waiting = pipeline.admission_wait
                rollout = loop.run_until_complete(pipeline.next_batch(step - 1))
                metrics = {f"train/{key}": value for key, value in rollout.metrics.items()}
                metrics["time/trainer_idle"] = time.perf_counter() - started
                metrics["time/rollout_idle"] = pipeline.admission_wait - waiting
                metrics |= staleness_metrics(
                    rollout.trajectories, step - 1, config.async_generation_ratio
                )
            metrics["train/failed"] = check_failures(config, rollout.trajectories, step)
            metrics["time/rollout"] = time.perf_counter() - started
            if parts.dump_dir is not None:
                dump_trajectories(
                    rollout.trajectories, parts.dump_dir, name=f"step_{step}", meta=parts.meta
                )

            if pipeline is None:
                batch = prepare_batch(config, parts, rollout.trajectories, metrics)
            else:  # in a thread, while the loop keeps the episodes of later steps going
                batch = in_thread(
                    loop, prepare_batch, config, parts, rollout.trajectories, metrics, step=step
                )
            trained = time.perf_counter()
            if batch is not None:
                if pipeline is None:
                    metrics.update(update_policy(config, parts.strategy, batch, step))
                    metrics["time/weight_sync"] = sync_weights(config, parts, loop)
                else:
                    metrics.update(
                        in_thread(loop, update_policy, config, parts.strategy, batch, step)
                    )
                    metrics |= async_sync_weights(config, parts, loop, pipeline)
                if isinstance(parts.backend, Router) and parts.backend.last_sync is not None:
                    metrics.update(parts.backend.last_sync.metrics())  # pack/transfer/load
            elif pipeline is not None:  # no update: same weights, the next version number
                pipeline.advance()
            metrics["time/train"] = time.perf_counter() - trained

            metrics["time/step"] = time.perf_counter() - started
            if step % config.logging_steps == 0 or step == config.max_steps:
                parts.tracker.log(metrics, step)
            if config.eval_steps and (step % config.eval_steps == 0 or step == config.max_steps):
                validate(config, parts, loop, step=step, pipeline=pipeline)
            if step % config.save_steps == 0 or step == config.max_steps:
                checkpoint(parts, step, pipeline=pipeline)
    except KeyboardInterrupt as interrupt:
        phase = phase_of(frames_of(interrupt.__traceback__)) or "training"
        shut_down(parts, loop, pipeline, unwinding=True)
        raise TrainingInterruptedError(
            step, latest_checkpoint(parts.checkpoint_dir), phase
        ) from None
    except BaseException:
        shut_down(parts, loop, pipeline, unwinding=True)
        raise
    shut_down(parts, loop, pipeline)


def in_thread(
    loop: asyncio.AbstractEventLoop, work: Callable[..., _R], *args: Any, **kwargs: Any
) -> _R:
    """Run ``work`` in a thread while ``loop`` keeps the episodes going; the thread uses
    this thread's torch thread count (a new thread's OpenMP team may differ, and with it
    the order of float reductions: the update would not be bit for bit the synchronous one)."""
    threads = torch.get_num_threads()

    def run() -> _R:
        torch.set_num_threads(threads)
        return work(*args, **kwargs)

    return loop.run_until_complete(asyncio.to_thread(run))


def collect_step(parts: TrainParts, loop: asyncio.AbstractEventLoop, step: int) -> RolloutResult:
    """The synchronous rollout of ``step``: the next batch, sampled with version ``step - 1``."""
    episodes = len(parts.train_manager.slots) * parts.train_manager.max_traj_per_env
    with progress(episodes, f"step {step} rollout", enabled=sys.stderr.isatty()) as bar:
        return loop.run_until_complete(
            collect(
                parts.train_manager,
                parts.backend,
                parts.chat,
                parts.train_rollout,
                policy_version=step - 1,
                on_trajectory=lambda _: bar.update(1),
            )
        )


def start_async_rollout(
    config: GRPOConfig, parts: TrainParts, loop: asyncio.AbstractEventLoop, step: int
) -> AsyncRollout:
    """Start the train envs' episodes ahead of training, from the batch of step ``step + 1``
    (the engines hold version ``step``)."""
    pipeline = AsyncRollout(
        parts.train_manager,
        PausableBackend(parts.backend, version=step),
        parts.chat,
        parts.train_rollout,
        ratio=config.async_generation_ratio,
        first_batch=step,
    )
    loop.call_soon(pipeline.start)
    return pipeline


def async_sync_weights(
    config: GRPOConfig,
    parts: TrainParts,
    loop: asyncio.AbstractEventLoop,
    pipeline: AsyncRollout,
) -> dict[str, float]:
    """Pause generation, sync the weights (bounded by ``rpc_timeout``), resume.

    Returns:
        ``time/weight_sync_pause``, ``time/weight_sync`` (the transfer) and
        ``time/weight_sync_resume``, and the version the engines now hold.

    Raises:
        WeightSyncTimeoutError: When the sync takes longer than ``rpc_timeout``
            (generation is resumed on the old weights first).
    """

    async def update() -> None:
        await parts.backend.update_weights(parts.strategy.export_weights())

    times = loop.run_until_complete(pipeline.sync(update, timeout=config.rpc_timeout))
    return times.metrics() | {"async/policy_version": float(pipeline.client.version)}


def check_failures(config: GRPOConfig, trajectories: list[Trajectory], step: int) -> float:
    """Log the first traceback of each kind of failure; stop the run when too many failed.

    Returns:
        The number of failed episodes.

    Raises:
        RolloutFailedError: When the failed share exceeds ``max_failed_fraction``.
    """
    report = failure_report(trajectories)
    for message in report.messages:
        logger.warning("step %d: %s", step, message)
    share = report.failed / max(len(trajectories), 1)
    if report.failed and share > config.max_failed_fraction:
        first = report.messages[0] if report.messages else ""
        raise RolloutFailedError(
            f"step {step}: {report.failed} of {len(trajectories)} episodes failed "
            f"({share:.0%} > max_failed_fraction={config.max_failed_fraction}); the first "
            f"failure:\n{first}"
        )
    return float(report.failed)


def prepare_batch(
    config: GRPOConfig,
    parts: TrainParts,
    trajectories: list[Trajectory],
    metrics: dict[str, float],
    *,
    step: int | None = None,
) -> RolloutBatch | None:
    """Pad the samples, take π_old (and the reference), and compute advantages.

    The rewards become advantages as docs/rewards.md lays out: the token-level KL
    penalty (its beta from ``parts.kl_controller``, which then sees this step's
    KL), ``reward_normalization``, ROLL's reward keys, then the estimator. With
    GAE the critic values the batch, and then takes its update on it here: ROLL
    trains the critic beside the actor on the same batch (neither reads the
    other's new weights), so its place before the actor's update changes nothing.

    ``step`` is the step the batch trains (default: its first trajectory's
    version + 1, as in the synchronous recipe).

    Returns None when no sample carries a learning signal (all groups dropped).
    """
    strategy = parts.strategy
    played = [t for t in trajectories if not t.failed and t.turns]
    if not played:
        metrics["train/kept_samples"] = 0.0
        return None
    batch = RolloutBatch.from_trajectories(
        played,
        pad_token_id=parts.pad_token_id,
        step_score=config.step_score,
        step_gamma=config.step_gamma,
    )
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
    # π_old: the engine's logprobs (bypass), or the trainer's (the proximal policy)
    proximal = None if config.old_logprobs == "engine" else strategy.logprobs(batch) * mask
    correction = correction_terms(
        batch.loss_mask, batch.engine_logprobs, proximal, config.train_infer_correction
    )
    batch.old_logprobs, batch.is_weights = correction.old_logprobs, correction.is_weights
    metrics.update({f"actor/{key}": value for key, value in correction.metrics.items()})
    penalty = None  # [B, T]: beta * KL, the token-level KL penalty
    if config.needs_reference:
        batch.ref_logprobs = strategy.reference_logprobs(batch) * mask
        if config.add_token_level_kl:
            penalty = token_level_kl_penalty(config, parts, batch, metrics)
    normalized, token_rewards = reward_signal(
        config, parts, batch, penalty, step_advantages, metrics
    )  # [B], [B, T]
    if config.adv_estimator == "gae":
        if step is None:  # the rollout of step N sampled with version N - 1
            step = played[0].policy_version + 1
        batch.advantages = critic_advantages(config, parts, batch, token_rewards, step, metrics)
    else:
        batch.advantages = compute_advantages(
            config.adv_estimator,
            normalized_scores=normalized,
            token_rewards=token_rewards,
            loss_mask=batch.loss_mask,
            gamma=config.gamma,
            whiten=config.whiten_advantages,
            clip=config.advantage_clip,
        )
    if correction.keep is not None:  # filtered tokens leave the loss after the advantages (ROLL)
        batch.loss_mask = batch.loss_mask * correction.keep
    return batch


def critic_advantages(
    config: GRPOConfig,
    parts: TrainParts,
    batch: RolloutBatch,
    token_rewards: torch.Tensor,
    step: int,
    metrics: dict[str, float],
) -> torch.Tensor:
    """GAE's ``[B, T]`` advantages with the critic's values; then the critic's update.

    Sets ``batch.values`` and ``batch.returns`` (the critic's targets) and logs
    the update's ``critic/*`` metrics.
    """
    if parts.critic is None:
        raise ValueError("adv_estimator=gae needs parts.critic (builders.build_train makes it)")
    batch.values = parts.critic.values(batch) * batch.loss_mask  # [B, T]
    gae = gae_advantages(
        token_rewards, batch.values, batch.loss_mask, gamma=config.gamma, lambd=config.lambd
    )
    batch.returns = gae.returns
    metrics.update(update_critic(config, parts.critic, batch, step))
    return finish_advantages(
        gae.advantages, batch.loss_mask, whiten=config.whiten_advantages, clip=config.advantage_clip
    )


def token_level_kl_penalty(
    config: GRPOConfig, parts: TrainParts, batch: RolloutBatch, metrics: dict[str, float]
) -> torch.Tensor:
    """``[B, T]`` the penalty ``beta * KL(old ‖ ref)`` of ``add_token_level_kl``.

    ``beta`` is the KL controller's value before this step; the controller then
    sees the step's KL (ROLL's ``compute_token_reward``). Logs ``actor/kl_coef``
    (that beta) and ``actor/token_level_kl`` (the token mean of the KL).
    """
    if parts.kl_controller is None:
        raise ValueError(
            "add_token_level_kl needs parts.kl_controller (grpo.kl_controller(config))"
        )
    if batch.old_logprobs is None or batch.ref_logprobs is None:
        raise ValueError("the token-level KL needs old_logprobs and ref_logprobs")
    mask = batch.loss_mask.float()  # [B, T]
    kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, config.kl_penalty) * mask  # [B, T]
    beta = parts.kl_controller.value
    metrics["actor/token_level_kl"] = float(kl.sum() / mask.sum().clamp(min=1))
    metrics["actor/kl_coef"] = beta
    parts.kl_controller.update(current_kl(kl, mask), n_steps=len(batch))
    return beta * kl


def reward_signal(
    config: GRPOConfig,
    parts: TrainParts,
    batch: RolloutBatch,
    penalty: torch.Tensor | None,
    step_advantages: torch.Tensor | None,
    metrics: dict[str, float],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[B]`` normalized scores and ``[B, T]`` token rewards the estimator reads.

    As docs/rewards.md lays out: GRPO folds the KL penalty into the score, the
    other estimators subtract it per token; ``reward_normalization`` (plus
    GiGPO's step term); then, with GAE or ROLL's reward keys
    (:attr:`GRPOConfig.processes_rewards`), :func:`process_rewards`, which
    also applies ``reward_clip`` (else :func:`normalize_rewards` clamps the score).
    """
    fold = penalty is not None and config.adv_estimator == "grpo"
    scores = batch.scores - penalty.sum(1) if fold and penalty is not None else batch.scores
    processed = config.processes_rewards
    normalized = normalize_rewards(
        scores,
        grouping=config.grouping,
        method=config.normalization,
        group_ids=batch.group_ids,
        tags=batch.tags,
        reward_clip=None if processed else config.reward_clip,
    )  # [B]
    if step_advantages is not None:
        normalized = normalized + config.step_advantage_weight * step_advantages
    if not processed:
        token_rewards = batch.token_rewards if penalty is None else batch.token_rewards - penalty
        return normalized, token_rewards
    running = config.use_reward_scaling or config.reward_norm == "running"
    if running and parts.reward_moments is None:
        raise ValueError("running reward statistics need parts.reward_moments (RunningMoments())")
    result = process_rewards(
        normalized,
        batch.loss_mask,
        group_ids=batch.group_ids,
        running=parts.reward_moments,
        use_reward_scaling=config.use_reward_scaling,
        use_reward_norm=config.use_reward_norm,
        reward_norm=config.reward_norm,
        reward_shift=config.reward_shift,
        reward_scale=config.reward_scale,
        reward_clip=config.reward_clip,
        token_penalty=None if fold else penalty,
        whiten_rewards=config.whiten_rewards,
    )
    metrics.update({f"train/{key}": value for key, value in result.metrics.items()})
    return result.scores, result.token_rewards


def minibatches(config: GRPOConfig, batch: RolloutBatch, step: int) -> list[RolloutBatch]:
    """The mini-batches of one step: ``ppo_epochs`` shuffled passes over ``batch``,
    each mini-batch trimmed to its longest sequence."""
    size = config.micro_batch_size * config.gradient_accumulation_steps
    generator = torch.Generator().manual_seed(config.seed * 100_003 + step)
    chunks = []
    for _ in range(config.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        for start in range(0, len(batch), size):
            rows = order[start : start + size]
            chunks.append(batch.rows(rows, width=int(batch.attention_mask[rows].sum(1).max())))
    return chunks


def update_policy(
    config: GRPOConfig, strategy: Strategy, batch: RolloutBatch, step: int
) -> dict[str, float]:
    """``ppo_epochs`` passes of mini-batch updates (none in the first ``critic_warmup``
    steps, where only the critic trains).

    Returns:
        ``actor/*`` metrics: each mini-batch's value (over its micro-batches, by
        each metric's reduction) averaged over the updates; ``ratio_min`` and
        ``ratio_max`` are the extremes over all updates.
    """
    if step <= config.critic_warmup:
        return {"actor/updates": 0.0}
    chunks = minibatches(config, batch, step)
    updates = MetricReducer()
    for chunk in progress(chunks, f"step {step} update", enabled=sys.stderr.isatty()):
        if config.length_loss_weight or config.difficulty_loss_weight:  # over the mini-batch
            chunk.sample_weights = sample_weights(
                chunk.loss_mask,
                difficulty=group_difficulty(batch.scores, batch.group_ids, of=chunk.group_ids),
                difficulty_loss_weight=config.difficulty_loss_weight,
                length_loss_weight=config.length_loss_weight,
            )
        loss = PolicyLoss(
            config,
            num_tokens=chunk.loss_mask.sum().clamp(min=1),
            num_seqs=(chunk.loss_mask.sum(1) > 0).sum().clamp(min=1),
        )
        result = strategy.train_step(list(micro_batches(chunk, config.micro_batch_size)), loss)
        # a mini-batch's shares have added up to its value: average those over updates
        updates.add(
            {
                key: Metric(m.value, "mean" if m.reduce == "sum" else m.reduce)
                for key, m in result.items()
            }
        )
    return {f"actor/{key}": value for key, value in updates.values().items()} | {
        "actor/updates": float(len(chunks))
    }


class PolicyLoss:
    """The per-micro-batch GRPO loss: PPO-clip, plus KL, SFT and entropy terms when configured.

    As ROLL's actor adds them (:func:`~agentgym.trainers.loss_terms.mix_losses`)::

        rl_loss_coef * (pg + kl_loss_coef * kl) + sft_loss_coef * sft - entropy_loss_coef * entropy

    where ``pg`` weighs each sample by ``batch.sample_weights`` when set
    (``length_loss_weight``, ``difficulty_loss_weight``) and ``sft`` is
    :func:`~agentgym.trainers.loss_terms.sft_loss` (TOPR's with ``use_topr_loss``).

    ``num_tokens``/``num_seqs`` are the mini-batch's counts, so each micro-batch's
    loss and metrics are its share of the mini-batch's (exact accumulation).
    """

    def __init__(self, config: GRPOConfig, *, num_tokens: torch.Tensor, num_seqs: torch.Tensor):
        self.config = config
        self.counts = {
            "norm_length": config.loss_scale_factor,
            "num_tokens": num_tokens,
            "num_seqs": num_seqs,
        }
        self.needs = LossInputs(
            entropy=config.entropy_loss_coef != 0,
            logits=config.use_kl_loss and config.kl_penalty == "full",
            ref_logits=config.use_kl_loss and config.kl_penalty == "full",
        )

    def __call__(
        self, outputs: ModelOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, Metric]]:
        """The micro-batch's loss share and metrics."""
        config = self.config
        if batch.old_logprobs is None or batch.advantages is None:
            raise ValueError("the batch needs old_logprobs and advantages (prepare_batch)")
        mask = batch.loss_mask.float()  # [b, t]
        loss, raw = policy_loss(
            outputs.logprobs,
            batch.old_logprobs,
            batch.advantages,
            mask,
            clip_ratio_low=config.clip_ratio_low,
            clip_ratio_high=config.clip_ratio_high,
            dual_clip=config.dual_clip_ratio_c,
            loss_agg_mode=config.loss_agg_mode,
            is_weights=batch.is_weights,
            sample_weights=batch.sample_weights,
            **self.counts,  # type: ignore[arg-type]
        )
        empty = not bool(mask.any())
        metrics = {
            key: Metric(float(value), POLICY_LOSS_REDUCE.get(key, "sum"))  # type: ignore[arg-type]
            for key, value in raw.items()
            if not (empty and key in POLICY_LOSS_REDUCE)  # no ratio in an empty micro-batch
        }
        if config.use_kl_loss:
            if batch.ref_logprobs is None:
                raise ValueError("use_kl_loss needs the batch's ref_logprobs (prepare_batch)")
            kl = kl_penalty(
                outputs.logprobs,
                batch.ref_logprobs,
                config.kl_penalty,
                logits=outputs.logits,
                ref_logits=outputs.ref_logits,
            )
            kl_loss = aggregate_loss(kl, mask, config.loss_agg_mode, **self.counts)  # type: ignore[arg-type]
            loss = loss + config.kl_loss_coef * kl_loss
            metrics["kl"] = Metric(float(kl_loss.detach()), "sum")
        sft = None
        if config.sft_loss_coef:
            per_token = sft_loss(
                outputs.logprobs,
                batch.old_logprobs,
                batch.advantages,
                batch.scores,
                mask,
                use_topr_loss=config.use_topr_loss,
            )  # [b, t]
            sft = aggregate_loss(per_token, mask, config.loss_agg_mode, **self.counts)  # type: ignore[arg-type]
            metrics["sft_loss"] = Metric(float(sft.detach()), "sum")
        loss = mix_losses(
            loss, sft, rl_loss_coef=config.rl_loss_coef, sft_loss_coef=config.sft_loss_coef
        )
        if config.entropy_loss_coef:
            if outputs.entropy is None:
                raise ValueError("entropy_loss_coef needs the strategy's entropy output")
            entropy = aggregate_loss(outputs.entropy, mask, config.loss_agg_mode, **self.counts)  # type: ignore[arg-type]
            loss = loss - config.entropy_loss_coef * entropy
            metrics["entropy"] = Metric(float(entropy.detach()), "sum")
        metrics["loss"] = Metric(float(loss.detach()), "sum")
        return loss, metrics


def update_critic(
    config: GRPOConfig, critic: Critic, batch: RolloutBatch, step: int
) -> dict[str, float]:
    """One shuffled pass of critic mini-batches over ``batch`` (ROLL's critic takes one
    epoch), sized by ``critic.training_args``.

    Returns:
        ``critic/*`` metrics averaged over the updates, and ``time/critic``.
    """
    started = time.perf_counter()
    sizes = replace(
        config,
        ppo_epochs=1,
        micro_batch_size=config.critic_micro_batch_size,
        gradient_accumulation_steps=config.critic_gradient_accumulation_steps,
    )
    chunks = minibatches(sizes, batch, step)
    updates = MetricReducer()
    for chunk in chunks:
        loss = ValueLoss(
            config,
            num_tokens=chunk.loss_mask.sum().clamp(min=1),
            num_seqs=(chunk.loss_mask.sum(1) > 0).sum().clamp(min=1),
        )
        result = critic.train_step(list(micro_batches(chunk, sizes.micro_batch_size)), loss)
        updates.add({key: Metric(m.value, "mean") for key, m in result.items()})
    return {f"critic/{key}": value for key, value in updates.values().items()} | {
        "critic/updates": float(len(chunks)),
        "time/critic": time.perf_counter() - started,
    }


class ValueLoss:
    """The critic's per-micro-batch loss: :func:`~agentgym.trainers.gae.value_loss`
    (clipped by ``value_clip``), aggregated as ROLL's critic (``seq-mean-token-mean``).

    ``num_tokens``/``num_seqs`` are the mini-batch's counts (exact accumulation).
    """

    LOSS_AGG_MODE = "seq-mean-token-mean"

    def __init__(self, config: GRPOConfig, *, num_tokens: torch.Tensor, num_seqs: torch.Tensor):
        self.value_clip = config.value_clip
        self.num_tokens = num_tokens
        self.num_seqs = num_seqs

    def __call__(
        self, values: torch.Tensor, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, Metric]]:
        """The micro-batch's loss share and metrics (token-mean shares that add up)."""
        if batch.values is None or batch.returns is None:
            raise ValueError("the critic's batch needs values and returns (prepare_batch)")
        loss, raw = value_loss(
            values,
            batch.values,
            batch.returns,
            batch.loss_mask.float(),
            value_clip=self.value_clip,
            loss_agg_mode=self.LOSS_AGG_MODE,
            num_tokens=self.num_tokens,
            num_seqs=self.num_seqs,
        )
        return loss, {key: Metric(float(value), "sum") for key, value in raw.items()}


def kl_controller(config: GRPOConfig) -> KLController:
    """The coefficient of ``add_token_level_kl``: adaptive with ``target_kl`` (over
    ``kl_horizon`` samples), else fixed at ``init_kl_coef`` (ROLL's ``get_kl_controller``)."""
    return make_kl_controller(
        config.init_kl_coef,
        target_kl=config.target_kl,
        kl_horizon=config.kl_horizon if config.target_kl is not None else None,
    )


def sync_weights(config: GRPOConfig, parts: TrainParts, loop: asyncio.AbstractEventLoop) -> float:
    """Send the strategy's weights to the generation backend, bounded by ``rpc_timeout``.

    Returns:
        The seconds it took.

    Raises:
        TimeoutError: Naming the backend, when the sync takes longer than ``rpc_timeout``.
    """
    started = time.perf_counter()
    update = parts.backend.update_weights(parts.strategy.export_weights())
    try:
        loop.run_until_complete(asyncio.wait_for(update, config.rpc_timeout))
    except (TimeoutError, asyncio.TimeoutError) as error:
        raise TimeoutError(
            f"weight sync to the generation backend ({type(parts.backend).__name__}."
            f"update_weights) took longer than rpc_timeout={config.rpc_timeout} s"
        ) from error
    return time.perf_counter() - started


def validate(
    config: GRPOConfig,
    parts: TrainParts,
    loop: asyncio.AbstractEventLoop,
    *,
    step: int,
    pipeline: AsyncRollout | None = None,
) -> None:
    """Run the validation episodes (fixed seeds), log ``val/*`` and render some of each tag.

    Under async generation the train episodes' generation is paused meanwhile (the
    requests in flight finish first) and resumed after, even when validation fails;
    ``val/policy_version`` is the version validated.
    """
    parts.strategy.train(False)
    if pipeline is not None:
        loop.run_until_complete(pipeline.client.pause())
    try:
        result = loop.run_until_complete(
            collect(
                parts.val_manager, parts.backend, parts.chat, parts.val_rollout, policy_version=step
            )
        )
    finally:
        if pipeline is not None:
            pipeline.client.resume()
    check_failures(config, result.trajectories, step)
    metrics = {f"val/{key}": value for key, value in result.metrics.items()}
    if pipeline is not None:
        metrics["val/policy_version"] = float(pipeline.client.version)
    parts.tracker.log(metrics, step)
    if parts.render_dir is not None and config.val_renders:
        picked = pick_renders(result.trajectories, config.val_renders)
        render_trajectories(picked, parts.render_dir, step)


def checkpoint(parts: TrainParts, step: int, *, pipeline: AsyncRollout | None = None) -> Path:
    """Save model, optimizer, scheduler, RNG, step, seed cursor and tracker run id, atomically;
    with them the critic (under ``critic/``), the KL coefficient and the running reward
    statistics when the run has them.

    Under async generation the saved seed cursor is that of the first batch not yet
    trained: the episodes in flight are not saved, a resume regenerates them.
    """
    manager_state = parts.train_manager.state_dict()
    if pipeline is not None:
        manager_state = {**manager_state, "cursor": pipeline.cursor(step)}

    def write(directory: Path) -> None:
        parts.strategy.save(directory)
        if parts.critic is not None:
            parts.critic.save(directory / CRITIC_DIR)
        torch.save(rng_state(), directory / "rng.pt")
        (directory / RUN_CONFIG).write_text(yaml.safe_dump(parts.meta["config"], sort_keys=False))
        state: dict[str, Any] = {
            "step": step,
            "train_env_manager": manager_state,
            "tracker_run_id": parts.tracker.run_id,
        }
        if parts.kl_controller is not None:
            state["kl_controller"] = parts.kl_controller.state_dict()
        if parts.reward_moments is not None:
            state["reward_moments"] = parts.reward_moments.state_dict()
        write_json_atomic(directory / "trainer_state.json", state)

    return save_checkpoint(parts.checkpoint_dir, step, write)


def find_checkpoint(checkpoint_dir: Path, resume: bool | str) -> tuple[Path, dict[str, Any]]:
    """The checkpoint a resume loads (the latest in ``checkpoint_dir``, or the one
    ``resume`` names) and its trainer state.

    Raises:
        FileNotFoundError: If there is no complete checkpoint there, naming where
            it looked and what to pass instead.
    """
    path = Path(resume) if isinstance(resume, str) else latest_checkpoint(checkpoint_dir)
    if path is None or not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(
            f"resume_from_checkpoint={resume!r}: no complete checkpoint in "
            f"{path or checkpoint_dir}. To continue a run, pass its own folder: "
            "output_dir=<the run's output_dir> resume_from_checkpoint=true (the default "
            "output_dir is a new timestamped folder), or resume_from_checkpoint=<a "
            "checkpoint-N folder>; resume_from_checkpoint=false starts afresh"
        )
    state: dict[str, Any] = json.loads((path / "trainer_state.json").read_text())
    return path, state


def restore(parts: TrainParts, resume: bool | str) -> int:
    """Load the latest checkpoint (or the one ``resume`` names) and return its step.

    Raises:
        FileNotFoundError: If there is no complete checkpoint to resume from.
    """
    path, state = find_checkpoint(parts.checkpoint_dir, resume)
    parts.strategy.load(path)
    if parts.critic is not None:
        if not (path / CRITIC_DIR).is_dir():
            raise FileNotFoundError(
                f"{path} holds no critic/ (saved by a run without adv_estimator=gae); resume "
                "it with the adv_estimator it was trained with"
            )
        parts.critic.load(path / CRITIC_DIR)
    if parts.kl_controller is not None and "kl_controller" in state:
        parts.kl_controller.load_state_dict(state["kl_controller"])
    if parts.reward_moments is not None and "reward_moments" in state:
        parts.reward_moments.load_state_dict(state["reward_moments"])
    parts.train_manager.load_state_dict(state["train_env_manager"])
    set_rng_state(torch.load(path / "rng.pt", weights_only=True))
    step = int(state["step"])
    print(f"resumed from {path} at step {step}", flush=True)
    return step


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
