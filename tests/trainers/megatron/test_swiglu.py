"""The Megatron strategy's SwiGLU: megatron-core's MLP activation (``silu(gate) * up``
of the fused gate/up output) in value and gradient, with only its input kept for the
backward pass."""

from __future__ import annotations

import pytest
import torch

from agentgym.trainers.strategies.megatron.swiglu import SwiGLU


def saved_shapes(fn: object, x: torch.Tensor) -> tuple[torch.Tensor, list[tuple[int, ...]]]:
    saved: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn(x)  # type: ignore[operator]
    return out, saved


def reference(fused: torch.Tensor) -> torch.Tensor:
    """megatron-core's unfused GLU at offset 0, through autograd."""
    gate, up = torch.chunk(fused, 2, dim=-1)
    return torch.nn.functional.silu(gate) * (up + 0.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_swiglu_matches_megatrons_glu_and_keeps_only_its_input(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.randn(5, 3, 16, dtype=torch.float64) * 3).to(dtype)  # [s, b, 2f]
    grad = torch.randn(5, 3, 8, dtype=torch.float64).to(dtype)
    mine = x.clone().requires_grad_()
    theirs = x.clone().requires_grad_()
    out, saved = saved_shapes(SwiGLU(), mine)
    expected, their_saved = saved_shapes(reference, theirs)
    out.backward(grad)
    expected.backward(grad)
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance)
    assert mine.grad is not None and theirs.grad is not None
    torch.testing.assert_close(mine.grad, theirs.grad, rtol=tolerance, atol=tolerance)
    assert saved == [(5, 3, 16)]  # the input alone
    assert len(their_saved) >= 3  # the input (behind silu), silu(gate), the offset up
