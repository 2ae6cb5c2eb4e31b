"""Reward normalization and advantage estimators: pure tensor functions.

The trainer turns a rollout batch into per-token advantages in two steps:

1. :func:`normalize_rewards` normalizes each sample's score within a group of
   samples (``grouping``: the GRPO group, the whole batch, or the env tag) with
   a ``method`` (identity, mean, mean/std, mean/std clamped to ``[-1, 3]``),
   then clamps to ``reward_clip``.
2. :func:`compute_advantages` spreads the result over the generated tokens with
   a registered estimator (``grpo``, ``reinforce``, ``opmd``, or one added with
   :func:`register_estimator`), then whitens and clips. ``opmd`` (Trinity-RFT's
   OPMD) first subtracts each group's baseline (:func:`opmd_advantages`, which
   the trainer applies to the normalized scores).

Shapes: ``B`` samples, ``T`` token positions; ``[B, T]`` tensors are aligned
with ``RolloutBatch.input_ids`` and ``loss_mask`` is 1 exactly on generated tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from agentgym.choices import GROUPINGS, NORMALIZATIONS, OPMD_BASELINES
from agentgym.errors import check_choice

STD_EPSILON = 1e-6
ASYM_CLIP_RANGE = (-1.0, 3.0)
WHITEN_EPSILON = 1e-8


def _group_by_state(scores: Tensor, group_ids: Tensor | None, tags: Sequence[str] | None) -> Tensor:
    if group_ids is None:
        raise ValueError(
            "grouping='state' needs group_ids (or ROLL's traj_group_id): the GRPO group of "
            "each sample (RolloutBatch.group_ids). Pass them, or use grouping='batch'."
        )
    return torch.unique(group_ids, return_inverse=True)[1]  # [B]


def _group_by_batch(scores: Tensor, group_ids: Tensor | None, tags: Sequence[str] | None) -> Tensor:
    return torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)  # [B]


def _group_by_tag(scores: Tensor, group_ids: Tensor | None, tags: Sequence[str] | None) -> Tensor:
    if tags is None:
        raise ValueError(
            "grouping='inductive' needs tags: the env tag of each sample (RolloutBatch.tags). "
            "Pass them, or use grouping='state' or 'batch'."
        )
    # Strings cannot live in a tensor: one pass to number the tags, the statistics stay vectorized.
    index = {tag: i for i, tag in enumerate(dict.fromkeys(tags))}
    return torch.tensor([index[tag] for tag in tags], dtype=torch.long, device=scores.device)


_GROUPERS: dict[str, Callable[[Tensor, Tensor | None, Sequence[str] | None], Tensor]] = {
    "state": _group_by_state,
    "batch": _group_by_batch,
    "inductive": _group_by_tag,
}


def group_stats(scores: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group mean, unbiased group std and whether the group is degenerate.

    Args:
        scores: ``[B]`` floating scores.
        group: ``[B]`` group index in ``0..G-1``.

    Returns:
        ``(mean, std, degenerate)``, each ``[B]``: the statistics of each
        sample's group; ``degenerate`` is True for groups of one sample or with
        all scores equal (their normalized score is exactly 0).
    """
    num_groups = int(group.max()) + 1 if group.numel() else 0
    counts = torch.bincount(group, minlength=num_groups).to(scores.dtype)  # [G]
    sums = scores.new_zeros(num_groups).index_add_(0, group, scores)  # [G]
    mean = (sums / counts)[group]  # [B]
    squares = scores.new_zeros(num_groups).index_add_(0, group, (scores - mean) ** 2)  # [G]
    std = (squares / (counts - 1).clamp(min=1)).sqrt()[group]  # [B], as torch.std
    highest = scores.new_zeros(num_groups).scatter_reduce(
        0, group, scores, reduce="amax", include_self=False
    )  # [G]
    lowest = scores.new_zeros(num_groups).scatter_reduce(
        0, group, scores, reduce="amin", include_self=False
    )  # [G]
    # Tested on the values, not on std == 0: a constant group's float mean can
    # miss the value by an ulp, which 1e-6 would blow up to ~1e-3.
    degenerate = ((counts < 2) | (highest == lowest))[group]  # [B]
    return mean, std, degenerate


def _identity(scores: Tensor, group: Tensor) -> Tensor:
    return scores


def _mean(scores: Tensor, group: Tensor) -> Tensor:
    mean, _, degenerate = group_stats(scores, group)
    return torch.where(degenerate, torch.zeros_like(scores), scores - mean)


def _mean_std(scores: Tensor, group: Tensor) -> Tensor:
    mean, std, degenerate = group_stats(scores, group)
    return torch.where(degenerate, torch.zeros_like(scores), (scores - mean) / (std + STD_EPSILON))


def _asym_clip(scores: Tensor, group: Tensor) -> Tensor:
    return _mean_std(scores, group).clamp(*ASYM_CLIP_RANGE)


_NORMALIZERS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "identity": _identity,
    "mean": _mean,
    "mean_std": _mean_std,
    "asym_clip": _asym_clip,
}


def normalize_rewards(
    scores: Tensor,
    *,
    grouping: str,
    method: str,
    group_ids: Tensor | Sequence[int] | None = None,
    tags: Sequence[str] | None = None,
    reward_clip: float | None = None,
    traj_group_id: Tensor | Sequence[int] | None = None,
) -> Tensor:
    """Normalize each sample's score within its group.

    Args:
        scores: ``[B]`` the reward each sample is judged by.
        grouping: One of :data:`GROUPINGS`.
        method: One of :data:`NORMALIZATIONS`. Under ``mean``, ``mean_std`` and
            ``asym_clip``, a group of one sample or whose scores are all equal
            gives exactly 0.
        group_ids: ``[B]`` GRPO group of each sample (needed for ``state``).
        tags: The env tag of each sample (needed for ``inductive``).
        reward_clip: If given, the result is clamped to ``[-reward_clip, reward_clip]``.
        traj_group_id: ROLL's name for ``group_ids``.

    Returns:
        ``[B]`` normalized scores (floating, on the device of ``scores``).

    Raises:
        ValueError: On an unknown grouping or method (with the valid options),
            missing group ids or tags, lengths that do not match ``scores``,
            both ``group_ids`` and ``traj_group_id``, or ``reward_clip <= 0``.
    """
    check_choice("reward normalization grouping", grouping, GROUPINGS)
    check_choice("reward normalization method", method, NORMALIZATIONS)
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    if group_ids is not None and traj_group_id is not None:
        raise ValueError("pass group_ids or its ROLL alias traj_group_id, not both")
    if reward_clip is not None and reward_clip <= 0:
        raise ValueError(f"reward_clip must be positive (or None for no clip), got {reward_clip}")
    ids = group_ids if group_ids is not None else traj_group_id
    ids_tensor = None if ids is None else torch.as_tensor(ids, device=scores.device).long()
    batch = scores.shape[0]
    if ids_tensor is not None and ids_tensor.shape != (batch,):
        raise ValueError(f"group_ids must have shape ({batch},), got {tuple(ids_tensor.shape)}")
    if tags is not None and len(tags) != batch:
        raise ValueError(f"tags must have one tag per sample ({batch}), got {len(tags)}")

    values = scores if scores.is_floating_point() else scores.float()
    group = _GROUPERS[grouping](values, ids_tensor, tags)  # [B]
    normalized = _NORMALIZERS[method](values, group)  # [B]
    if reward_clip is not None:
        normalized = normalized.clamp(-reward_clip, reward_clip)
    return normalized


def _opmd_mean(scores: Tensor, group: Tensor, counts: Tensor, tau: float) -> Tensor:
    sums = scores.new_zeros(counts.shape[0]).index_add_(0, group, scores)  # [G]
    return sums / counts  # [G]


def _opmd_logavgexp(scores: Tensor, group: Tensor, counts: Tensor, tau: float) -> Tensor:
    scaled = scores / tau  # [B]
    # logsumexp per group, shifted by the group's max so that no exp overflows
    top = scaled.new_zeros(counts.shape[0]).scatter_reduce(
        0, group, scaled, reduce="amax", include_self=False
    )  # [G]
    sums = scaled.new_zeros(counts.shape[0]).index_add_(0, group, (scaled - top[group]).exp())
    return tau * (top + sums.log() - counts.log())  # [G]


_OPMD_BASELINES: dict[str, Callable[[Tensor, Tensor, Tensor, float], Tensor]] = {
    "mean": _opmd_mean,
    "logavgexp": _opmd_logavgexp,
}


def opmd_advantages(
    scores: Tensor,
    *,
    baseline: str,
    tau: float,
    grouping: str = "state",
    group_ids: Tensor | Sequence[int] | None = None,
    tags: Sequence[str] | None = None,
) -> Tensor:
    """OPMD's per-sample advantage (Trinity-RFT's ``opmd`` advantage_fn): ``[B]``.

    Each sample's score minus its group's baseline: the group's ``mean``, or
    ``logavgexp``, ``tau * log(mean_j exp(score_j / tau))`` (a soft maximum: it
    tends to the mean as ``tau`` grows and to the maximum as it shrinks). A group
    of one sample has baseline 0, so its advantage is its score (Trinity's rule;
    GRPO's normalization gives such a sample 0).

    Args:
        scores: ``[B]`` each sample's score.
        baseline: One of :data:`~agentgym.choices.OPMD_BASELINES`.
        tau: ``logavgexp``'s temperature (``> 0``; unused by ``mean``).
        grouping: One of :data:`GROUPINGS` (Trinity groups by task: ``state``).
        group_ids: ``[B]`` GRPO group of each sample (needed for ``state``).
        tags: The env tag of each sample (needed for ``inductive``).

    Returns:
        ``[B]`` advantages (floating, on the device of ``scores``).

    Raises:
        ValueError: On an unknown baseline or grouping, ``tau <= 0``, or missing
            or mis-sized group ids or tags.
    """
    check_choice("opmd_baseline", baseline, OPMD_BASELINES)
    check_choice("reward normalization grouping", grouping, GROUPINGS)
    if not tau > 0:
        raise ValueError(f"opmd_baseline_tau must be > 0, got {tau}")
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D [B], got shape {tuple(scores.shape)}")
    ids = None if group_ids is None else torch.as_tensor(group_ids, device=scores.device).long()
    if ids is not None and ids.shape != scores.shape:
        raise ValueError(f"group_ids must have shape {tuple(scores.shape)}, got {tuple(ids.shape)}")
    if tags is not None and len(tags) != scores.shape[0]:
        raise ValueError(f"tags must have one tag per sample ({scores.shape[0]}), got {len(tags)}")
    values = scores if scores.is_floating_point() else scores.float()
    group = _GROUPERS[grouping](values, ids, tags)  # [B]
    if not group.numel():
        return values.clone()
    group = torch.unique(group, return_inverse=True)[1]  # [B], in 0..G-1
    counts = torch.bincount(group).to(values.dtype)  # [G]
    base = _OPMD_BASELINES[baseline](values, group, counts, tau)  # [G]
    base = torch.where(counts > 1, base, torch.zeros_like(base))[group]  # [B]
    return values - base


def anchor_state_advantages(step_returns: Tensor, state_ids: Tensor, method: str) -> Tensor:
    """GiGPO's step-level advantages (Feng et al., 2025): ``[B]``.

    Samples of one GRPO group whose turn answered the same observation form an
    anchor-state group. Each sample's discounted return from that turn on is
    normalized within its anchor-state group with ``method``, so an action is
    judged against the other actions taken from the same state. A state seen
    once gives 0. The trainer adds ``step_advantage_weight`` times this to the
    episode-level (GRPO) normalized score.

    Args:
        step_returns: ``[B]`` each sample's discounted return from its turn on.
        state_ids: ``[B]`` anchor-state group ids (``RolloutBatch.state_ids``).
        method: One of :data:`NORMALIZATIONS`.
    """
    return normalize_rewards(step_returns, grouping="state", method=method, group_ids=state_ids)


class AdvantageEstimator(Protocol):
    """Per-token advantages from normalized scores and token rewards."""

    def __call__(
        self,
        normalized_scores: Tensor,
        token_rewards: Tensor,
        loss_mask: Tensor,
        *,
        gamma: float = 1.0,
        baseline: bool = False,
    ) -> Tensor:
        """Return ``[B, T]`` advantages (0 off ``loss_mask``)."""
        ...


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
"""Estimators by name; add one with :func:`register_estimator`."""


def register_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator that registers an advantage estimator under ``name``.

    Example::

        @register_estimator("gigpo")
        def gigpo(normalized_scores, token_rewards, loss_mask, *, gamma=1.0, baseline=False):
            ...

    Raises:
        ValueError: If another function is already registered under ``name``.
    """

    def decorator(fn: AdvantageEstimator) -> AdvantageEstimator:
        existing = ADVANTAGE_ESTIMATORS.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered ({existing})")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return decorator


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` where ``mask`` is nonzero (0 when the mask is empty).

    Args:
        values: Any shape.
        mask: Same shape as ``values``.

    Returns:
        A 0-d tensor.
    """
    keep = mask.bool()
    total = torch.where(keep, values, torch.zeros_like(values)).sum()
    return total / keep.sum().clamp(min=1)


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    """Shift to zero mean and scale to unit variance over the masked entries (as verl).

    The mean and the unbiased (Bessel-corrected) variance are taken over the
    masked entries; ``(values - mean) * rsqrt(var + 1e-8)``. With fewer than
    two masked entries the variance is taken as 0 (verl raises instead).

    Args:
        values: ``[B, T]``.
        mask: ``[B, T]``.

    Returns:
        ``[B, T]`` whitened values, 0 off the mask.
    """
    keep = mask.bool()
    count = keep.sum()
    mean = masked_mean(values, keep)
    centered = torch.where(keep, values - mean, torch.zeros_like(values))  # [B, T]
    var = (centered**2).sum() / (count - 1).clamp(min=1)
    return centered * torch.rsqrt(var + WHITEN_EPSILON)


@register_estimator("opmd")
@register_estimator("grpo")
def grpo_advantages(
    normalized_scores: Tensor,
    token_rewards: Tensor,
    loss_mask: Tensor,
    *,
    gamma: float = 1.0,
    baseline: bool = False,
) -> Tensor:
    """GRPO: the sample's normalized score on each of its generated tokens. OPMD's
    estimator too: there the scores are already its advantages (:func:`opmd_advantages`,
    which the trainer applies to ``normalized_scores``).

    Args:
        normalized_scores: ``[B]`` from :func:`normalize_rewards`.
        token_rewards: ``[B, T]`` unused (outcome reward only).
        loss_mask: ``[B, T]`` 1 on generated tokens.
        gamma: Unused.
        baseline: Unused (the group normalization is the baseline).

    Returns:
        ``[B, T]`` advantages, 0 off the mask.
    """
    values = normalized_scores[:, None].to(token_rewards.dtype).expand_as(token_rewards)  # [B, T]
    return torch.where(loss_mask.bool(), values, torch.zeros_like(values))


@register_estimator("reinforce")
def reinforce_advantages(
    normalized_scores: Tensor,
    token_rewards: Tensor,
    loss_mask: Tensor,
    *,
    gamma: float = 1.0,
    baseline: bool = False,
) -> Tensor:
    """REINFORCE: the discounted return-to-go of each generated token.

    Only generated tokens are time steps: for a sample whose generated
    positions are ``t_1 < t_2 < ... < t_n``, the token at ``t_k`` gets
    ``G_k = sum_{j >= k} gamma**(j - k) * r(t_j)``, where ``r`` is
    ``token_rewards`` (each turn's reward sits on its last generated token, so
    it counts undiscounted for that token). Prompt and observation tokens
    neither discount nor add reward; rewards placed off the mask are ignored.
    ``gamma`` is thus per generated token, not per turn.

    Args:
        normalized_scores: ``[B]`` unused: the returns come from
            ``token_rewards`` (to use normalized outcome scores, put them on
            the last generated token with :func:`last_token_rewards`).
        token_rewards: ``[B, T]`` rewards on generated tokens.
        loss_mask: ``[B, T]`` 1 on generated tokens.
        gamma: Discount per generated token, in ``[0, 1]``.
        baseline: Subtract the batch mean of the returns over all generated
            tokens (one scalar for the batch).

    Returns:
        ``[B, T]`` advantages, 0 off the mask.

    Raises:
        ValueError: If ``gamma`` is outside ``[0, 1]``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    keep = loss_mask.bool()
    rewards = torch.where(keep, token_rewards, torch.zeros_like(token_rewards))  # [B, T]
    if gamma == 1.0:
        returns = rewards.flip(-1).cumsum(-1).flip(-1)  # [B, T]
    else:
        # A recurrence over positions (vectorized over the batch), as verl's
        # REINFORCE++: gamma**t factors would underflow on long sequences.
        returns = torch.zeros_like(rewards)
        running = rewards.new_zeros(rewards.shape[0])  # [B]
        for t in range(rewards.shape[1] - 1, -1, -1):
            running = torch.where(keep[:, t], rewards[:, t] + gamma * running, running)
            returns[:, t] = running
    if baseline:
        returns = returns - masked_mean(returns, keep)
    return torch.where(keep, returns, torch.zeros_like(returns))


def last_token_rewards(scores: Tensor, loss_mask: Tensor) -> Tensor:
    """Place each sample's score on its last generated token (ROLL's token-level reward).

    Args:
        scores: ``[B]`` (e.g. normalized scores).
        loss_mask: ``[B, T]`` 1 on generated tokens.

    Returns:
        ``[B, T]`` zeros except ``scores[b]`` at the last masked position of row
        ``b`` (a row without generated tokens stays 0).
    """
    keep = loss_mask.bool()
    positions = torch.arange(keep.shape[1], device=keep.device).expand_as(keep)  # [B, T]
    last = torch.where(keep, positions, -1).amax(dim=1)  # [B], -1 for an empty row
    out = torch.zeros(keep.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = scores[rows]
    return out


def compute_advantages(
    name: str,
    *,
    normalized_scores: Tensor,
    token_rewards: Tensor,
    loss_mask: Tensor,
    gamma: float = 1.0,
    baseline: bool = False,
    whiten: bool = False,
    clip: float | None = None,
) -> Tensor:
    """Per-token advantages with a registered estimator, then whitening and clipping.

    Args:
        name: A key of :data:`ADVANTAGE_ESTIMATORS` (``grpo``, ``reinforce``, ...).
        normalized_scores: ``[B]`` from :func:`normalize_rewards`.
        token_rewards: ``[B, T]`` rewards on generated tokens.
        loss_mask: ``[B, T]`` 1 on generated tokens.
        gamma: Discount per generated token (estimators that use one).
        baseline: Whether the estimator subtracts its baseline.
        whiten: Whiten over the generated tokens of the batch (:func:`masked_whiten`).
        clip: If given, clamp to ``[-clip, clip]`` (``advantage_clip``).

    Returns:
        ``[B, T]`` advantages, exactly 0 off ``loss_mask``.

    Raises:
        ValueError: On an unknown estimator (with the registered names), on
            mismatched shapes, or on ``clip <= 0``.
    """
    estimator = ADVANTAGE_ESTIMATORS[
        check_choice("advantage estimator", name, list(ADVANTAGE_ESTIMATORS))
    ]
    if token_rewards.shape != loss_mask.shape or token_rewards.dim() != 2:
        raise ValueError(
            f"token_rewards and loss_mask must both be [B, T], got {tuple(token_rewards.shape)} "
            f"and {tuple(loss_mask.shape)}"
        )
    if normalized_scores.shape != token_rewards.shape[:1]:
        raise ValueError(
            f"normalized_scores must be [B] = [{token_rewards.shape[0]}], "
            f"got {tuple(normalized_scores.shape)}"
        )
    advantages = estimator(
        normalized_scores, token_rewards, loss_mask, gamma=gamma, baseline=baseline
    )  # [B, T]
    return finish_advantages(advantages, loss_mask, whiten=whiten, clip=clip)


def finish_advantages(
    advantages: Tensor, loss_mask: Tensor, *, whiten: bool = False, clip: float | None = None
) -> Tensor:
    """What follows every estimator (GAE's too): whiten, clip, 0 off the mask.

    Args:
        advantages: ``[B, T]`` an estimator's advantages.
        loss_mask: ``[B, T]`` 1 on generated tokens.
        whiten: Whiten over the generated tokens of the batch (:func:`masked_whiten`).
        clip: If given, clamp to ``[-clip, clip]`` (``advantage_clip``).

    Returns:
        ``[B, T]`` advantages, exactly 0 off ``loss_mask``.

    Raises:
        ValueError: On ``clip <= 0``.
    """
    if clip is not None and clip <= 0:
        raise ValueError(f"advantage clip must be positive (or None for no clip), got {clip}")
    if whiten:
        advantages = masked_whiten(advantages, loss_mask)
    if clip is not None:
        advantages = advantages.clamp(-clip, clip)
    return torch.where(loss_mask.bool(), advantages, torch.zeros_like(advantages))
