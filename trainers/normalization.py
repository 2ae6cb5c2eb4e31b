"""Scores normalized within groups of samples: pure tensor functions.

The first of the trainer's two steps from a rollout batch to per-token advantages
(the second is :mod:`~agentgym.trainers.advantages`):

* :func:`normalize_rewards` normalizes each sample's score within a group of
  samples (``grouping``: the GRPO group, the whole batch, or the env tag) with
  a ``method`` (identity, mean, mean/std, mean/std clamped to ``[-1, 3]``),
  then clamps to ``reward_clip``;
* :func:`opmd_advantages` (Trinity-RFT's OPMD) subtracts each group's baseline
  instead, and :func:`anchor_state_advantages` is GiGPO's step-level term;
* :func:`group_stats` gives each sample its group's mean and std.

Shapes: ``B`` samples; every tensor here is ``[B]`` (``G`` groups inside).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from agentgym.choices import GROUPINGS, NORM_SCOPES, NORMALIZATIONS, OPMD_BASELINES
from agentgym.errors import check_choice

STD_EPSILON = 1e-6
ASYM_CLIP_RANGE = (-1.0, 3.0)


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


def norm_scopes(
    method: str, grouping: str, mean_type: str | None, std_type: str | None
) -> tuple[str | None, str | None]:
    """ROLL's ``norm_mean_type`` and ``norm_std_type``, each unset one derived from
    ``method`` and ``grouping`` as ROLL derives it: ``identity`` neither, ``mean`` the
    mean, ``mean_std`` and ``asym_clip`` both, over the batch when ``grouping`` is
    ``batch``, else over the group."""
    scope = "batch" if grouping == "batch" else "group"
    derived = {
        "identity": (None, None),
        "mean": (scope, None),
        "mean_std": (scope, scope),
        "asym_clip": (scope, scope),
    }[method]
    return mean_type or derived[0], std_type or derived[1]


def scoped_normalize(
    scores: Tensor, group: Tensor, mean_type: str | None, std_type: str | None
) -> Tensor:
    """ROLL's agentic reward normalization: subtract the group's or the batch's mean
    (``mean_type``; None: 0), divide by the group's or the batch's unbiased std plus
    1e-6 (``std_type``; None: no division). With a std, a sample of a one-sample group,
    or whose std is at most 1e-6, gets 0.

    Args:
        scores: ``[B]`` floating scores.
        group: ``[B]`` group index in ``0..G-1``.
        mean_type: ``group``, ``batch`` or None.
        std_type: ``group``, ``batch`` or None.

    Returns:
        ``[B]`` normalized scores.
    """
    group_mean, group_std, _ = group_stats(scores, group)  # [B] each
    counts = torch.bincount(group)[group]  # [B]
    batch_mean = scores.mean().expand_as(scores)  # [B]
    center = {"group": group_mean, "batch": batch_mean, None: torch.zeros_like(scores)}[mean_type]
    if std_type is None:
        return scores - center
    spread = group_std if std_type == "group" else scores.std().expand_as(scores)  # [B]
    ok = (counts > 1) & (spread.abs() > STD_EPSILON)
    return torch.where(ok, (scores - center) / (spread + STD_EPSILON), torch.zeros_like(scores))


def normalize_rewards(
    scores: Tensor,
    *,
    grouping: str,
    method: str,
    group_ids: Tensor | Sequence[int] | None = None,
    tags: Sequence[str] | None = None,
    reward_clip: float | None = None,
    traj_group_id: Tensor | Sequence[int] | None = None,
    norm_mean_type: str | None = None,
    norm_std_type: str | None = None,
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
        norm_mean_type: ROLL's: ``group`` or ``batch`` mean. When it or
            ``norm_std_type`` is set, the two decide (:func:`scoped_normalize`), the
            unset one derived from ``method`` (:func:`norm_scopes`).
        norm_std_type: ROLL's: ``group`` or ``batch`` std.

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
    if norm_mean_type is None and norm_std_type is None:
        normalized = _NORMALIZERS[method](values, group)  # [B]
    else:
        for key, scope in (("norm_mean_type", norm_mean_type), ("norm_std_type", norm_std_type)):
            if scope is not None:
                check_choice(f"reward_normalization.{key}", scope, NORM_SCOPES)
        scopes = norm_scopes(method, grouping, norm_mean_type, norm_std_type)
        normalized = scoped_normalize(values, group, *scopes)  # [B]
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
