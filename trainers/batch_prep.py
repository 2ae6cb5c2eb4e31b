"""From a step's trajectories to the batch it trains on: failures checked, samples
padded, zero-variance groups dropped, π_old and the off-policy correction, the
reference, then rewards into advantages as docs/rewards.md lays out (the KL
penalty, ``reward_normalization`` with GiGPO's step term, ROLL's reward keys, the
estimator; GAE's critic values the batch and takes its update here).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from agentgym.rollout.metrics import failure_report
from agentgym.trainers.advantages import compute_advantages, finish_advantages
from agentgym.trainers.correction import correction_terms
from agentgym.trainers.gae import gae_advantages
from agentgym.trainers.kl_control import current_kl
from agentgym.trainers.losses import kl_penalty
from agentgym.trainers.normalization import (
    anchor_state_advantages,
    normalize_rewards,
    opmd_advantages,
)
from agentgym.trainers.rewards import process_rewards
from agentgym.trajectory import RolloutBatch, Trajectory

if TYPE_CHECKING:
    from agentgym.trainers.grpo import GRPOConfig, TrainParts

logger = logging.getLogger(__name__)

SCORE_ESTIMATORS = ("grpo", "opmd", "step_reinforce")
"""Estimators that read one score per sample: a token-level KL penalty folds into it."""


class RolloutFailedError(RuntimeError):
    """More than ``max_failed_fraction`` of a step's episodes failed."""


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
    if report.failed and share > config.schedule.max_failed_fraction:
        first = report.messages[0] if report.messages else ""
        raise RolloutFailedError(
            f"step {step}: {report.failed} of {len(trajectories)} episodes failed "
            f"({share:.0%} > max_failed_fraction={config.schedule.max_failed_fraction}); the first "
            f"failure:\n{first}"
        )
    return float(report.failed)


def prepare_batch(
    config: GRPOConfig,
    parts: TrainParts,
    trajectories: list[Trajectory],
    metrics: dict[str, float],
) -> RolloutBatch | None:
    """Pad the samples, take π_old (and the reference), and compute advantages.

    The rewards become advantages as docs/rewards.md lays out: the token-level KL
    penalty (its beta from ``parts.kl_controller``, which then sees this step's
    KL), ``reward_normalization``, ROLL's reward keys, then the estimator. With
    GAE the critic values the batch (the recipe then updates it on the same batch,
    :func:`~agentgym.trainers.updates.update_critic`).

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
        step_score=config.advantage.step_score,
        step_gamma=config.advantage.step_gamma,
    )
    step_advantages = step_level_advantages(config, batch, metrics)  # [B] or None
    if config.advantage.drop_zero_variance_groups:
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
    proximal = None  # [B, T]
    if config.loss.old_logprobs == "trainer":
        proximal = strategy.logprobs(batch, config.schedule.logprobs_token_budget) * mask
    correction = correction_terms(
        batch.loss_mask, batch.engine_logprobs, proximal, config.loss.train_infer_correction
    )
    batch.old_logprobs, batch.is_weights = correction.old_logprobs, correction.is_weights
    metrics.update({f"actor/{key}": value for key, value in correction.metrics.items()})
    penalty = None  # [B, T]: beta * KL, the token-level KL penalty
    if config.needs_reference:
        batch.ref_logprobs = (
            strategy.reference_logprobs(batch, config.schedule.reference_token_budget) * mask
        )
        if config.advantage.add_token_level_kl:
            penalty = token_level_kl_penalty(config, parts, batch, metrics)
    normalized, token_rewards = reward_signal(
        config, parts, batch, penalty, step_advantages, metrics
    )  # [B], [B, T]
    if config.advantage.adv_estimator == "gae":
        batch.advantages = critic_advantages(config, parts, batch, token_rewards)
    else:
        batch.advantages = compute_advantages(
            config.advantage.adv_estimator,
            normalized_scores=normalized,
            token_rewards=token_rewards,
            loss_mask=batch.loss_mask,
            gamma=config.advantage.gamma,
            whiten=config.advantage.whiten_advantages,
            clip=config.advantage.advantage_clip,
        )
    if correction.keep is not None:  # filtered tokens leave the loss after the advantages (ROLL)
        batch.loss_mask = batch.loss_mask * correction.keep
    return batch


def critic_advantages(
    config: GRPOConfig,
    parts: TrainParts,
    batch: RolloutBatch,
    token_rewards: torch.Tensor,
) -> torch.Tensor:
    """GAE's ``[B, T]`` advantages with the critic's values.

    Sets what the critic's update reads: ``batch.values``, ``batch.returns`` (the
    critic's targets) and ``batch.value_mask`` (the response tokens, before the
    off-policy filter takes some out of the policy's loss).
    """
    if parts.critic is None:
        raise ValueError("adv_estimator=gae needs parts.critic (build_train makes it)")
    batch.values = parts.critic.values(batch) * batch.loss_mask  # [B, T]
    gae = gae_advantages(
        token_rewards,
        batch.values,
        batch.loss_mask,
        gamma=config.advantage.gamma,
        lambd=config.advantage.lambd,
    )
    batch.returns = gae.returns
    batch.value_mask = batch.loss_mask
    return finish_advantages(
        gae.advantages,
        batch.loss_mask,
        whiten=config.advantage.whiten_advantages,
        clip=config.advantage.advantage_clip,
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
    kl = kl_penalty(batch.old_logprobs, batch.ref_logprobs, config.loss.kl_penalty) * mask  # [B, T]
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
    other estimators subtract it per token; ``reward_normalization`` (OPMD's
    group baseline after it, :func:`opmd_advantages`; plus GiGPO's step term);
    then, with GAE or ROLL's reward keys
    (:attr:`GRPOConfig.processes_rewards`), :func:`process_rewards`, which
    also applies ``reward_clip`` (else :func:`normalize_rewards` clamps the score).
    """
    # grpo and opmd read one score per sample: the KL penalty folds into it (Trinity's OPMD
    # sums its token-level rewards, penalty included, into the score the same way)
    fold = penalty is not None and config.advantage.adv_estimator in SCORE_ESTIMATORS
    scores = batch.scores - penalty.sum(1) if fold and penalty is not None else batch.scores
    processed = config.advantage.processes_rewards
    normalized = normalize_rewards(
        scores,
        grouping=config.advantage.grouping,
        method=config.advantage.normalization,
        group_ids=batch.group_ids,
        tags=batch.tags,
        reward_clip=None if processed else config.advantage.reward_clip,
        norm_mean_type=config.advantage.norm_mean_type,
        norm_std_type=config.advantage.norm_std_type,
    )  # [B]
    if config.advantage.adv_estimator == "opmd":
        normalized = opmd_advantages(
            normalized,
            baseline=config.advantage.opmd_baseline,
            tau=config.advantage.opmd_baseline_tau,
            grouping=config.advantage.grouping,
            group_ids=batch.group_ids,
            tags=batch.tags,
        )  # [B]
    if step_advantages is not None:
        normalized = normalized + config.advantage.step_advantage_weight * step_advantages
    if not processed:
        token_rewards = batch.token_rewards if penalty is None else batch.token_rewards - penalty
        return normalized, token_rewards
    running = config.advantage.use_reward_scaling or config.advantage.reward_norm == "running"
    if running and parts.reward_moments is None:
        raise ValueError("running reward statistics need parts.reward_moments (RunningMoments())")
    result = process_rewards(
        normalized,
        batch.loss_mask,
        group_ids=batch.group_ids,
        running=parts.reward_moments,
        use_reward_scaling=config.advantage.use_reward_scaling,
        use_reward_norm=config.advantage.use_reward_norm,
        reward_norm=config.advantage.reward_norm,
        reward_shift=config.advantage.reward_shift,
        reward_scale=config.advantage.reward_scale,
        reward_clip=config.advantage.reward_clip,
        token_penalty=None if fold else penalty,
        whiten_rewards=config.advantage.whiten_rewards,
    )
    metrics.update({f"train/{key}": value for key, value in result.metrics.items()})
    return result.scores, result.token_rewards


def step_level_advantages(
    config: GRPOConfig, batch: RolloutBatch, metrics: dict[str, float]
) -> torch.Tensor | None:
    """GiGPO's step-level term ``[B]`` (see :func:`anchor_state_advantages`); None when off."""
    if not config.advantage.step_advantage_weight:
        return None
    if batch.step_returns is None or batch.state_ids is None:
        raise ValueError("GiGPO needs the batch's step_returns and state_ids (from_trajectories)")
    sizes = torch.bincount(batch.state_ids)[batch.state_ids]  # [B]
    metrics["train/anchor_state_share"] = float((sizes > 1).float().mean())
    metrics["train/anchor_state_groups"] = float(torch.unique(batch.state_ids).numel())
    return anchor_state_advantages(
        batch.step_returns, batch.state_ids, config.advantage.normalization
    )


def varied_groups(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """``[B]`` True for samples whose GRPO group's scores are not all equal."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1
    high = torch.full((groups,), -torch.inf).scatter_reduce(0, inverse, scores, "amax")
    low = torch.full((groups,), torch.inf).scatter_reduce(0, inverse, scores, "amin")
    return (high > low)[inverse]
