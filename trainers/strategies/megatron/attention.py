"""Core attention for the local layer spec through ``torch``'s fused kernels.

megatron-core's local spec computes attention with :class:`DotProductAttention`: it
materializes the ``[b, heads, s, s]`` scores and keeps the fp32 softmax and the
probabilities for the backward pass. That is the ``5 a s² b`` term of Korthikanti et
al. and, at micro-batch 8 and 1,024 tokens of a 1.5B model, some 17 GB on top of what
the planner counts
(``docs/plan.md`` assumes a flash kernel). ROLL and verl avoid it with Transformer
Engine's flash attention; without Transformer Engine, :class:`SdpaAttention` calls
:func:`torch.nn.functional.scaled_dot_product_attention`, which picks a flash or
memory-efficient kernel on a GPU and the flash kernel on a CPU, and keeps only q, k,
v, the output and a log-sum-exp per row (k and v grouped, not repeated to every query
head, as transformers' SDPA path passes them).
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.utils import is_layer_window_attention

GQA_MAX_HEAD_DIM = 256
"""The largest head size SDPA's flash kernels take grouped keys and values at (larger
ones are repeated to the query heads first)."""

FUSED_BACKENDS = ("auto", "flash", "fused")
"""``attention_backend`` values (see :func:`~.model.attention_backend`) that run
:class:`SdpaAttention`; ``local`` and ``unfused`` keep megatron-core's own
:class:`DotProductAttention`."""


class SdpaAttention(DotProductAttention):
    """:class:`DotProductAttention` with the softmax(QKᵀ)V through PyTorch's SDPA kernels.

    Same constructor, parameters and state dict as the parent. Where SDPA cannot compute
    what the parent does (an explicit attention mask, sliding windows, a non-vanilla
    softmax, attention dropout while training, packed sequences), the parent's forward
    runs instead, so the result never depends on which path was taken.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._windowed = is_layer_window_attention(
            self.config.window_size, self.config.window_attn_skip_freq, self.layer_number
        )

    def _fused_applies(self, attention_mask: torch.Tensor | None, extras: list[Any]) -> bool:
        # As in the parent, the mask type is the one the module was built with.
        return (
            attention_mask is None
            and self.attn_mask_type in (AttnMaskType.causal, AttnMaskType.no_mask)
            and not self._windowed
            and self.softmax_offset is None
            and not (self.training and self.attention_dropout.p > 0)
            and all(extra is None for extra in extras)
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """``[sq, b, heads × head_dim]`` from ``[s, b, heads or groups, head_dim]`` inputs."""
        if not self._fused_applies(attention_mask, [attention_bias, packed_seq_params]):
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        repeats = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        # Grouped keys and values go to SDPA as they are where its flash kernels take them
        # (no mask, head size <= 256: transformers' rule; on a GPU in half precision only:
        # a float32 grouped call falls to the math kernel, which keeps the s × s scores,
        # while repeated keys reach the memory-efficient one); else repeated, as the
        # parent does.
        half = query.dtype in (torch.float16, torch.bfloat16)
        grouped = (
            repeats > 1
            and key.shape[-1] == value.shape[-1] <= GQA_MAX_HEAD_DIM
            and (half or not query.is_cuda)
        )
        if repeats > 1 and not grouped:
            key = key.repeat_interleave(repeats, dim=2)
            value = value.repeat_interleave(repeats, dim=2)
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        causal = self.attn_mask_type == AttnMaskType.causal and q.shape[2] > 1
        context = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=self.softmax_scale_unlayered, enable_gqa=grouped
        )
        # [b, n, s, d] -> [s, b, n·d]
        sq, batch = context.shape[2], context.shape[0]
        return context.permute(2, 0, 1, 3).reshape(sq, batch, self.hidden_size_per_partition)

    @property
    def softmax_scale_unlayered(self) -> float:
        """The scale on QKᵀ in all: the parent divides ``softmax_scale`` by the layer number
        under ``apply_query_key_layer_scaling`` and multiplies the scores back before the
        softmax."""
        if self.config.apply_query_key_layer_scaling:
            return self.softmax_scale * self.layer_number
        return self.softmax_scale
