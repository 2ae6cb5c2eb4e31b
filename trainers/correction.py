"""Off-policy correction: behaviour, proximal and trained policies, as pure tensor functions.

Three policies meet in one PPO step (AReaL's decoupled objective, verl's
"rollout correction", ROLL's ``train_infer_correction``):

- the *behaviour* policy μ sampled the tokens: the engine's log-probabilities
  (``RolloutBatch.engine_logprobs``, at the sampling temperature), possibly some
  policy versions old under async generation, and computed with the engine's
  numerics (the train–inference mismatch);
- the *proximal* policy π_prox: the trainer's recomputation with the weights
  about to be updated (``old_logprobs: trainer``);
- the policy π_θ being trained.

Two modes, picked by whether proximal log-probabilities are given:

- **bypass** (``old_logprobs: engine``): π_old = μ. The PPO ratio π_θ/μ is
  itself clipped; there is nothing to weigh before the update (the IS ratio
  π_prox/μ is not known without a trainer forward pass), so no weights, no mask.
- **decoupled** (``old_logprobs: trainer``): π_old = π_prox, and each token's
  loss is weighted by ``w = π_prox/μ`` (truncated, :data:`WEIGHT_TYPES` says
  at which granularity), tokens or sequences whose ratio is extreme leave the
  loss mask (:func:`filter_mask`). With ``w`` untruncated and no filter this is
  AReaL's decoupled PPO loss; truncated, it is TIS (Yao et al. 2025, "Your
  efficient RL framework secretly brings you off-policy RL training").

All ``[B, T]`` tensors are aligned with ``RolloutBatch.input_ids``; ``mask`` is
the loss mask (1 on generated tokens). Values off the mask never reach a
weight, a mask or a metric. See docs/off_policy.md for the keys and the peers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentgym.choices import WEIGHT_TYPES
from agentgym.errors import check_choice

LOG_RATIO_LIMIT = 20.0
"""|log ratio| is clamped before ``exp`` (verl's SAFETY_BOUND): no weight overflows."""


@dataclass(frozen=True)
class ISWeight:
    """Truncated importance weights ``min(π_prox/μ, upper_bound)`` (ROLL's ``is_weight``).

    Attributes:
        weight_type: One of :data:`WEIGHT_TYPES`.
        upper_bound: The truncation (TIS), or None for untruncated weights.
    """

    weight_type: str
    upper_bound: float | None


@dataclass(frozen=True)
class RatioFilter:
    """One of ROLL's ``train_infer_correction.filters``: tokens (or whole
    sequences/segments) whose statistic leaves the bounds leave the loss mask.

    Attributes:
        agg_type: One of :data:`WEIGHT_TYPES`.
        ratio_bounds: ``(low, high)`` on the ratio π_prox/μ at ``agg_type``, or None.
        diff_bounds: ``(low, high)`` on the probability difference ``π_prox - μ``
            (averaged or summed at ``agg_type`` as ROLL does), or None.
    """

    agg_type: str
    ratio_bounds: tuple[float, float] | None
    diff_bounds: tuple[float, float] | None


@dataclass(frozen=True)
class CorrectionConfig:
    """What :func:`correction_terms` applies; ``is_weight=None`` and no filters is off."""

    is_weight: ISWeight | None
    filters: tuple[RatioFilter, ...]

    @property
    def enabled(self) -> bool:
        """Whether anything changes the loss (weights or a filter)."""
        return self.is_weight is not None or bool(self.filters)


def correction_config(section: Any, *, tis_cap: float | None = None) -> CorrectionConfig:
    """The :class:`CorrectionConfig` of the schema's ``train_infer_correction`` section.

    Disabled entries are dropped. ``tis_cap`` (agentgym's older key) is token
    weights truncated at it: ``is_weight: {enabled: true, weight_type: token,
    upper_bound: tis_cap}``.
    """
    weight = section.is_weight
    is_weight = ISWeight(weight.weight_type, weight.upper_bound) if weight.enabled else None
    if is_weight is None and tis_cap is not None:
        is_weight = ISWeight("token", tis_cap)
    filters = tuple(
        RatioFilter(
            f.agg_type,
            (f.ratio_low, f.ratio_high) if f.ratio_enabled else None,
            (f.diff_low, f.diff_high) if f.diff_enabled else None,
        )
        for f in section.filters
        if f.enabled and (f.ratio_enabled or f.diff_enabled)
    )
    return CorrectionConfig(is_weight, filters)


# Granularities: a [B, T] per-token value becomes a [B, T] value at that level.


def _token(values: Tensor, keep: Tensor) -> Tensor:
    return values


def _sequence_sum(values: Tensor, keep: Tensor) -> Tensor:
    return torch.where(keep, values, 0.0).sum(-1, keepdim=True).expand_as(values)  # [B, T]


def _sequence_mean(values: Tensor, keep: Tensor) -> Tensor:
    count = keep.sum(-1, keepdim=True).clamp(min=1)  # [B, 1]
    return (torch.where(keep, values, 0.0).sum(-1, keepdim=True) / count).expand_as(values)


def _segment_mean(values: Tensor, keep: Tensor) -> Tensor:
    # A segment is a run of consecutive masked tokens (one turn of a trajectory sample).
    starts = keep & ~torch.nn.functional.pad(keep[:, :-1], (1, 0), value=False)  # [B, T]
    ids = torch.cumsum(starts.flatten().long(), 0).view_as(values) - 1  # [B, T], -1 before any
    ids = torch.where(keep, ids, 0)
    slots = int(starts.sum()) or 1
    kept = torch.where(keep, values, 0.0).flatten()  # [B*T]
    total = values.new_zeros(slots).index_add_(0, ids.flatten(), kept)
    count = values.new_zeros(slots).index_add_(0, ids.flatten(), keep.flatten().to(values.dtype))
    return (total / count.clamp(min=1))[ids]  # [B, T]


_LEVELS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "token": _token,
    "segment": _segment_mean,
    "geometric": _sequence_mean,
    "sequence": _sequence_sum,
}
"""Each granularity of ROLL's ``_compute_all_granularity``: applied to the log ratio
they give the token ratio, each turn's and each sequence's geometric mean, and the
sequence's product; applied to the probability difference, its token value, turn
and sequence means, and sequence sum."""


def level_log_ratio(log_ratio: Tensor, mask: Tensor, level: str) -> Tensor:
    """``log(π_prox/μ)`` at a granularity, broadcast to the tokens.

    Args:
        log_ratio: ``[B, T]`` ``proximal - behaviour`` log-probabilities.
        mask: ``[B, T]`` 1 on generated tokens.
        level: One of :data:`WEIGHT_TYPES`: ``token`` (each token's),
            ``segment`` (the mean over each run of masked tokens, i.e. each turn),
            ``geometric`` (the mean over the sequence), ``sequence`` (the sum).

    Returns:
        ``[B, T]`` (values off the mask are meaningless).
    """
    check_choice("weight_type", level, WEIGHT_TYPES)
    return _LEVELS[level](log_ratio, mask.bool())


def importance_weights(
    log_ratio: Tensor, mask: Tensor, level: str, upper_bound: float | None
) -> tuple[Tensor, Tensor]:
    """Truncated importance weights ``min(exp(level log ratio), upper_bound)``.

    Args:
        log_ratio: ``[B, T]`` ``proximal - behaviour`` (or ``trainer - engine``) log-probabilities.
        mask: ``[B, T]`` 1 on generated tokens.
        level: One of :data:`WEIGHT_TYPES` (see :func:`level_log_ratio`).
        upper_bound: Truncation (> 0), or None for none.

    Returns:
        ``(weights, clipped)``: ``[B, T]`` detached weights (1 off the mask) and
        ``[B, T]`` bool, True on masked tokens whose weight was truncated.

    Raises:
        ValueError: If ``upper_bound <= 0`` or the shapes differ.
    """
    if upper_bound is not None and upper_bound <= 0:
        raise ValueError(f"is_weight.upper_bound must be positive (or null), got {upper_bound}")
    _check_shapes(log_ratio=log_ratio, mask=mask)
    keep = mask.bool()
    with torch.no_grad():
        level_ratio = level_log_ratio(log_ratio.detach(), keep, level)  # [B, T]
        weights = torch.exp(level_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))  # [B, T]
        clipped = torch.zeros_like(keep)
        if upper_bound is not None:
            clipped = keep & (weights > upper_bound)
            weights = weights.clamp(max=upper_bound)
        return torch.where(keep, weights, 1.0), clipped


def filter_parts(
    proximal: Tensor, behaviour: Tensor, mask: Tensor, ratio_filter: RatioFilter
) -> dict[str, Tensor]:
    """Each bound of one of ROLL's filters: ``[B, T]`` bool, True where a token passes.

    The ratio bounds apply to ``exp(level log ratio)``; the difference bounds to
    ``exp(proximal) - exp(behaviour)`` at the same level. A ``sequence``,
    ``geometric`` or ``segment`` filter keeps or drops all of a sequence's
    (a segment's) tokens together.

    Args:
        proximal: ``[B, T]`` π_prox log-probabilities.
        behaviour: ``[B, T]`` μ log-probabilities.
        mask: ``[B, T]`` 1 on generated tokens.
        ratio_filter: The bounds and granularity.

    Returns:
        ``{"ratio": [B, T], "diff": [B, T]}`` for the bounds set (True off the mask:
        only generated tokens are filtered).
    """
    _check_shapes(proximal=proximal, behaviour=behaviour, mask=mask)
    keep = mask.bool()
    level = _LEVELS[check_choice("agg_type", ratio_filter.agg_type, WEIGHT_TYPES)]
    parts: dict[str, Tensor] = {}
    with torch.no_grad():
        if ratio_filter.ratio_bounds is not None:
            low, high = ratio_filter.ratio_bounds
            log_ratio = level(proximal - behaviour, keep)  # [B, T]
            ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))  # [B, T]
            parts["ratio"] = (ratio >= low) & (ratio <= high) | ~keep
        if ratio_filter.diff_bounds is not None:
            low, high = ratio_filter.diff_bounds
            diff = level(proximal.exp() - behaviour.exp(), keep)  # [B, T]
            parts["diff"] = (diff >= low) & (diff <= high) | ~keep
    return parts


def filter_mask(
    proximal: Tensor, behaviour: Tensor, mask: Tensor, filters: Sequence[RatioFilter]
) -> Tensor:
    """``[B, T]`` bool: True where a token passes every filter (see :func:`filter_parts`)."""
    passed = torch.ones_like(mask, dtype=torch.bool)
    for ratio_filter in filters:
        for part in filter_parts(proximal, behaviour, mask, ratio_filter).values():
            passed &= part
    return passed


@dataclass
class CorrectionTerms:
    """What :func:`correction_terms` gives the recipe.

    Attributes:
        old_logprobs: ``[B, T]`` π_old of the PPO ratio (π_prox, or μ in bypass).
        is_weights: ``[B, T]`` detached weights of the per-token policy loss
            (``RolloutBatch.is_weights``), or None.
        keep: ``[B, T]`` 0/1 (the loss mask's dtype): multiply the loss mask by it
            after the advantages are computed, or None when no filter is set.
        metrics: Floats, unprefixed (the recipe logs them under ``actor/``).
    """

    old_logprobs: Tensor
    is_weights: Tensor | None
    keep: Tensor | None
    metrics: dict[str, float]


def correction_terms(
    mask: Tensor, behaviour: Tensor, proximal: Tensor | None, config: CorrectionConfig
) -> CorrectionTerms:
    """π_old, the importance weights and the filter mask of one step, with their metrics.

    Call it once per step, before the update, on the whole batch.

    Args:
        mask: ``[B, T]`` the loss mask.
        behaviour: ``[B, T]`` μ: the engine's log-probabilities.
        proximal: ``[B, T]`` π_prox: the trainer's recomputation, or None (bypass).
        config: See :func:`correction_config`.

    Returns:
        See :class:`CorrectionTerms`. Metrics (decoupled only), over generated tokens:
        ``engine_logprob_abs_diff_mean``/``_max``, ``engine_logprob_diff_mean``
        (π_prox minus μ), ``engine_kl_k1`` and ``engine_kl_k3`` (estimates of
        KL(μ ‖ π_prox)), ROLL's ``train_infer_ratio_{level}_mean`` and
        ``train_infer_diff_{level}_mean`` (sequence means of token means, ROLL's
        ``seq-mean-token-mean``); with weights ``is_weight_clipfrac`` and
        ``is_weight_mean``; with filters each filter's pass rate
        ``train_infer_{level}_ratio_mask_mean`` / ``_diff_mask_mean``,
        ``train_infer_final_mask_mean`` and ``train_infer_mask_fraction``
        (the share of generated tokens that left the mask).

    Raises:
        ValueError: If weights or filters are configured without ``proximal``
            (they need π_prox: set ``old_logprobs: trainer``), or on mismatched shapes.
    """
    keep = mask.bool()
    behaviour = torch.where(keep, behaviour, 0.0)  # [B, T]
    if proximal is None:
        if config.enabled:
            raise ValueError(
                "train_infer_correction weighs and filters by π_prox/μ, which needs the trainer's "
                "log-probabilities: set old_logprobs=trainer (it is engine: the bypass mode)"
            )
        return CorrectionTerms(behaviour, None, None, {})
    _check_shapes(mask=mask, behaviour=behaviour, proximal=proximal)
    proximal = torch.where(keep, proximal.detach(), 0.0)  # [B, T]
    log_ratio = proximal - behaviour  # [B, T], 0 off the mask
    metrics = mismatch_metrics(proximal, behaviour, mask)
    weights = None
    if config.is_weight is not None:
        weights, clipped = importance_weights(
            log_ratio, mask, config.is_weight.weight_type, config.is_weight.upper_bound
        )
        metrics["is_weight_clipfrac"] = _mean(clipped.float(), keep)
        metrics["is_weight_mean"] = _mean(weights, keep)
    passed = None
    if config.filters:
        passed = torch.ones_like(keep)
        for ratio_filter in config.filters:
            for kind, part in filter_parts(proximal, behaviour, mask, ratio_filter).items():
                metrics[f"train_infer_{ratio_filter.agg_type}_{kind}_mask_mean"] = _mean(
                    part.float(), keep
                )
                passed &= part
        metrics["train_infer_final_mask_mean"] = _mean(passed.float(), keep)
        metrics["train_infer_mask_fraction"] = 1.0 - metrics["train_infer_final_mask_mean"]
    keep_mask = None if passed is None else passed.to(mask.dtype)
    return CorrectionTerms(proximal, weights, keep_mask, metrics)


def mismatch_metrics(proximal: Tensor, behaviour: Tensor, mask: Tensor) -> dict[str, float]:
    """The train–inference (or staleness) gap between π_prox and μ over generated tokens.

    Args:
        proximal: ``[B, T]`` the trainer's log-probabilities.
        behaviour: ``[B, T]`` the engine's.
        mask: ``[B, T]`` 1 on generated tokens.

    Returns:
        See :func:`correction_terms`; 0 for an empty mask.
    """
    _check_shapes(proximal=proximal, behaviour=behaviour, mask=mask)
    keep = mask.bool()
    with torch.no_grad():
        diff = torch.where(keep, proximal - behaviour, 0.0)  # [B, T], log(π_prox/μ)
        safe = diff.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        metrics = {
            "engine_logprob_abs_diff_mean": _mean(diff.abs(), keep),
            "engine_logprob_abs_diff_max": float(diff.abs().amax()) if diff.numel() else 0.0,
            "engine_logprob_diff_mean": _mean(diff, keep),
            "engine_kl_k1": _mean(-diff, keep),
            "engine_kl_k3": _mean(torch.exp(safe) - safe - 1, keep),
        }
        rows = keep.any(-1)  # [B]
        prob_diff = torch.where(keep, proximal.exp() - behaviour.exp(), 0.0)  # [B, T]
        for level in WEIGHT_TYPES:
            ratio = torch.exp(_LEVELS[level](diff, keep).clamp(max=LOG_RATIO_LIMIT))
            level_diff = _LEVELS[level](prob_diff, keep)
            metrics[f"train_infer_ratio_{level}_mean"] = _seq_mean_token_mean(ratio, keep, rows)
            metrics[f"train_infer_diff_{level}_mean"] = _seq_mean_token_mean(level_diff, keep, rows)
    return metrics


def _seq_mean_token_mean(values: Tensor, keep: Tensor, rows: Tensor) -> float:
    per_row = torch.where(keep, values, 0.0).sum(-1) / keep.sum(-1).clamp(min=1)  # [B]
    return float(per_row[rows].mean()) if bool(rows.any()) else 0.0


def _mean(values: Tensor, keep: Tensor) -> float:
    return float(torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1))


def _check_shapes(**tensors: Tensor) -> None:
    shapes = {key: tuple(tensor.shape) for key, tensor in tensors.items()}
    if len(set(shapes.values())) != 1 or len(next(iter(shapes.values()))) != 2:
        raise ValueError(f"these tensors must all be [B, T], got {shapes}")
