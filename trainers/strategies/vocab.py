"""Token log-probabilities and entropy from vocabulary-parallel logits.

Each tensor-parallel rank holds a slice of the vocabulary's logits; the
log-softmax needs only three all-reduces of ``[B, T]`` tensors (the max, the
sum of exponentials, the picked logit), so the full ``[B, T, V]`` is never
gathered, and the backward pass needs none: each rank's slice of the gradient is
``(1[v = target] − p_v) / temperature`` times the upstream gradient, which is the
same on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from agentgym.trajectory import RolloutBatch

Reduce = Callable[[torch.Tensor], torch.Tensor]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor  # one rank holds the whole vocabulary: a sum over it is the sum


@dataclass(frozen=True)
class VocabSlice:
    """This rank's slice of the vocabulary, as the logits' last dimension holds it.

    Attributes:
        start: The first vocabulary id of the slice (ids ``start .. start + V_local``).
        size: The true vocabulary size (ids past it are padding rows).
        reduce_sum: Sum over the tensor-parallel ranks (no gradient needed).
        reduce_max: Max over the tensor-parallel ranks (no gradient needed).
    """

    start: int
    size: int
    reduce_sum: Reduce = _local
    reduce_max: Reduce = _local

    @classmethod
    def whole(cls, size: int) -> VocabSlice:
        """The whole vocabulary of ``size`` ids on one rank."""
        return cls(0, size)


class _VocabParallelLogprobs(torch.autograd.Function):
    """Log p(target) (and the entropy) with one ``[B, T, V_local]`` fp32 tensor: the
    logits are copied once to fp32, and scaled, masked, shifted, exponentiated and
    normalized in place into the softmax, which the backward pass reuses in place (as
    megatron-core's ``vocab_parallel_cross_entropy`` does). The gradient of each rank's
    slice needs no communication: the upstream gradients are the same on every rank."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        vocab: VocabSlice,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        vocab_start, reduce_sum = vocab.start, vocab.reduce_sum
        probs = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        probs.copy_(logits)
        scale = 1.0 / temperature if temperature > 0 and temperature != 1.0 else 1.0
        if scale != 1.0:
            probs.mul_(scale)
        local = probs.shape[-1]
        ids = torch.arange(vocab_start, vocab_start + local, device=probs.device)  # [V_local]
        padding = ids >= vocab.size
        if bool(padding.any()):
            probs.masked_fill_(padding, float("-inf"))
        probs.sub_(vocab.reduce_max(probs.max(-1).values)[..., None])  # shifted
        mine = (targets >= vocab_start) & (targets < vocab_start + local)  # [B, T]
        index = (targets - vocab_start).clamp(0, local - 1)
        picked = probs.gather(-1, index[..., None])[..., 0]
        picked = reduce_sum(torch.where(mine, picked, torch.zeros_like(picked)))
        probs.exp_()
        total = reduce_sum(probs.sum(-1))  # [B, T]
        probs.div_(total[..., None])  # the softmax
        logprobs = picked - total.log()
        entropy = (
            reduce_sum(-torch.special.xlogy(probs, probs).sum(-1))
            if with_entropy
            else logprobs.new_zeros(())
        )
        ctx.save_for_backward(probs, index, mine, entropy if with_entropy else None)
        ctx.scale, ctx.logits_dtype, ctx.spent = scale, logits.dtype, False
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logprobs: torch.Tensor, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        if ctx.spent:  # the softmax below became the first pass's gradient
            raise RuntimeError(
                "the log-probabilities' backward pass reuses their softmax in place and "
                "runs once: do not backward through them twice (retain_graph)"
            )
        ctx.spent = True
        probs, index, mine, entropy = ctx.saved_tensors
        grad = probs
        if entropy is not None and grad_entropy is not None:
            # dH/ds_v = -p_v (log p_v + H), s the scaled logits
            weight = torch.special.xlogy(probs, probs).add_(probs * entropy[..., None])
            grad = weight.mul_(-grad_entropy[..., None]).sub_(probs * grad_logprobs[..., None])
        else:
            grad.mul_(-grad_logprobs[..., None])  # d log p(target)/ds_v = 1[v = target] - p_v
        grad.scatter_add_(
            -1, index[..., None], torch.where(mine, grad_logprobs, 0.0)[..., None].to(grad.dtype)
        )
        if ctx.scale != 1.0:
            grad.mul_(ctx.scale)
        return (grad.to(ctx.logits_dtype), None, None, None, None)


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    vocab: VocabSlice,
    *,
    temperature: float,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log p(target) and the entropy, from this rank's vocabulary slice.

    Memory: one fp32 ``[B, T, V_local]`` tensor (the softmax) besides ``logits``, kept
    for the backward pass; the entropy adds a transient one.

    Args:
        logits: ``[B, T, V_local]`` this rank's logits for the ids of ``vocab``.
        targets: ``[B, T]`` the token each position predicts.
        vocab: This rank's slice of the vocabulary (:meth:`VocabSlice.whole`: all of it).
        temperature: Logits are divided by it when it is > 0 and != 1.
        with_entropy: Also return the entropy.

    Returns:
        ``[B, T]`` log-probabilities, and ``[B, T]`` entropies or None.
    """
    logprobs, entropy = _VocabParallelLogprobs.apply(
        logits, targets, vocab, temperature, with_entropy
    )
    return logprobs, entropy if with_entropy else None


def next_token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, vocab: VocabSlice, **options: Any
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`vocab_parallel_logprobs` of ``targets`` (``[B, T - 1]``) from the
    ``[B, T, V_local]`` logits of the positions before them, the last position's logits
    included unsliced: its row gets a zero gradient, where slicing it off would make the
    backward pass allocate a second full-size gradient. ``options``: the keywords of
    :func:`vocab_parallel_logprobs`."""
    padded = torch.nn.functional.pad(targets, (0, 1))
    logprobs, entropy = vocab_parallel_logprobs(logits, padded, vocab, **options)
    return logprobs[:, :-1], None if entropy is None else entropy[:, :-1]


def first_scored(batch: RolloutBatch) -> int:
    """The first position any row's loss mask covers (1 when it is 0 or none is): a
    strategy's LM head runs from the position before it on, since no loss scores the
    prompt before it (TRL's ``logits_to_keep``)."""
    covered = batch.loss_mask.any(0).nonzero()  # [N, 1]
    return max(int(covered[0, 0]), 1) if covered.numel() else 1
