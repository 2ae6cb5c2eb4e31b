"""SwiGLU for the local layer spec's MLP, keeping only its input for the backward pass.

Without fusion, megatron-core's MLP computes ``silu(gate) * (up + glu_linear_offset)``
with autograd: the backward pass keeps the fused gate/up output, ``silu(gate)`` and the
offset ``up`` (a copy, even at offset 0), ``4f`` per token besides the down projection's
input. Its fused path (``bias_activation_fusion``) keeps the input alone but compiles
with ``torch.compile`` in every process. :class:`SwiGLU` keeps the input alone, eagerly:
the backward pass recomputes ``silu(gate)`` (one more elementwise kernel) and takes
``gate``'s gradient from the fused ``silu_backward``. The layer spec plugs it in as the
MLP's activation module (``use_te_activation_func``: megatron-core's hook for one).
"""

from __future__ import annotations

from typing import Any

import torch


class _SwiGLUFunction(torch.autograd.Function):
    """``silu(gate) * up`` of ``[..., 2f]`` (gate first) with only the input saved."""

    @staticmethod
    def forward(ctx: Any, fused: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(fused)
        gate, up = fused.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (fused,) = ctx.saved_tensors
        gate, up = fused.chunk(2, dim=-1)
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        grad_up = grad * torch.nn.functional.silu(gate)
        return torch.cat([grad_gate, grad_up], dim=-1)


class SwiGLU(torch.nn.Module):
    """The MLP's activation module: ``[..., 2f]`` (gate, up) to ``[..., f]``.

    Args:
        config: megatron-core's ``TransformerConfig`` (unused; ``build_module`` passes it).
    """

    def __init__(self, config: Any = None) -> None:
        super().__init__()

    def forward(self, fused: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of the fused gate/up projection's output."""
        return _SwiGLUFunction.apply(fused)

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple[Any, ...] = (), metadata: Any = None
    ) -> dict[str, Any]:
        """Nothing to checkpoint (megatron-core's MLP asks each of its modules)."""
        return {}
