"""ROLL's extra loss terms: the SFT term on positive samples, TOPR, and per-sample weights.

Each per-token term is a ``[B, T]`` tensor, exactly 0 off the mask, that the
caller reduces with :func:`~agentgym.trainers.losses.aggregate_loss` (with the
mini-batch's ``num_tokens``/``num_seqs``, so gradient accumulation stays exact
for every ``loss_agg_mode``). All ``[B, T]`` tensors are aligned with
``RolloutBatch.input_ids``; ``scores`` is each sample's raw score
(``RolloutBatch.scores``), which splits the batch as ROLL does: a sample is
*positive* when its score is ``> 0`` and *negative* otherwise.

ROLL's keys and where their semantics come from:

- ``sft_loss_coef`` / ``rl_loss_coef`` / ``use_topr_loss``: ROLL's RLVR actor
  (``roll/pipeline/rlvr/actor_worker.py``). Its first version weighted each
  positive sample's summed log-likelihood by its score and by its *sequence*
  probability under the old policy (``exp(sum old_logprobs)``, which vanishes
  on long responses); later versions (``postive_loss_coef``,
  ``use_topr_neg_loss_coef``, and now ``pg_variant: topr`` in
  ``actor_pg_worker.py``) use ``-A * logprob`` per token, which we follow.
- TOPR: Le Roux et al. 2025 (arXiv:2503.14286), eq. 8, as ROLL's
  ``_compute_topr_loss``: positive samples get the plain REINFORCE/SFT
  gradient, negative ones a truncated importance weight ``clip(r, 0, 1)`` with
  no gradient through it. ROLL (and we) use the per-token ratio; the paper
  writes the sequence ratio ``pi(y)/mu(y)``.
- ``difficulty_loss_weight`` / ``length_loss_weight``: ROLL's
  ``ActorWorker.compute_sample_weights``. ROLL's RLVR data carries each
  prompt's ``difficulty`` in ``[0, 1]`` (harder is larger); an agentic run has
  no such field, so here the group (one env seed, ``group_size`` episodes)
  measures it: :func:`group_difficulty`, the share of the group's samples that
  failed (score ``<= 0``, ROLL's negative samples).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SAMPLE_WEIGHT_EPSILON = 1e-8
"""ROLL's epsilon in the length range and in the weights' normalization."""


def check_like_logprobs(logprobs: Tensor, **tensors: Tensor) -> None:
    """Raise ``ValueError`` naming the first of ``tensors`` whose shape is not ``logprobs``'."""
    for key, tensor in tensors.items():
        if tensor.shape != logprobs.shape:
            raise ValueError(
                f"{key} must have the shape of logprobs {tuple(logprobs.shape)}, "
                f"got {tuple(tensor.shape)}"
            )


def _check(logprobs: Tensor, scores: Tensor, **tensors: Tensor) -> None:
    check_like_logprobs(logprobs, **tensors)
    if logprobs.dim() != 2 or scores.shape != logprobs.shape[:1]:
        raise ValueError(
            f"logprobs must be [B, T] and scores [B], got {tuple(logprobs.shape)} "
            f"and {tuple(scores.shape)}"
        )


def topr_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    scores: Tensor,
    mask: Tensor,
    *,
    positive_weight: float = 1.0,
    negative_weight: float = 1.0,
) -> Tensor:
    """Per-token TOPR loss (tapered off-policy REINFORCE), as ROLL's ``pg_variant: topr``.

    With ``r = exp(logprobs - old_logprobs)`` and advantage ``A``::

        positive sample (score > 0):   -positive_weight * A * logprobs
        negative sample (score <= 0):  -negative_weight * sg(clip(r, 0, 1)) * A * logprobs

    ``sg`` stops the gradient: the taper only scales the REINFORCE gradient of
    a negative sample whose probability has risen above the sampler's.

    Args:
        logprobs: ``[B, T]`` current policy log-probabilities (with gradient).
        old_logprobs: ``[B, T]`` log-probabilities under the policy that sampled.
        advantages: ``[B, T]``.
        scores: ``[B]`` each sample's score (its sign picks the branch).
        mask: ``[B, T]`` 1 on generated tokens.
        positive_weight: ROLL's ``topr_positive_weight``.
        negative_weight: ROLL's ``topr_negative_weight``.

    Returns:
        ``[B, T]`` per-token loss, exactly 0 off the mask (no NaN or inf there
        reaches it or its gradient).

    Raises:
        ValueError: On mismatched shapes.
    """
    _check(logprobs, scores, old_logprobs=old_logprobs, advantages=advantages, mask=mask)
    keep = mask.bool()
    zeros = torch.zeros_like(logprobs)
    logprobs = torch.where(keep, logprobs, zeros)  # [B, T]
    advantages = torch.where(keep, advantages, zeros)  # [B, T]
    log_ratio = torch.where(keep, logprobs.detach() - old_logprobs, zeros)  # [B, T]
    taper = torch.exp(log_ratio.clamp(max=0.0))  # [B, T], clip(r, 0, 1) without overflow
    positive = (scores > 0)[:, None]  # [B, 1]
    weight = torch.where(positive, positive_weight, negative_weight * taper)  # [B, T]
    return -weight * advantages * logprobs


def sft_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    scores: Tensor,
    mask: Tensor,
    *,
    use_topr_loss: bool = False,
) -> Tensor:
    """The term ``sft_loss_coef`` weighs: ``-A * logprobs`` on positive samples' tokens.

    With ``use_topr_loss``, negative samples add TOPR's tapered term, so the
    whole term is :func:`topr_loss` (with ``rl_loss_coef: 0`` the run is pure
    TOPR, as ROLL's TOPR recipe sets it); without, negative samples give 0.
    ROLL's first version computed this term with separate denominators for the
    positive and the negative samples; we reduce it like the policy loss (one
    :func:`~agentgym.trainers.losses.aggregate_loss` over all generated
    tokens, as ROLL's current ``pg_variant: topr``), which is the paper's
    expectation over all samples.

    Args:
        logprobs: ``[B, T]`` current policy log-probabilities (with gradient).
        old_logprobs: ``[B, T]`` (used by the TOPR term only).
        advantages: ``[B, T]``.
        scores: ``[B]`` each sample's score.
        mask: ``[B, T]`` 1 on generated tokens.
        use_topr_loss: Add TOPR's term on negative samples.

    Returns:
        ``[B, T]`` per-token loss, exactly 0 off the mask.
    """
    return topr_loss(
        logprobs,
        old_logprobs,
        advantages,
        scores,
        mask,
        positive_weight=1.0,
        negative_weight=1.0 if use_topr_loss else 0.0,
    )


def mix_losses(
    rl_loss: Tensor,
    sft: Tensor | None = None,
    *,
    rl_loss_coef: float = 1.0,
    sft_loss_coef: float = 0.0,
) -> Tensor:
    """``rl_loss_coef * rl_loss + sft_loss_coef * sft``, as ROLL's actor adds them.

    In ROLL, ``rl_loss`` is the (sample-weighted) policy loss plus
    ``kl_loss_coef`` times the KL loss; the entropy bonus is subtracted after
    the multiplication by ``rl_loss_coef`` and the SFT term is added last, so::

        total = rl_loss_coef * (pg + kl_loss_coef * kl) - entropy_loss_coef * entropy
                + sft_loss_coef * sft

    Args:
        rl_loss: 0-d policy loss (plus its KL term).
        sft: 0-d aggregated :func:`sft_loss`, or None when ``sft_loss_coef`` is 0.
        rl_loss_coef: ROLL's ``rl_loss_coef`` (``>= 0``).
        sft_loss_coef: ROLL's ``sft_loss_coef`` (``>= 0``).

    Returns:
        The 0-d mixed loss.

    Raises:
        ValueError: On a negative or non-finite coefficient, or ``sft_loss_coef > 0``
            without ``sft``.
    """
    for key, value in (("rl_loss_coef", rl_loss_coef), ("sft_loss_coef", sft_loss_coef)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{key} must be a finite number >= 0, got {value}")
    if sft_loss_coef > 0 and sft is None:
        raise ValueError(f"sft_loss_coef={sft_loss_coef} needs the aggregated sft_loss term")
    total = rl_loss_coef * rl_loss
    return total + sft_loss_coef * sft if sft is not None and sft_loss_coef > 0 else total


def sample_weights(
    mask: Tensor,
    *,
    difficulty: Tensor | None = None,
    difficulty_loss_weight: bool = False,
    length_loss_weight: bool = False,
) -> Tensor:
    """Per-sample policy-loss weights, as ROLL's ``compute_sample_weights``.

    Starting from 1 for every sample:

    - ``difficulty_loss_weight``: times ``0.5 + 1.5 * clamp(difficulty, 0, 1)``
      (harder samples weigh more: 0.5 to 2);
    - ``length_loss_weight``: times ``1.5 - (L - min L) / (max L - min L + 1e-8)``
      with ``L`` the generated-token count (longer samples weigh less: 1.5 to 0.5);

    then rescaled to sum to ``B``: ``w * B / (sum w + 1e-8)``. Weight the
    policy loss with :func:`weight_rows` before aggregating; ROLL applies them
    to the policy loss only (not to the KL, entropy or SFT terms).

    ROLL computes these inside the loss function, over one micro-batch (so the
    length range and the normalization depend on ``micro_batch_size``), and
    skips the difficulty factor silently when the data has no ``difficulty``.
    Compute them over the mini-batch instead, and pass ``difficulty`` whenever
    ``difficulty_loss_weight`` is on (it raises otherwise).

    Args:
        mask: ``[B, T]`` 1 on generated tokens.
        difficulty: ``[B]`` each sample's difficulty in ``[0, 1]`` (clamped).
        difficulty_loss_weight: Apply the difficulty factor.
        length_loss_weight: Apply the length factor.

    Returns:
        ``[B]`` weights (no gradient), mean 1 up to the epsilon.

    Raises:
        ValueError: On ``difficulty_loss_weight`` without ``difficulty``, or
            mismatched shapes.
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got {tuple(mask.shape)}")
    batch = mask.shape[0]
    weights = torch.ones(batch, device=mask.device)  # [B]
    if difficulty_loss_weight:
        if difficulty is None:
            raise ValueError(
                "difficulty_loss_weight needs each sample's difficulty in [0, 1]; "
                "ROLL reads it from the data's 'difficulty' field"
            )
        if difficulty.shape != (batch,):
            raise ValueError(f"difficulty must be [B] = [{batch}], got {tuple(difficulty.shape)}")
        weights = weights * (0.5 + 1.5 * difficulty.detach().float().clamp(0.0, 1.0))
    if length_loss_weight:
        lengths = mask.float().sum(-1)  # [B]
        span = lengths.max() - lengths.min() if batch else lengths.new_zeros(())
        weights = weights * (1.5 - (lengths - lengths.min()) / (span + SAMPLE_WEIGHT_EPSILON))
    total = weights.sum()
    if total > 0:
        weights = weights * (batch / (total + SAMPLE_WEIGHT_EPSILON))
    return weights


def group_difficulty(scores: Tensor, group_ids: Tensor, of: Tensor | None = None) -> Tensor:
    """Each sample's difficulty for ``difficulty_loss_weight``: the share of its
    group's samples whose score is ``<= 0`` (failed), in ``[0, 1]``.

    A group is the ``group_size`` episodes of one env seed, so this is the
    prompt's failure rate under the current policy: 0 when every episode of
    the seed succeeded (weight 0.5), 1 when none did (weight 2). In step mode
    each turn is a sample and counts once. Measure it on the whole step's batch
    and ask for the mini-batch's rows with ``of`` (a group may span mini-batches).

    Args:
        scores: ``[B]`` each sample's score.
        group_ids: ``[B]`` each sample's group.
        of: ``[N]`` group ids to answer for, each present in ``group_ids``
            (None: ``group_ids``).

    Returns:
        ``[N]`` (``[B]`` without ``of``) float difficulties.

    Raises:
        ValueError: On mismatched shapes or a group id of ``of`` absent from ``group_ids``.
    """
    if scores.dim() != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            f"scores and group_ids must both be [B], got {tuple(scores.shape)} and "
            f"{tuple(group_ids.shape)}"
        )
    device = scores.device
    ids, inverse = torch.unique(group_ids.cpu(), return_inverse=True)  # [G], [B]
    failed = torch.zeros(len(ids)).index_add_(0, inverse, (scores.cpu() <= 0).float())  # [G]
    counts = torch.zeros(len(ids)).index_add_(0, inverse, torch.ones(len(inverse)))  # [G]
    asked = (group_ids if of is None else of).cpu()  # [N]
    where = torch.searchsorted(ids, asked).clamp(max=max(len(ids) - 1, 0))  # [N]
    if len(asked) and (len(ids) == 0 or not bool((ids[where] == asked).all())):
        missing = sorted(set(asked.tolist()) - set(ids.tolist()))
        raise ValueError(f"group ids {missing} of `of` are not in group_ids")
    return (failed / counts)[where].to(device)  # [N]


def weight_rows(loss: Tensor, weights: Tensor) -> Tensor:
    """``loss * weights[:, None]`` (detached weights): per-sample weights on a per-token loss.

    Aggregating the result with :func:`~agentgym.trainers.losses.aggregate_loss`
    gives ROLL's ``agg_loss(..., weights=...)`` in every ``loss_agg_mode``.

    Args:
        loss: ``[B, T]`` per-token loss.
        weights: ``[B]`` from :func:`sample_weights`.

    Returns:
        ``[B, T]``.

    Raises:
        ValueError: If ``weights`` is not ``[B]``.
    """
    if loss.dim() != 2 or weights.shape != loss.shape[:1]:
        raise ValueError(
            f"loss must be [B, T] and weights [B], got {tuple(loss.shape)} and "
            f"{tuple(weights.shape)}"
        )
    return loss * weights.detach()[:, None].to(loss.dtype)
