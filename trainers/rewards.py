"""ROLL's reward processing before the advantage estimator: pure tensor functions.

The keys are ROLL's: ``use_reward_scaling``, ``use_reward_norm``, ``reward_norm``
(``batch`` | ``group`` | ``running`` | None) with ``reward_shift`` or
``reward_scale``, ``reward_clip`` and ``whiten_rewards``; :func:`process_rewards`
applies them in ROLL's order. Running statistics persist across steps in a
:class:`RunningMoments`, which a checkpoint saves with ``state_dict``.

``add_len_reward`` is declared in ROLL's configs (``base_config.py``, earlier
``rlvr_config.py``/``agentic_config.py``) but no version of ROLL's code reads it,
so it has no behaviour to reproduce and is not implemented here.

ROLL later renamed ``reward_norm``/``reward_shift``/``reward_scale`` to
``norm_mean_type``/``norm_std_type``: ``reward_norm=X`` is ``(X, X)``, with
``reward_shift`` ``(X, None)`` and with ``reward_scale`` ``(None, X)``; this
module implements that later, general form (see :func:`apply_reward_norm`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from agentgym.choices import REWARD_NORMS, check_reward_options
from agentgym.errors import check_choice
from agentgym.trainers.advantages import last_token_rewards, masked_whiten
from agentgym.trainers.normalization import group_stats

STD_EPSILON = 1e-6
"""Added to the std in ``reward_norm`` (ROLL's ``reward_norm``)."""


class RunningMoments:
    """Running mean and standard deviation of every reward seen so far.

    ROLL's ``RunningMoments`` (after stable-baselines3's ``RunningMeanStd``):
    each :meth:`update` merges a batch's count, mean and (biased) variance into
    the totals with Chan et al.'s parallel formula; ``std`` is the unbiased
    (Bessel-corrected) std of all values seen. It starts at mean 0, variance 1
    and a count of 1e-24, so the first batch sets it almost entirely.

    Deviations from ROLL, on purpose: the totals are Python floats (float64)
    where ROLL keeps float32 tensors; while fewer than two values have been
    seen, ``std`` stays 1.0 (ROLL divides by ``count - 1 = 0`` and gets inf or NaN).
    """

    def __init__(self) -> None:
        self.mean = 0.0
        self.var = 1.0
        self.std = 1.0
        self.count = 1e-24

    @torch.no_grad()
    def update(self, values: Tensor) -> tuple[float, float]:
        """Merge ``values`` (any shape, every element counts) into the totals.

        Returns:
            The batch's own mean and unbiased std (0 for a single value), for logging.

        Raises:
            ValueError: If ``values`` is empty.
        """
        count = values.numel()
        if count == 0:
            raise ValueError("RunningMoments.update needs at least one value")
        flat = values.detach().double().flatten()
        batch_mean = float(flat.mean())
        batch_var = float(flat.var(unbiased=False))
        delta = batch_mean - self.mean
        total = self.count + count
        old_sum = self.var * self.count + delta**2 * self.count * count / total
        self.mean += delta * count / total
        self.var = (old_sum + batch_var * count) / total
        self.std = math.sqrt(self.var * total / (total - 1)) if total > 1 else 1.0
        self.count = total
        batch_std = math.sqrt(batch_var * count / (count - 1)) if count > 1 else 0.0
        return batch_mean, batch_std

    def state_dict(self) -> dict[str, Any]:
        """``mean``, ``var``, ``std`` and ``count`` as floats."""
        return {"mean": self.mean, "var": self.var, "std": self.std, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        self.mean = float(state["mean"])
        self.var = float(state["var"])
        self.std = float(state["std"])
        self.count = float(state["count"])


# Statistics: each gives the per-sample mean and std, and which samples have none.

_Stats = tuple[Tensor, Tensor, Tensor]


def _batch_stats(
    scores: Tensor, group_ids: Tensor | None, running: RunningMoments | None
) -> _Stats:
    return group_stats(scores, torch.zeros_like(scores, dtype=torch.long))


def _group_stats(
    scores: Tensor, group_ids: Tensor | None, running: RunningMoments | None
) -> _Stats:
    if group_ids is None:
        raise ValueError(
            "reward_norm='group' needs group_ids (the GRPO group of each sample, "
            "RolloutBatch.group_ids); pass them, or use reward_norm='batch'"
        )
    return group_stats(scores, torch.unique(group_ids, return_inverse=True)[1])


def _running_stats(
    scores: Tensor, group_ids: Tensor | None, running: RunningMoments | None
) -> _Stats:
    if running is None:
        raise ValueError("reward_norm='running' needs a RunningMoments that persists across steps")
    running.update(scores)
    mean = torch.full_like(scores, running.mean)  # [B]
    std = torch.full_like(scores, running.std)  # [B]
    return mean, std, torch.zeros_like(scores, dtype=torch.bool)


_STATISTICS: dict[str, Callable[[Tensor, Tensor | None, RunningMoments | None], _Stats]] = {
    "batch": _batch_stats,
    "group": _group_stats,
    "running": _running_stats,
}


# Transforms: what is done with the statistics.


def _mean_std(scores: Tensor, mean: Tensor, std: Tensor, degenerate: Tensor) -> Tensor:
    return torch.where(degenerate, torch.zeros_like(scores), (scores - mean) / (std + STD_EPSILON))


def _shift(scores: Tensor, mean: Tensor, std: Tensor, degenerate: Tensor) -> Tensor:
    return torch.where(degenerate, torch.zeros_like(scores), scores - mean)


def _scale(scores: Tensor, mean: Tensor, std: Tensor, degenerate: Tensor) -> Tensor:
    # A constant group has no spread to divide by: its rewards stay as they are.
    return torch.where(degenerate, scores, scores / (std + STD_EPSILON))


_TRANSFORMS: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]] = {
    "mean_std": _mean_std,
    "shift": _shift,
    "scale": _scale,
}


def apply_reward_norm(
    scores: Tensor,
    norm: str,
    *,
    shift: bool = False,
    scale: bool = False,
    group_ids: Tensor | None = None,
    running: RunningMoments | None = None,
) -> Tensor:
    """ROLL's ``reward_norm`` with ``reward_shift``/``reward_scale`` on response-level rewards.

    With the mean and unbiased std of ``norm``'s scope (the batch, the sample's
    GRPO group, or the running moments after updating them with ``scores``):

    - neither flag: ``(r - mean) / (std + 1e-6)``;
    - ``shift`` (``reward_shift``): ``r - mean``;
    - ``scale`` (``reward_scale``): ``r / (std + 1e-6)``.

    A group (or batch) of one sample or of equal scores has no spread: it gives
    exactly 0 for the first two (as our ``normalize_rewards`` and ROLL's agentic
    ``reward_normalization``), and keeps its rewards under ``scale``. ROLL's
    RLVR ``reward_norm`` divides by ``0 + 1e-6`` there (multiplying a constant
    group's rewards by 1e6 under ``scale``, NaN for a group of one); that is
    the deliberate deviation. ``scale`` is honoured for all three scopes: ROLL's
    first form ignored it except with ``running``, and its later
    ``norm_std_type``-only form with ``group`` broadcasts ``[B]`` rewards
    against ``[B/n, 1]`` stds into a ``[B/n, B]`` tensor (a shape bug); we
    divide each reward by its own group's std, as the key is documented.

    Args:
        scores: ``[B]`` response-level rewards.
        norm: One of :data:`REWARD_NORMS`.
        shift: Only subtract the mean.
        scale: Only divide by the std.
        group_ids: ``[B]`` GRPO group ids (``group`` only).
        running: Updated in place with ``scores``, then used (``running`` only).

    Returns:
        ``[B]`` normalized rewards.

    Raises:
        ValueError: On an unknown ``norm``, both ``shift`` and ``scale``, a
            non-1-D ``scores``, or missing ``group_ids``/``running``.
    """
    check_choice("reward_norm", norm, REWARD_NORMS)
    if shift and scale:
        raise ValueError(
            "reward_shift (only subtract the mean) and reward_scale (only divide by the std) "
            "exclude each other; set neither for both"
        )
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    if group_ids is not None and group_ids.shape != scores.shape:
        raise ValueError(
            f"group_ids must have the shape of scores {tuple(scores.shape)}, "
            f"got {tuple(group_ids.shape)}"
        )
    values = scores if scores.is_floating_point() else scores.float()
    mean, std, degenerate = _STATISTICS[norm](values, group_ids, running)  # [B] each
    transform = "shift" if shift else "scale" if scale else "mean_std"
    return _TRANSFORMS[transform](values, mean, std, degenerate)


def running_reward_scaling(
    scores: Tensor, running: RunningMoments, *, subtract_mean: bool
) -> Tensor:
    """ROLL's ``use_reward_scaling`` (and ``use_reward_norm``): divide by the running std.

    ``running`` is updated with ``scores`` first; then ``r / (std + eps)``, or
    ``(r - mean) / (std + eps)`` with ``subtract_mean`` (``use_reward_norm``),
    where ``eps`` is the machine epsilon of ``scores``' dtype (as ROLL).

    Args:
        scores: ``[B]`` response-level rewards (floating).
        running: The running moments, updated in place.
        subtract_mean: Also subtract the running mean (``use_reward_norm``).

    Returns:
        ``[B]`` scaled rewards.
    """
    values = scores if scores.is_floating_point() else scores.float()
    running.update(values)
    scale = running.std + torch.finfo(values.dtype).eps
    return (values - running.mean) / scale if subtract_mean else values / scale


class ProcessedRewards(NamedTuple):
    """:func:`process_rewards`' result."""

    scores: Tensor
    """``[B]`` the processed response-level rewards (before the token-level steps)."""
    token_rewards: Tensor
    """``[B, T]`` the token-level rewards the estimator consumes, 0 off the mask."""
    metrics: dict[str, float]
    """``reward_clip_frac`` and ``token_reward_clip_frac`` (with ``reward_clip``)."""


def process_rewards(
    scores: Tensor,
    loss_mask: Tensor,
    *,
    group_ids: Tensor | None = None,
    running: RunningMoments | None = None,
    use_reward_scaling: bool = False,
    use_reward_norm: bool = False,
    reward_norm: str | None = None,
    reward_shift: bool = False,
    reward_scale: bool = False,
    reward_clip: float | None = None,
    token_penalty: Tensor | None = None,
    whiten_rewards: bool = False,
) -> ProcessedRewards:
    """Response-level scores to token-level rewards, in ROLL's order.

    ROLL's RLVR pipeline runs ``reward_postprocess`` → ``compute_token_reward``
    → ``compute_advantage``; ``use_reward_scaling`` comes from its VLM math
    pipeline, which ran it before everything else. In that order:

    1. ``use_reward_scaling``: :func:`running_reward_scaling` (``use_reward_norm``
       also subtracts the running mean);
    2. ``reward_norm`` with ``reward_shift``/``reward_scale``: :func:`apply_reward_norm`;
    3. ``reward_clip``: clamp to ``[-reward_clip, reward_clip]``;
    4. each score onto its sample's last generated token (ROLL's ``expand_to_token_level``);
    5. minus ``token_penalty`` (``add_token_level_kl``: ``beta * KL`` with
       ``beta`` from the KL controller, ``trainers/kl_control.py``);
    6. ``reward_clip`` again, on the token-level rewards (as ``compute_token_reward``);
    7. ``whiten_rewards``: :func:`~agentgym.trainers.advantages.masked_whiten`
       over all generated tokens of the batch (``compute_advantage``);
    8. 0 off the mask.

    Relation to ``reward_normalization.{grouping,method}`` (our
    ``normalize_rewards``, which is ROLL's *agentic* ``reward_normalization``):
    step 2 is the RLVR pipeline's spelling of the same thing.
    ``reward_norm='group'`` is ``grouping='state', method='mean_std'``
    (``reward_shift``: ``method='mean'``), ``'batch'`` is ``grouping='batch'``;
    ``reward_scale`` and ``'running'`` have no counterpart there. ROLL never
    applies both: either set ``reward_norm`` and pass raw scores (with
    ``method='identity'``), or leave it None and pass the scores
    ``normalize_rewards`` gives (steps 1 and 3-8 still apply); never both, or
    the rewards are normalized twice. ROLL's RLVR pipeline forces
    group normalization when ``adv_estimator == 'grpo'``; that choice is the
    caller's here. Clip fractions are taken over the generated tokens (ROLL
    divides by every position of the padded tensor).

    Args:
        scores: ``[B]`` raw response-level rewards (``RolloutBatch.scores``).
        loss_mask: ``[B, T]`` 1 on generated tokens.
        group_ids: ``[B]`` GRPO group ids (``reward_norm='group'``).
        running: Running moments across steps (``use_reward_scaling`` or
            ``reward_norm='running'``), updated in place once.
        use_reward_scaling: Step 1.
        use_reward_norm: Step 1 also subtracts the running mean.
        reward_norm: ROLL's ``reward_norm``: one of :data:`REWARD_NORMS` or None.
        reward_shift: Step 2 only subtracts the mean.
        reward_scale: Step 2 only divides by the std.
        reward_clip: Steps 3 and 6, or None.
        token_penalty: ``[B, T]`` subtracted in step 5 (off the mask ignored), or None.
        whiten_rewards: Step 7.

    Returns:
        :class:`ProcessedRewards`.

    Raises:
        ValueError: On ``use_reward_norm`` without ``use_reward_scaling``,
            ``reward_shift``/``reward_scale`` without ``reward_norm``, both
            ``use_reward_scaling`` and ``reward_norm='running'`` (two
            spellings of one running normalization), a missing ``running``,
            ``reward_clip <= 0``, or mismatched shapes.
    """
    check_reward_options(
        use_reward_scaling=use_reward_scaling,
        use_reward_norm=use_reward_norm,
        reward_norm=reward_norm,
        reward_shift=reward_shift,
        reward_scale=reward_scale,
    )
    if reward_clip is not None and reward_clip <= 0:
        raise ValueError(f"reward_clip must be positive (or None for no clip), got {reward_clip}")
    if scores.dim() != 1 or loss_mask.dim() != 2 or loss_mask.shape[0] != scores.shape[0]:
        raise ValueError(
            f"scores must be [B] and loss_mask [B, T], got {tuple(scores.shape)} "
            f"and {tuple(loss_mask.shape)}"
        )
    if token_penalty is not None and token_penalty.shape != loss_mask.shape:
        raise ValueError(
            f"token_penalty must have the shape of loss_mask {tuple(loss_mask.shape)}, "
            f"got {tuple(token_penalty.shape)}"
        )
    keep = loss_mask.bool()
    values = scores if scores.is_floating_point() else scores.float()  # [B]
    metrics: dict[str, float] = {}
    if use_reward_scaling:
        if running is None:
            raise ValueError("use_reward_scaling needs a RunningMoments that persists across steps")
        values = running_reward_scaling(values, running, subtract_mean=use_reward_norm)
    if reward_norm is not None:
        values = apply_reward_norm(
            values,
            reward_norm,
            shift=reward_shift,
            scale=reward_scale,
            group_ids=group_ids,
            running=running,
        )
    if reward_clip is not None:
        metrics["reward_clip_frac"] = float((values.abs() > reward_clip).float().mean())
        values = values.clamp(-reward_clip, reward_clip)
    token_rewards = last_token_rewards(values, loss_mask)  # [B, T]
    if token_penalty is not None:
        penalty = torch.where(keep, token_penalty, torch.zeros_like(token_penalty))  # [B, T]
        token_rewards = token_rewards - penalty.to(token_rewards.dtype)
    if reward_clip is not None:
        outside = (token_rewards.abs() > reward_clip) & keep  # [B, T]
        metrics["token_reward_clip_frac"] = float(outside.sum() / keep.sum().clamp(min=1))
        token_rewards = token_rewards.clamp(-reward_clip, reward_clip)
    if whiten_rewards:
        token_rewards = masked_whiten(token_rewards, loss_mask)
    token_rewards = torch.where(keep, token_rewards, torch.zeros_like(token_rewards))
    return ProcessedRewards(values, token_rewards, metrics)
