"""Advantage estimators: per-token advantages from normalized scores, pure tensor functions.

The trainer turns a rollout batch into per-token advantages in two steps:

1. :func:`~agentgym.trainers.normalization.normalize_rewards` normalizes each
   sample's score within its group (:mod:`~agentgym.trainers.normalization`);
2. :func:`compute_advantages` spreads the result over the generated tokens with
   a registered estimator (``grpo``, ``reinforce``, ``opmd``, ``step_reinforce``, or
   one added with :func:`register_estimator`), then whitens and clips. ``opmd`` (Trinity-RFT's
   OPMD) first subtracts each group's baseline
   (:func:`~agentgym.trainers.normalization.opmd_advantages`, which the trainer
   applies to the normalized scores).

Shapes: ``B`` samples, ``T`` token positions; ``[B, T]`` tensors are aligned
with ``RolloutBatch.input_ids`` and ``loss_mask`` is 1 exactly on generated tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Unpack

import torch
from torch import Tensor

from agentgym.errors import check_choice

WHITEN_EPSILON = 1e-8


class EstimatorOptions(TypedDict, total=False):
    """The options an estimator may read (:func:`compute_advantages` passes both)."""

    gamma: float
    """The discount per generated token (REINFORCE, GAE)."""
    baseline: bool
    """Subtract a baseline (REINFORCE)."""


class AdvantageEstimator(Protocol):
    """Per-token advantages from normalized scores and token rewards."""

    def __call__(
        self,
        normalized_scores: Tensor,
        token_rewards: Tensor,
        loss_mask: Tensor,
        /,
        **options: Unpack[EstimatorOptions],
    ) -> Tensor:
        """Return ``[B, T]`` advantages (0 off ``loss_mask``); the three tensors come
        by position, whatever an estimator names them."""
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
    normalized_scores: Tensor, token_rewards: Tensor, loss_mask: Tensor, **unused: Any
) -> Tensor:
    """GRPO: the sample's normalized score on each of its generated tokens. OPMD's
    estimator too: there the scores are already its advantages
    (:func:`~agentgym.trainers.normalization.opmd_advantages`, which the trainer
    applies to ``normalized_scores``).

    Args:
        normalized_scores: ``[B]`` from
            :func:`~agentgym.trainers.normalization.normalize_rewards`.
        token_rewards: ``[B, T]`` unused (outcome reward only).
        loss_mask: ``[B, T]`` 1 on generated tokens.
        **unused: ``gamma`` and ``baseline``, which GRPO does not read (the group
            normalization is its baseline).

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


@register_estimator("step_reinforce")
def step_reinforce_advantages(
    normalized_scores: Tensor,
    token_rewards: Tensor,
    loss_mask: Tensor,
    *,
    gamma: float = 1.0,
    **unused: Any,
) -> Tensor:
    """ROLL's ``step_reinforce``: REINFORCE on each step's normalized return.

    Each sample is one step of an episode (``rollout_mode: step``) judged by its
    discounted return from that step to the episode's end (``step_score: return``,
    discounted per step by ``step_gamma``, ROLL's ``step_reward_gamma``), normalized by
    ``reward_normalization`` into ``normalized_scores``. As in ROLL, that value sits on
    the step's last generated token and each generated token gets the return-to-go of
    the token rewards, discounted per token by ``gamma``: with ``gamma`` 1 (ROLL's
    default) every generated token of the step gets the normalized return.

    Args:
        normalized_scores: ``[B]`` the normalized step returns.
        token_rewards: ``[B, T]`` unused (the step's reward is in its return).
        loss_mask: ``[B, T]`` 1 on generated tokens.
        gamma: Discount per generated token, in ``[0, 1]``.
        **unused: ``baseline``, which the normalization replaces.

    Returns:
        ``[B, T]`` advantages, 0 off the mask.
    """
    rewards = last_token_rewards(normalized_scores.to(token_rewards.dtype), loss_mask)  # [B, T]
    return reinforce_advantages(normalized_scores, rewards, loss_mask, gamma=gamma)


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
        normalized_scores: ``[B]`` from
            :func:`~agentgym.trainers.normalization.normalize_rewards`.
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
