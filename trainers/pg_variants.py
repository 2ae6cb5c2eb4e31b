"""ROLL's agentic ``pg_variant`` policy losses (and Trinity-RFT's ``opmd``), one pure
function each.

ROLL's ``roll/pipeline/agentic/agentic_actor_pg_worker.py`` (``actor_train.worker_cls:
...agentic_actor_pg_worker.ActorWorker``) picks the per-token policy loss by
``pg_variant``. With ``r = pi / pi_old`` per token, advantage ``A``, ``lp`` the
policy's log-probability (with gradient) and ``sg`` a stopped gradient:

=========  ==========================================================================
vanilla    ``-A * lp`` (REINFORCE; the ratio is not used)
ppo        PPO-clip, with dual-clip (:func:`~agentgym.trainers.losses.policy_loss`)
tis        ``-sg(clip(r, tis_lower_bound, tis_upper_bound)) * A * lp``
topr       ``-w * A * lp`` with ``w = topr_positive_weight`` on a sample whose score
           is ``> 0``, ``topr_negative_weight * sg(clip(r, 0, 1))`` otherwise
           (Le Roux et al. 2025, arXiv:2503.14286, eq. 8); with
           ``topr_advantage_threshold`` set, per token by ``A > threshold``
           instead (Trinity-RFT's ``topr``)
cispo      ``-sg(clip(r, 1 - cispo_epsilon_low, 1 + cispo_epsilon_high)) * A * lp``;
           with ``cispo_use_unified_mask``, 0 where PPO's clip would stop the
           gradient (MiniMax-M1, arXiv:2506.13585, eq. 7)
kimi15     ``-A * lp + kimi15_tau / 2 * (lp - lp_old) ** 2`` (Kimi k1.5,
           arXiv:2501.12599, eq. 3, per token as ROLL)
opmd       ``-A * lp / (1 + opmd_tau)`` (Trinity-RFT's online policy mirror descent;
           no ratio, no clip)
=========  ==========================================================================

Every function here has one signature: the ``[B, T]`` tensors of
:func:`~agentgym.trainers.losses.policy_loss`, its own knobs as required keyword
arguments named as the config keys (:data:`~agentgym.choices.PG_VARIANT_KNOBS`), then the
:class:`VariantArgs` that every variant takes: ``scores`` (each sample's
episode score; only ``topr`` reads it) and what ``policy_loss`` takes after its
clip ratios (``is_weights``, ROLL's ``train_infer_correction.is_weight``,
multiplied after the variant as ROLL does; ``sample_weights``;
``loss_agg_mode`` and the mini-batch counts of
:func:`~agentgym.trainers.losses.aggregate_loss`). Each returns ``(loss,
metrics)`` as ``policy_loss`` does: ``pg_loss``, ``approx_kl``, ``ratio_mean``,
``ratio_min``, ``ratio_max`` (see
:data:`~agentgym.trainers.losses.POLICY_LOSS_REDUCE`), ``is_weight_mean`` with
``is_weights``, and the variant's own, token shares that add up over
micro-batches.

Against ROLL's own ``loss_func`` on random ragged batches (40 seeds, every
``loss_agg_mode``, with and without ``is_weights``, float64), loss and gradient
agree to 1e-14 for every variant, except where they differ on purpose:

- Off the loss mask every term is exactly 0. ROLL's ``token-mean`` sums the
  unmasked loss matrix, which for ``kimi15`` adds ``tau / 2 * (lp - lp_old) ** 2``
  of prompt and env tokens (0 only while the two forward passes agree bit for
  bit); the regularizer here is over generated tokens, as the paper's ``y, z``.
- The log-ratio is clamped to ``[-20, 20]`` before ``exp``, as everywhere in
  :mod:`~agentgym.trainers.losses`; it changes only ratios beyond ``e**20``,
  which ``tis``, ``topr`` and ``cispo`` clip anyway. In ``ppo`` without
  dual-clip, a token with ``A < 0`` and ``r > e**20`` has a bounded loss and no
  gradient here, where ROLL's grows without bound (``-A * r``).
- ``topr`` splits by ``scores``, one per row. ROLL groups its micro-batch by
  ``traj_id`` for the scores, which gives one per row in trajectory mode and
  fails on shapes in step mode (several rows per trajectory); here each row
  carries its sample's score, which in step mode is its episode's with
  ``step_score: episode`` (the default) and its turn's reward with ``turn``.
- ROLL's ``ratio_type: segment`` (one ratio per contiguous response segment) is
  not built: the ratio is per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import torch
from torch import Tensor

from agentgym.choices import PG_VARIANT_KNOBS as PG_VARIANT_KNOBS  # its knobs, re-exported
from agentgym.trainers.loss_terms import topr_loss
from agentgym.trainers.losses import (
    Aggregation,
    check_policy_inputs,
    finish_policy_loss,
    masked_ratio,
    policy_loss,
    token_share,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

PgVariant = Callable[..., tuple[Tensor, dict[str, Tensor]]]


class VariantArgs(TypedDict, total=False):
    """The keyword arguments every variant takes after its knobs (all optional).

    Attributes:
        scores: ``[B]`` each sample's episode score (``topr`` requires it).
        is_weights: ``[B, T]`` importance-sampling weights (detached).
        sample_weights: ``[B]`` per-sample weights (detached).
        loss_agg_mode: One of :data:`~agentgym.choices.LOSS_AGG_MODES` (``token-mean``).
        norm_length: See :func:`~agentgym.trainers.losses.aggregate_loss`.
        num_tokens: See :func:`~agentgym.trainers.losses.aggregate_loss`.
        num_seqs: See :func:`~agentgym.trainers.losses.aggregate_loss`.
    """

    scores: Tensor | None
    is_weights: Tensor | None
    sample_weights: Tensor | None
    loss_agg_mode: str
    norm_length: int | None
    num_tokens: Tensor | float | None
    num_seqs: Tensor | float | None


def _aggregation(args: VariantArgs) -> dict[str, Any]:
    """``policy_loss``'s keyword arguments after its clip ratios, with their defaults."""
    return {
        "loss_agg_mode": args.get("loss_agg_mode", "token-mean"),
        "is_weights": args.get("is_weights"),
        "sample_weights": args.get("sample_weights"),
        "norm_length": args.get("norm_length"),
        "num_tokens": args.get("num_tokens"),
        "num_seqs": args.get("num_seqs"),
    }


def _finish(
    per_token: Tensor,
    mask: Tensor,
    log_ratio: Tensor,
    ratio: Tensor,
    metrics: dict[str, Tensor],
    args: VariantArgs,
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`~agentgym.trainers.losses.finish_policy_loss` with ``args``' weights and
    aggregation."""
    kwargs = _aggregation(args)
    aggregation = Aggregation(
        kwargs["loss_agg_mode"], kwargs["norm_length"], kwargs["num_tokens"], kwargs["num_seqs"]
    )
    return finish_policy_loss(
        per_token, mask, log_ratio, ratio, metrics, aggregation,
        kwargs["is_weights"], kwargs["sample_weights"],
    )  # fmt: skip


def _check_weight(key: str, value: float, peer_default: str) -> None:
    """Raise ValueError when the variant's weight ``key`` is negative (or NaN), with the
    peer's default (``"ROLL's default: 0.1"``) as the fix."""
    if not value >= 0:
        raise ValueError(f"{key} must be >= 0, got {value} ({peer_default})")


def _inputs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, args: VariantArgs
) -> tuple[Tensor, Tensor, Tensor]:
    """``(keep, log_ratio, ratio)`` after the shape checks."""
    check_policy_inputs(logprobs, old_logprobs, advantages, mask, args.get("is_weights"))
    keep = mask.bool()
    log_ratio, ratio = masked_ratio(logprobs, old_logprobs, keep)  # [B, T], [B, T]
    return keep, log_ratio, ratio


def _reinforce(weight: Tensor, logprobs: Tensor, advantages: Tensor, keep: Tensor) -> Tensor:
    """``-sg(weight) * A * logprobs`` on ``keep``, exactly 0 (no NaN) off it."""
    zeros = torch.zeros_like(logprobs)
    logprobs = torch.where(keep, logprobs, zeros)  # [B, T]
    advantages = torch.where(keep, advantages, zeros)  # [B, T]
    return -weight.detach() * advantages * logprobs


def vanilla(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    **args: Unpack[VariantArgs],
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE: ``-A * logprobs`` per token; ``old_logprobs`` feeds only the metrics.

    Args:
        logprobs: ``[B, T]`` current policy log-probabilities (with gradient).
        old_logprobs: ``[B, T]`` log-probabilities under the policy that sampled.
        advantages: ``[B, T]``.
        mask: ``[B, T]`` 1 on generated tokens.
        **args: :class:`VariantArgs`.

    Returns:
        ``(loss, metrics)``: the 0-d loss and the common metrics (module docstring).

    Raises:
        ValueError: On mismatched shapes or an unknown ``loss_agg_mode``.
    """
    keep, log_ratio, ratio = _inputs(logprobs, old_logprobs, advantages, mask, args)
    per_token = _reinforce(torch.ones_like(ratio), logprobs, advantages, keep)  # [B, T]
    return _finish(per_token, mask, log_ratio, ratio, {}, args)


def ppo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    dual_clip_ratio_c: float | None,
    **args: Unpack[VariantArgs],
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip: :func:`~agentgym.trainers.losses.policy_loss`, which ROLL's ``ppo`` is.

    ROLL's ``pg_clip`` (or ``pg_clip_low``/``pg_clip_high`` with
    ``use_pg_clip_range``) are ``clip_ratio_low``/``clip_ratio_high``; its
    ``dual_clip_loss`` is ``dual_clip_ratio_c = 1 + 2 * pg_clip`` (``policy_loss``'s
    ``dual_clip``; None: off). ``scores`` is unused; the metrics are ``policy_loss``'s.
    """
    return policy_loss(
        logprobs, old_logprobs, advantages, mask, clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high, dual_clip=dual_clip_ratio_c, **_aggregation(args),
    )  # fmt: skip


def tis(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tis_lower_bound: float,
    tis_upper_bound: float,
    **args: Unpack[VariantArgs],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance sampling: ``-sg(clip(r, lower, upper)) * A * logprobs``.

    Every token, whatever the sign of its advantage, is weighted by its ratio
    clipped to ``[tis_lower_bound, tis_upper_bound]`` (ROLL's defaults: 0 and 1);
    the weight carries no gradient, so the gradient is ``-w * A`` per token.
    (Not the trainer/engine correction ``tis_cap``: here ``r`` is the policy's
    ratio to ``old_logprobs``.)

    Args:
        tis_lower_bound: Lower end of the weight (``>= 0``).
        tis_upper_bound: Upper end of the weight (``>= tis_lower_bound``).
        (the others): As :func:`vanilla`.

    Returns:
        ``(loss, metrics)``: the common metrics plus ``tis_lower_clipfrac``
        (``r < lower``), ``tis_upper_clipfrac`` (``r > upper``) and
        ``tis_weight_mean`` (the clipped ratio's mean).

    Raises:
        ValueError: On bounds out of order or negative, mismatched shapes or an
            unknown ``loss_agg_mode``.
    """
    if not 0.0 <= tis_lower_bound <= tis_upper_bound:
        raise ValueError(
            "tis needs 0 <= tis_lower_bound <= tis_upper_bound, got "
            f"{tis_lower_bound} and {tis_upper_bound} (ROLL's defaults: 0.0 and 1.0)"
        )
    keep, log_ratio, ratio = _inputs(logprobs, old_logprobs, advantages, mask, args)
    weight = ratio.clamp(tis_lower_bound, tis_upper_bound)  # [B, T]
    per_token = _reinforce(weight, logprobs, advantages, keep)  # [B, T]
    count = args.get("num_tokens")
    with torch.no_grad():
        metrics = {
            "tis_lower_clipfrac": token_share((ratio < tis_lower_bound).float(), keep, count),
            "tis_upper_clipfrac": token_share((ratio > tis_upper_bound).float(), keep, count),
            "tis_weight_mean": token_share(weight, keep, count),
        }
    return _finish(per_token, mask, log_ratio, ratio, metrics, args)


def topr(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    topr_positive_weight: float,
    topr_negative_weight: float,
    topr_advantage_threshold: float | None,
    **args: Unpack[VariantArgs],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Tapered off-policy REINFORCE (:func:`~agentgym.trainers.loss_terms.topr_loss`).

    A sample whose score is ``> 0`` gets ``-topr_positive_weight * A * logprobs``
    (SFT-like, no ratio); one whose score is ``<= 0`` gets
    ``-topr_negative_weight * sg(clip(r, 0, 1)) * A * logprobs``. ``scores``
    (``[B]``, each sample's episode score) is required: its sign picks the branch.

    With ``topr_advantage_threshold`` set, the branch is picked per token by the
    advantage instead, as Trinity-RFT's ``topr`` (its ``advantage_threshold``):
    positive where ``A > threshold``, tapered where ``A <= threshold``; ``scores``
    is then not read. The two agree when each row's advantage is its score and
    the threshold is 0 (the paper's setting, ``A = R``); with a group baseline
    they differ: a sample that scored above 0 but below its group's mean is
    tapered by Trinity's rule and not by ROLL's.

    Args:
        topr_positive_weight: Weight of positive samples (``>= 0``; ROLL: 1.0).
        topr_negative_weight: Weight of negative samples (``>= 0``; ROLL: 1.0).
        topr_advantage_threshold: None: split by ``scores`` (ROLL); a number: split
            each token by its advantage (Trinity-RFT; its default 0.0).
        (the others): As :func:`vanilla`.

    Returns:
        ``(loss, metrics)``: the common metrics plus ``topr_positive_frac`` (share
        of the tokens in positive samples) and ``topr_negative_clipfrac`` (tokens
        of negative samples whose ratio the taper cut to 1).

    Raises:
        ValueError: Without ``scores``, on a negative weight, mismatched shapes or
            an unknown ``loss_agg_mode``.
    """
    scores = args.get("scores")
    if scores is None and topr_advantage_threshold is None:
        raise ValueError(
            "topr splits samples by their score: pass scores ([B] episode scores), or set "
            "topr_advantage_threshold to split tokens by their advantage"
        )
    _check_weight("topr_positive_weight", topr_positive_weight, "ROLL's default: 1.0")
    _check_weight("topr_negative_weight", topr_negative_weight, "ROLL's default: 1.0")
    keep, log_ratio, ratio = _inputs(logprobs, old_logprobs, advantages, mask, args)
    if topr_advantage_threshold is None:
        assert scores is not None  # checked above
        per_token = topr_loss(
            logprobs, old_logprobs, advantages, scores, mask,
            positive_weight=topr_positive_weight, negative_weight=topr_negative_weight,
        )  # fmt: skip
        positive = (scores > 0)[:, None].expand_as(keep)  # [B, T]
    else:
        positive = advantages > topr_advantage_threshold  # [B, T]
        taper = torch.exp(log_ratio.clamp(max=0.0))  # [B, T], clip(r, 0, 1) without overflow
        weight = torch.where(positive, topr_positive_weight, topr_negative_weight * taper)
        per_token = _reinforce(weight, logprobs, advantages, keep)  # [B, T]
    tapered = ~positive & (ratio > 1)  # [B, T]
    count = args.get("num_tokens")
    with torch.no_grad():
        metrics = {
            "topr_positive_frac": token_share(positive.float(), keep, count),
            "topr_negative_clipfrac": token_share(tapered.float(), keep, count),
        }
    return _finish(per_token, mask, log_ratio, ratio, metrics, args)


def cispo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    cispo_epsilon_low: float,
    cispo_epsilon_high: float,
    cispo_use_unified_mask: bool,
    **args: Unpack[VariantArgs],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped IS-weight policy optimization (MiniMax-M1): ``-sg(clip(r)) * A * logprobs``.

    Unlike PPO, no token loses its gradient: the ratio, clipped to ``[1 -
    cispo_epsilon_low, 1 + cispo_epsilon_high]``, only weighs it. With
    ``cispo_use_unified_mask``, tokens with ``A > 0`` and ``r > 1 + high`` or
    ``A < 0`` and ``r < 1 - low`` (those PPO's clip would stop) give 0.

    Args:
        cispo_epsilon_low: ``>= 0`` (ROLL: 0.1).
        cispo_epsilon_high: ``>= 0`` (ROLL: 0.1).
        cispo_use_unified_mask: The paper's eq. 7 mask (ROLL: false).
        (the others): As :func:`vanilla`.

    Returns:
        ``(loss, metrics)``: the common metrics plus ``cispo_lower_clipfrac``,
        ``cispo_upper_clipfrac``, ``cispo_weight_mean`` and, with the unified
        mask, ``cispo_masked_frac``.

    Raises:
        ValueError: On a negative epsilon, mismatched shapes or an unknown
            ``loss_agg_mode``.
    """
    if not (cispo_epsilon_low >= 0 and cispo_epsilon_high >= 0):
        raise ValueError(
            "cispo_epsilon_low and cispo_epsilon_high must be >= 0, got "
            f"{cispo_epsilon_low} and {cispo_epsilon_high}"
        )
    keep, log_ratio, ratio = _inputs(logprobs, old_logprobs, advantages, mask, args)
    low, high = 1.0 - cispo_epsilon_low, 1.0 + cispo_epsilon_high
    weight = ratio.clamp(low, high)  # [B, T]
    count = args.get("num_tokens")
    metrics: dict[str, Tensor] = {}
    if cispo_use_unified_mask:
        stopped = ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))  # [B, T]
        weight = torch.where(stopped, torch.zeros_like(weight), weight)
        metrics["cispo_masked_frac"] = token_share(stopped.float(), keep, count)
    per_token = _reinforce(weight, logprobs, advantages, keep)  # [B, T]
    with torch.no_grad():
        metrics.update(
            cispo_lower_clipfrac=token_share((ratio < low).float(), keep, count),
            cispo_upper_clipfrac=token_share((ratio > high).float(), keep, count),
            cispo_weight_mean=token_share(weight, keep, count),
        )
    return _finish(per_token, mask, log_ratio, ratio, metrics, args)


def kimi15(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    kimi15_tau: float,
    **args: Unpack[VariantArgs],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Kimi k1.5's policy mirror descent: ``-A * logprobs + tau / 2 * (logprobs - old) ** 2``.

    The squared log-ratio keeps the policy near the sampler's; its gradient is
    ``tau * (logprobs - old)``, 0 on the first pass over fresh samples.

    Args:
        kimi15_tau: The regularizer's weight (``>= 0``; ROLL: 0.1).
        (the others): As :func:`vanilla`.

    Returns:
        ``(loss, metrics)``: the common metrics plus ``kimi15_reg`` (the token
        share of ``tau / 2 * (logprobs - old) ** 2``).

    Raises:
        ValueError: On a negative ``kimi15_tau``, mismatched shapes or an unknown
            ``loss_agg_mode``.
    """
    _check_weight("kimi15_tau", kimi15_tau, "ROLL's default: 0.1")
    keep, log_ratio, ratio = _inputs(logprobs, old_logprobs, advantages, mask, args)
    regularizer = 0.5 * kimi15_tau * log_ratio.square()  # [B, T], 0 off the mask
    per_token = _reinforce(torch.ones_like(ratio), logprobs, advantages, keep) + regularizer
    metrics = {"kimi15_reg": token_share(regularizer.detach(), keep, args.get("num_tokens"))}
    return _finish(per_token, mask, log_ratio, ratio, metrics, args)


def opmd(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    opmd_tau: float,
    **args: Unpack[VariantArgs],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Online policy mirror descent (Trinity-RFT's ``opmd`` policy_loss_fn):
    ``-A * logprobs / (1 + opmd_tau)``.

    No ratio and no clip: the ``1 / (1 + tau)`` scale is the mirror-descent step's
    regularization toward the current policy (Trinity's ``tau``), and the group
    baseline of the advantage (``adv_estimator: opmd``) does the rest.
    ``old_logprobs`` feeds only the metrics.

    Args:
        opmd_tau: The regularization's weight (``>= 0``; Trinity: 1.0).
        (the others): As :func:`vanilla`.

    Returns:
        ``(loss, metrics)``: the common metrics.

    Raises:
        ValueError: On a negative ``opmd_tau``, mismatched shapes or an unknown
            ``loss_agg_mode``.
    """
    _check_weight("opmd_tau", opmd_tau, "Trinity's default: 1.0")
    keep, log_ratio, ratio = _inputs(logprobs, old_logprobs, advantages, mask, args)
    scale = torch.full_like(ratio, 1.0 / (1.0 + opmd_tau))  # [B, T]
    per_token = _reinforce(scale, logprobs, advantages, keep)  # [B, T]
    return _finish(per_token, mask, log_ratio, ratio, {}, args)


PG_VARIANTS: dict[str, PgVariant] = {
    "vanilla": vanilla,
    "ppo": ppo,
    "tis": tis,
    "topr": topr,
    "cispo": cispo,
    "kimi15": kimi15,
    "opmd": opmd,
}
"""``pg_variant`` → its loss (keys: :data:`agentgym.choices.PG_VARIANTS`)."""
