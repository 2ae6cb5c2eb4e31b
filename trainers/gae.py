"""GAE over generated tokens and the clipped value loss: pure tensor functions.

``adv_estimator: gae`` with ``gamma`` and ``lambd`` (ROLL's and verl's keys).
All ``[B, T]`` tensors are aligned with ``RolloutBatch.input_ids``: ``values[b, t]``
is the critic's value of the prefix before ``input_ids[b, t]`` (as ``logprobs``),
and ``loss_mask`` is 1 exactly on generated tokens.

These would sit beside the other estimators in ``trainers/advantages.py``; GAE
needs values and ``lambd``, which :class:`~agentgym.trainers.advantages.AdvantageEstimator`
does not carry, so it stays a separate function that the recipe calls when
``adv_estimator == "gae"``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from agentgym.trainers.losses import Aggregation


class GAEOutput(NamedTuple):
    """Advantages and value targets, each ``[B, T]`` and exactly 0 off the mask."""

    advantages: Tensor
    returns: Tensor


def _check_shapes(**tensors: Tensor) -> None:
    shapes = {key: tuple(tensor.shape) for key, tensor in tensors.items()}
    if len(set(shapes.values())) != 1 or any(len(shape) != 2 for shape in shapes.values()):
        raise ValueError(f"expected one [B, T] shape for all of them, got {shapes}")


def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    *,
    gamma: float,
    lambd: float,
) -> GAEOutput:
    """Generalized Advantage Estimation over the generated tokens only.

    Only generated tokens are time steps. For a sample whose generated
    positions are ``t_1 < t_2 < ... < t_n`` (prompt and observation tokens in
    between are skipped, so the step after a turn's last token is the next
    turn's first generated token)::

        delta_k = r(t_k) + gamma * V(t_{k+1}) - V(t_k)        (V(t_{n+1}) = 0)
        A_k     = delta_k + gamma * lambd * A_{k+1}           (A_{n+1} = 0)
        R_k     = A_k + V(t_k)

    This is verl's ``compute_gae_advantage_return`` (which skips observation
    tokens the same way) before its whitening, and on a contiguous mask also
    ROLL's ``compute_gae_advantage_return`` on masked rewards and values.
    ROLL's has no gap handling: across an observation it would take each
    observation token as a step with value 0 and reward 0.
    verl whitens the advantages inside the estimator; ROLL leaves that to
    ``whiten_advantages``, and so do we (``compute_advantages``' ``whiten``).
    Rewards, values and NaNs off the mask never reach the result.

    Args:
        token_rewards: ``[B, T]`` rewards on generated tokens (each turn's
            reward on its last generated token, minus any token-level KL).
        values: ``[B, T]`` the critic's values, aligned with the tokens.
        loss_mask: ``[B, T]`` 1 on generated tokens.
        gamma: Discount per generated token, in ``[0, 1]``.
        lambd: GAE's lambda, in ``[0, 1]``.

    Returns:
        :class:`GAEOutput`: ``advantages`` and ``returns`` (the critic's
        targets, ``advantages + values``), both exactly 0 off the mask.

    Raises:
        ValueError: On mismatched shapes or ``gamma``/``lambd`` outside ``[0, 1]``.
    """
    _check_shapes(token_rewards=token_rewards, values=values, loss_mask=loss_mask)
    for key, value in (("gamma", gamma), ("lambd", lambd)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{key} must be in [0, 1], got {value}")
    keep = loss_mask.bool()
    zeros = torch.zeros_like(values)
    rewards = torch.where(keep, token_rewards.to(values.dtype), zeros)  # [B, T]
    values = torch.where(keep, values, zeros)  # [B, T]
    advantages = torch.zeros_like(values)  # [B, T]
    next_value = values.new_zeros(values.shape[0])  # [B]: V of the next generated token
    running = values.new_zeros(values.shape[0])  # [B]: A of the next generated token
    # A recurrence over positions, vectorized over the batch, as verl's and ROLL's:
    # closed forms with (gamma * lambd)**t factors underflow on long sequences.
    for t in range(values.shape[1] - 1, -1, -1):
        on = keep[:, t]  # [B]
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        running = torch.where(on, delta + gamma * lambd * running, running)
        next_value = torch.where(on, values[:, t], next_value)
        advantages[:, t] = running
    advantages = torch.where(keep, advantages, zeros)
    return GAEOutput(advantages, torch.where(keep, advantages + values, zeros))


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    value_clip: float | None = None,
    loss_agg_mode: str = "seq-mean-token-mean",
    norm_length: int | None = None,
    num_tokens: Tensor | float | None = None,
    num_seqs: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The critic's (clipped) squared-error loss, as ROLL's and verl's critics compute it.

    Per token, with ``V`` the new values, ``V_old`` those the returns were
    computed with, and ``R`` the returns::

        loss = (V - R)**2                                           # value_clip None
        loss = max((V - R)**2, (clamp(V, V_old - c, V_old + c) - R)**2)  # value_clip c

    then ``0.5 *`` :func:`~agentgym.trainers.losses.aggregate_loss`. ROLL's
    critic always aggregates with ``seq-mean-token-mean`` (the default here);
    verl passes its critic's ``loss_agg_mode``. ROLL reports the unclipped
    loss's mean as ``clipfrac`` when ``value_clip`` is None; we report no
    ``vf_clipfrac`` then.

    Args:
        values: ``[B, T]`` the critic's current values (with gradient).
        old_values: ``[B, T]`` the values the returns were computed with.
        returns: ``[B, T]`` value targets (:func:`gae_advantages`).
        mask: ``[B, T]`` 1 on generated tokens.
        value_clip: ``c`` above, or None for the plain squared error.
        loss_agg_mode: One of ``LOSS_AGG_MODES``.
        norm_length: See :func:`~agentgym.trainers.losses.aggregate_loss`.
        num_tokens: See :func:`~agentgym.trainers.losses.aggregate_loss`; also
            the denominator of the token-mean metrics, so micro-batch shares add up.
        num_seqs: See :func:`~agentgym.trainers.losses.aggregate_loss`.

    Returns:
        ``(loss, metrics)``: the 0-d loss and detached token-mean metrics
        ``vf_loss``, ``vpred_mean``, ``vf_error`` (mean of ``(V - R)**2``)
        and, with ``value_clip``, ``vf_clipfrac`` (tokens where the clipped
        term won).

    Raises:
        ValueError: On mismatched shapes, ``value_clip <= 0`` or an unknown mode.
    """
    _check_shapes(values=values, old_values=old_values, returns=returns, mask=mask)
    if value_clip is not None and value_clip <= 0:
        raise ValueError(f"value_clip must be positive (or None for no clip), got {value_clip}")
    keep = mask.bool()
    aggregation = Aggregation(loss_agg_mode, norm_length, num_tokens, num_seqs)
    unclipped = (values - returns).square()  # [B, T]
    per_token = unclipped
    metrics: dict[str, Tensor] = {}
    if value_clip is not None:
        clipped_values = torch.clamp(values, old_values - value_clip, old_values + value_clip)
        clipped = (clipped_values - returns).square()  # [B, T]
        per_token = torch.maximum(unclipped, clipped)
        metrics["vf_clipfrac"] = aggregation.share((clipped > unclipped).float(), keep)
    loss = 0.5 * aggregation(per_token, mask)
    metrics.update(
        vf_loss=loss.detach(),
        vpred_mean=aggregation.share(values.detach(), keep),
        vf_error=aggregation.share(unclipped.detach(), keep),
    )
    return loss, metrics
