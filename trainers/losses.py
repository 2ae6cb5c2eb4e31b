"""Policy losses, KL penalties and importance-sampling weights: pure tensor functions.

All ``[B, T]`` tensors are aligned with ``RolloutBatch.input_ids``:
``logprobs[b, t]`` is the log-probability of ``input_ids[b, t]`` given the
tokens before it, and ``mask`` (the loss mask) is 1 exactly on generated
tokens. Values off the mask never reach a loss, a metric or a gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from agentgym.choices import KL_PENALTIES, LOSS_AGG_MODES
from agentgym.errors import check_choice
from agentgym.trainers.advantages import masked_mean
from agentgym.trainers.loss_terms import check_like_logprobs, weight_rows

KL_ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
"""Schulman's estimator names, accepted as verl accepts them."""

LOG_RATIO_LIMIT = 20.0
"""|log ratio| is clamped to this before ``exp`` (as verl), so no ratio overflows."""
LOW_VAR_KL_LIMIT = 10.0


@dataclass(frozen=True)
class Aggregation:
    """How a per-token loss becomes a scalar: :func:`aggregate_loss`'s mode and
    denominators, passed on as one value (calling it aggregates).

    Attributes:
        mode: One of :data:`LOSS_AGG_MODES`.
        norm_length: The constant of ``seq-mean-token-sum-norm``.
        num_tokens: The token count ``token-mean`` divides by (None: the mask's).
        num_seqs: The sequence count of the ``seq-mean-*`` modes (None: the mask's).
    """

    mode: str = "token-mean"
    norm_length: int | None = None
    num_tokens: Tensor | float | None = None
    num_seqs: Tensor | float | None = None

    def __call__(self, loss: Tensor, mask: Tensor) -> Tensor:
        """:func:`aggregate_loss` of ``loss`` (``[B, T]``) over ``mask`` (``[B, T]``)."""
        check_choice("loss_agg_mode", self.mode, LOSS_AGG_MODES)
        if loss.shape != mask.shape or loss.dim() != 2:
            raise ValueError(
                f"loss and mask must both be [B, T], got {tuple(loss.shape)} and "
                f"{tuple(mask.shape)}"
            )
        norm_length = self.norm_length
        if self.mode == "seq-mean-token-sum-norm" and (norm_length is None or norm_length <= 0):
            raise ValueError(
                "seq-mean-token-sum-norm needs a positive constant norm_length, got "
                f"{norm_length}: pass the config's (e.g. the sequence length), never a "
                "tensor's width"
            )
        keep = mask.bool()
        masked = torch.where(keep, loss, torch.zeros_like(loss))  # [B, T]
        return _AGGREGATORS[self.mode](masked, keep, self)

    def share(self, values: Tensor, keep: Tensor) -> Tensor:
        """:func:`token_share` of ``values`` over ``keep`` with :attr:`num_tokens`."""
        return token_share(values, keep, self.num_tokens)


def _seq_count(keep: Tensor, aggregation: Aggregation) -> Tensor:
    # Rows without a generated token are left out of the count (as verl does).
    count = aggregation.num_seqs
    return torch.as_tensor((keep.sum(-1) > 0).sum() if count is None else count).clamp(min=1)


def _token_mean(masked: Tensor, keep: Tensor, aggregation: Aggregation) -> Tensor:
    count = keep.sum() if aggregation.num_tokens is None else aggregation.num_tokens
    return masked.sum() / torch.as_tensor(count).clamp(min=1)


def _seq_mean_token_sum(masked: Tensor, keep: Tensor, aggregation: Aggregation) -> Tensor:
    return masked.sum() / _seq_count(keep, aggregation)


def _seq_mean_token_mean(masked: Tensor, keep: Tensor, aggregation: Aggregation) -> Tensor:
    # Each row of per_token sums to that row's token mean.
    per_token = masked / keep.sum(-1, keepdim=True).clamp(min=1)  # [B, T]
    return per_token.sum() / _seq_count(keep, aggregation)


def _seq_mean_token_sum_norm(masked: Tensor, keep: Tensor, aggregation: Aggregation) -> Tensor:
    return masked.sum() / float(aggregation.norm_length or 1)


_AGGREGATORS: dict[str, Callable[[Tensor, Tensor, Aggregation], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def aggregate_loss(
    loss: Tensor,
    mask: Tensor,
    mode: str,
    *,
    norm_length: int | None = None,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar over the masked tokens (ROLL's and verl's ``agg_loss``).

    Modes (``S`` = the rows with at least one masked token):

    - ``token-mean``: ``sum(loss * mask) / sum(mask)``.
    - ``seq-mean-token-sum``: mean over ``S`` of each row's token sum.
    - ``seq-mean-token-mean``: mean over ``S`` of each row's token mean.
    - ``seq-mean-token-sum-norm``: ``sum(loss * mask) / norm_length``: the token
      sum over all sequences divided by one constant, with no division by the
      number of sequences, as ROLL and verl define it. ``norm_length`` must come
      from the config (e.g. the sequence budget), never from a tensor's width, so
      that the constant is the same for every micro-batch and step. Dr. GRPO's
      paper writes a further ``1/G`` (the group size); ROLL and verl leave it out,
      and so do we: it would only rescale the learning rate.

    Rows without masked tokens are left out of the sequence count, as in
    current verl; an empty mask gives 0 (never NaN). Entries off the mask may
    hold anything, NaN and inf included.

    Args:
        loss: ``[B, T]`` per-token loss.
        mask: ``[B, T]`` 1 where the loss counts.
        mode: One of :data:`LOSS_AGG_MODES`.
        norm_length: The constant of ``seq-mean-token-sum-norm`` (required there).
        num_tokens: Denominator of ``token-mean`` instead of ``sum(mask)``, e.g.
            the token count of the whole mini-batch, so that the losses of its
            gradient-accumulation micro-batches add up to the mini-batch loss.
        num_seqs: Likewise, the sequence count of ``seq-mean-token-sum`` and
            ``seq-mean-token-mean``.

    Returns:
        A 0-d tensor.

    Raises:
        ValueError: On an unknown mode, mismatched shapes, or ``norm_length``
            missing or ``<= 0`` in ``seq-mean-token-sum-norm``.
    """
    return Aggregation(mode, norm_length, num_tokens, num_seqs)(loss, mask)


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    dual_clip: float | None = None,
    loss_agg_mode: str = "token-mean",
    is_weights: Tensor | None = None,
    sample_weights: Tensor | None = None,
    norm_length: int | None = None,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip policy loss with separate low/high clip and optional dual-clip.

    Per token, with ``r = exp(logprobs - old_logprobs)`` (log ratio clamped to
    ``[-20, 20]``) and advantage ``A``::

        loss = max(-A * r, -A * clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high))
        if dual_clip is not None and A < 0:
            loss = min(loss, -A * dual_clip)      # bounded by dual_clip * |A|

    then multiplied by ``is_weights`` and each row by its ``sample_weights`` (both
    detached) and aggregated with :func:`aggregate_loss`.

    Args:
        logprobs: ``[B, T]`` current policy log-probabilities (with gradient).
        old_logprobs: ``[B, T]`` log-probabilities under the policy that sampled.
        advantages: ``[B, T]``.
        mask: ``[B, T]`` 1 on generated tokens.
        clip_ratio_low: ``r`` is clipped below at ``1 - clip_ratio_low``.
        clip_ratio_high: ``r`` is clipped above at ``1 + clip_ratio_high``.
        dual_clip: verl's ``clip_ratio_c`` (> 1), or None for no dual-clip.
        loss_agg_mode: One of :data:`LOSS_AGG_MODES`.
        is_weights: ``[B, T]`` importance-sampling weights (see
            :func:`truncated_is_weights`); no gradient flows through them.
        sample_weights: ``[B]`` per-sample weights (ROLL's ``length_loss_weight``,
            :func:`~agentgym.trainers.loss_terms.sample_weights`); detached.
        norm_length: See :func:`aggregate_loss`.
        num_tokens: See :func:`aggregate_loss`.
        num_seqs: See :func:`aggregate_loss`.

    Returns:
        ``(loss, metrics)``: the 0-d loss and detached 0-d metrics over the
        masked tokens (token means; with ``num_tokens``, each is this
        micro-batch's share of the mini-batch's mean, so shares add up, except
        ``ratio_min``/``ratio_max``; see :data:`POLICY_LOSS_REDUCE`):
        ``pg_loss``, ``clipfrac`` (tokens whose clipped term won),
        ``clipfrac_low`` (``A < 0`` and ``r < 1 - low``), ``clipfrac_high``
        (``A > 0`` and ``r > 1 + high``), ``approx_kl`` (mean of
        ``old_logprobs - logprobs``), ``ratio_mean``, ``ratio_min``,
        ``ratio_max``, and ``dual_clipfrac`` (with dual-clip) and
        ``is_weight_mean`` (with ``is_weights``).

    Raises:
        ValueError: On negative clip ratios, ``dual_clip <= 1``, mismatched
            shapes or an unknown ``loss_agg_mode``.
    """
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(
            f"clip_ratio_low and clip_ratio_high must be >= 0, got {clip_ratio_low} "
            f"and {clip_ratio_high}"
        )
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(
            f"dual_clip (verl's clip_ratio_c) must be greater than 1, got {dual_clip}; "
            "use None to turn dual-clip off"
        )
    check_policy_inputs(logprobs, old_logprobs, advantages, mask, is_weights)
    keep = mask.bool()
    aggregation = Aggregation(loss_agg_mode, norm_length, num_tokens, num_seqs)
    share = aggregation.share
    advantages = torch.where(keep, advantages, torch.zeros_like(advantages))  # [B, T]
    log_ratio, ratio = masked_ratio(logprobs, old_logprobs, keep)  # [B, T], [B, T]
    unclipped = -advantages * ratio  # [B, T]
    clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)  # [B, T]
    per_token = torch.maximum(unclipped, clipped)  # [B, T]
    metrics: dict[str, Tensor] = {}
    if dual_clip is not None:
        bound = -advantages * dual_clip  # [B, T]
        negative = advantages < 0
        metrics["dual_clipfrac"] = share((negative & (per_token > bound)).float(), keep)
        per_token = torch.where(negative, torch.minimum(per_token, bound), per_token)
    with torch.no_grad():
        metrics.update(
            clipfrac=share((clipped > unclipped).float(), keep),
            clipfrac_low=share(((advantages < 0) & (ratio < 1.0 - clip_ratio_low)).float(), keep),
            clipfrac_high=share(((advantages > 0) & (ratio > 1.0 + clip_ratio_high)).float(), keep),
        )
    return finish_policy_loss(
        per_token, mask, log_ratio, ratio, metrics, aggregation, is_weights, sample_weights
    )


def check_policy_inputs(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    is_weights: Tensor | None = None,
) -> None:
    """Raise ``ValueError`` unless every ``[B, T]`` input of a policy loss has logprobs' shape."""
    tensors = {"old_logprobs": old_logprobs, "advantages": advantages, "mask": mask}
    if is_weights is not None:
        tensors["is_weights"] = is_weights
    check_like_logprobs(logprobs, **tensors)


def masked_ratio(logprobs: Tensor, old_logprobs: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """``(log_ratio, ratio)`` of the policy to the sampler, each ``[B, T]``.

    ``log_ratio`` is ``logprobs - old_logprobs`` on ``keep`` and 0 off it (so NaN
    there never reaches a gradient); ``ratio`` is its ``exp`` with the log clamped
    to ``[-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT]`` (as verl), so no ratio overflows.
    """
    log_ratio = torch.where(keep, logprobs - old_logprobs, torch.zeros_like(logprobs))  # [B, T]
    return log_ratio, torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def finish_policy_loss(
    per_token: Tensor,
    mask: Tensor,
    log_ratio: Tensor,
    ratio: Tensor,
    metrics: dict[str, Tensor],
    aggregation: Aggregation,
    is_weights: Tensor | None = None,
    sample_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The common end of a policy loss: the per-token loss times ``is_weights`` and
    each row's ``sample_weights`` (both detached), reduced by ``aggregation``.

    Adds to ``metrics`` (detached): ``pg_loss``, ``approx_kl`` (mean of ``old - new``
    log-probabilities), ``ratio_mean`` (token shares, see :func:`policy_loss`),
    ``ratio_min``/``ratio_max`` over the mask (1 when it is empty), and
    ``is_weight_mean`` with ``is_weights``.

    Returns:
        ``(loss, metrics)``: the 0-d loss and ``metrics``.
    """
    keep = mask.bool()
    if is_weights is not None:
        per_token = per_token * is_weights.detach()
        metrics["is_weight_mean"] = aggregation.share(is_weights.detach(), keep)
    if sample_weights is not None:
        per_token = weight_rows(per_token, sample_weights)
    loss = aggregation(per_token, mask)
    with torch.no_grad():
        big = torch.finfo(ratio.dtype).max
        metrics.update(
            pg_loss=loss.detach(),
            approx_kl=aggregation.share(-log_ratio, keep),
            ratio_mean=aggregation.share(ratio, keep),
            ratio_min=torch.where(keep, ratio, big).amin() if keep.any() else ratio.new_ones(()),
            ratio_max=torch.where(keep, ratio, -big).amax() if keep.any() else ratio.new_ones(()),
        )
    return loss, metrics


def token_share(values: Tensor, keep: Tensor, num_tokens: Tensor | float | None) -> Tensor:
    """Masked token mean, or the share of one over ``num_tokens`` tokens when given."""
    count = keep.sum() if num_tokens is None else num_tokens
    return torch.where(keep, values, torch.zeros_like(values)).sum() / torch.as_tensor(count).clamp(
        min=1
    )


POLICY_LOSS_REDUCE = {"ratio_min": "min", "ratio_max": "max"}
"""How :func:`policy_loss`'s metrics combine over micro-batches; the others are
token-mean shares (see its ``num_tokens``) that add up."""


# KL


def _kl(diff: Tensor, logits: Tensor | None, ref_logits: Tensor | None) -> Tensor:
    return diff


def _abs(diff: Tensor, logits: Tensor | None, ref_logits: Tensor | None) -> Tensor:
    return diff.abs()


def _mse(diff: Tensor, logits: Tensor | None, ref_logits: Tensor | None) -> Tensor:
    return 0.5 * diff.square()


def _low_var_kl(diff: Tensor, logits: Tensor | None, ref_logits: Tensor | None) -> Tensor:
    # Schulman's k3 on log(ref / pi) = -diff: unbiased for KL(pi || ref), never negative.
    log_ref_ratio = (-diff).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    k3 = torch.exp(log_ref_ratio) - log_ref_ratio - 1
    return k3.clamp(-LOW_VAR_KL_LIMIT, LOW_VAR_KL_LIMIT)


def _full(diff: Tensor, logits: Tensor | None, ref_logits: Tensor | None) -> Tensor:
    if logits is None or ref_logits is None:
        raise ValueError(
            "kl_penalty 'full' needs logits and ref_logits ([B, T, V]); pass them, or pick one "
            f"of {[k for k in KL_PENALTIES if k != 'full']}, which need only log-probabilities"
        )
    if logits.shape != ref_logits.shape or logits.shape[:-1] != diff.shape:
        raise ValueError(
            f"logits and ref_logits must both be [B, T, V] with [B, T] = {tuple(diff.shape)}, "
            f"got {tuple(logits.shape)} and {tuple(ref_logits.shape)}"
        )
    log_p = torch.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    log_q = torch.log_softmax(ref_logits.float(), dim=-1)  # [B, T, V]
    return (log_p.exp() * (log_p - log_q)).sum(-1).to(diff.dtype)  # [B, T]


_KL_FUNCTIONS: dict[str, Callable[[Tensor, Tensor | None, Tensor | None], Tensor]] = {
    "kl": _kl,
    "abs": _abs,
    "mse": _mse,
    "low_var_kl": _low_var_kl,
    "full": _full,
}


def kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    kind: str,
    *,
    logits: Tensor | None = None,
    ref_logits: Tensor | None = None,
) -> Tensor:
    """Per-token KL estimate between the policy and a frozen reference (verl's ``kl_penalty``).

    With ``d = logprobs - ref_logprobs``: ``kl`` (k1) is ``d``; ``abs`` is
    ``|d|``; ``mse`` (k2) is ``d**2 / 2``; ``low_var_kl`` (k3) is
    ``exp(-d) + d - 1`` clamped to ``[-10, 10]``; ``full`` is the exact
    ``KL(p || q) = sum_v p_v (log p_v - log q_v)`` over the vocabulary from
    ``logits`` (p) and ``ref_logits`` (q). Mask the result yourself.

    Args:
        logprobs: ``[B, T]`` policy log-probabilities of the sampled tokens.
        ref_logprobs: ``[B, T]`` reference log-probabilities of the same tokens.
        kind: One of :data:`KL_PENALTIES` (or ``k1``, ``k2``, ``k3``).
        logits: ``[B, T, V]`` policy logits (``full`` only).
        ref_logits: ``[B, T, V]`` reference logits (``full`` only).

    Returns:
        ``[B, T]`` per-token penalty.

    Raises:
        ValueError: On an unknown kind, mismatched shapes, or ``full`` without logits.
    """
    name = KL_ALIASES.get(kind, kind)
    check_choice("kl_penalty", name, KL_PENALTIES)
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs and ref_logprobs must have one shape, got {tuple(logprobs.shape)} "
            f"and {tuple(ref_logprobs.shape)}"
        )
    return _KL_FUNCTIONS[name](logprobs - ref_logprobs, logits, ref_logits)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution at each position.

    Args:
        logits: ``[B, T, V]``.

    Returns:
        ``[B, T]``: ``logsumexp(logits) - sum(softmax(logits) * logits)``.
    """
    probs = torch.softmax(logits, dim=-1)  # [B, T, V]
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def truncated_is_weights(
    trainer_old_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor, cap: float
) -> Tensor:
    """Truncated importance-sampling weights for the trainer/engine mismatch (TIS).

    The engine (vLLM) samples with slightly different numerics than the
    trainer computes; weighting each token by ``pi_trainer / pi_engine``,
    capped, corrects the policy gradient ("Your efficient RL framework
    secretly brings you off-policy RL training"; verl's ``tis_imp_ratio_cap``).

    Args:
        trainer_old_logprobs: ``[B, T]`` the trainer's log-probabilities before the update.
        engine_logprobs: ``[B, T]`` the generation engine's log-probabilities.
        mask: ``[B, T]`` 1 on generated tokens.
        cap: Upper bound of the weights (> 0).

    Returns:
        ``[B, T]`` detached ``min(exp(trainer_old - engine), cap)`` on the mask, 1 elsewhere.

    Raises:
        ValueError: If ``cap <= 0`` or the shapes differ.
    """
    if cap <= 0:
        raise ValueError(f"the importance-sampling cap must be positive, got {cap}")
    if not trainer_old_logprobs.shape == engine_logprobs.shape == mask.shape:
        raise ValueError(
            "trainer_old_logprobs, engine_logprobs and mask must have one shape, got "
            f"{tuple(trainer_old_logprobs.shape)}, {tuple(engine_logprobs.shape)}, "
            f"{tuple(mask.shape)}"
        )
    with torch.no_grad():
        log_weights = (trainer_old_logprobs - engine_logprobs).clamp(max=math.log(cap))
        weights = torch.exp(log_weights).clamp(max=cap)  # exactly `cap` where truncated
        return torch.where(mask.bool(), weights, torch.ones_like(weights))


def logprob_gap_metrics(
    trainer_old_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor
) -> dict[str, Tensor]:
    """How far the engine's log-probabilities are from the trainer's, over generated tokens.

    Args:
        trainer_old_logprobs: ``[B, T]``.
        engine_logprobs: ``[B, T]``.
        mask: ``[B, T]`` 1 on generated tokens.

    Returns:
        Detached 0-d tensors: ``logprob_abs_diff_mean``, ``logprob_abs_diff_max``
        and ``logprob_diff_mean`` (trainer minus engine); 0 for an empty mask.
    """
    with torch.no_grad():
        keep = mask.bool()
        diff = torch.where(
            keep, trainer_old_logprobs - engine_logprobs, torch.zeros_like(engine_logprobs)
        )
        return {
            "logprob_abs_diff_mean": masked_mean(diff.abs(), keep),
            "logprob_abs_diff_max": diff.abs().amax() if diff.numel() else diff.new_zeros(()),
            "logprob_diff_mean": masked_mean(diff, keep),
        }
