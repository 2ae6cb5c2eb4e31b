"""Token log-probabilities and entropy from vocabulary-parallel logits.

Each tensor-parallel rank holds a slice of the vocabulary's logits; the
log-softmax needs only three all-reduces of ``[B, T]`` tensors (the max, the
sum of exponentials, the picked logit), so the full ``[B, T, V]`` is never
gathered. The sums go through megatron-core's
``reduce_from_tensor_model_parallel_region`` (all-reduce forward, identity
backward), which is the exact gradient of a sum of per-rank terms.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_start: int,
    vocab_size: int,
    temperature: float,
    reduce_sum: Reduce,
    reduce_max: Reduce,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log p(target) and the entropy, from this rank's vocabulary slice.

    Args:
        logits: ``[B, T, V_local]`` this rank's logits for vocabulary ids
            ``vocab_start .. vocab_start + V_local``.
        targets: ``[B, T]`` the token each position predicts.
        vocab_start: The first vocabulary id of this rank's slice.
        vocab_size: The true vocabulary size (ids past it are padding rows).
        temperature: Logits are divided by it when it is > 0 and != 1.
        reduce_sum: Sum over the TP ranks (differentiable).
        reduce_max: Max over the TP ranks (no gradient needed).
        with_entropy: Also return the entropy.

    Returns:
        ``[B, T]`` log-probabilities, and ``[B, T]`` entropies or None.
    """
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    local = logits.shape[-1]
    ids = torch.arange(vocab_start, vocab_start + local, device=logits.device)  # [V_local]
    padding = ids >= vocab_size
    if bool(padding.any()):
        logits = logits.masked_fill(padding, float("-inf"))
    peak = reduce_max(logits.detach().max(-1).values)  # [B, T]
    shifted = logits - peak[..., None]  # [B, T, V_local]
    exp = shifted.exp()
    total = reduce_sum(exp.sum(-1))  # [B, T]
    mine = (targets >= vocab_start) & (targets < vocab_start + local)  # [B, T]
    index = (targets - vocab_start).clamp(0, local - 1)
    picked = shifted.gather(-1, index[..., None])[..., 0]  # [B, T]
    picked = reduce_sum(torch.where(mine, picked, torch.zeros_like(picked)))
    logprobs = picked - total.log()
    if not with_entropy:
        return logprobs, None
    # H = log Z - sum_v p_v * shifted_v
    weighted = torch.where(padding, torch.zeros_like(shifted), exp * shifted)  # [B, T, V_local]
    entropy = total.log() - reduce_sum(weighted.sum(-1)) / total
    return logprobs, entropy
