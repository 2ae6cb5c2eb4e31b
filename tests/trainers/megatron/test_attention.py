"""The Megatron strategy's fused core attention against megatron-core's own: the same
output and gradients (fp32, CPU), no ``s × s`` tensor kept for the backward pass where
the parent keeps two, the parent's path wherever SDPA does not apply, and the backend
variables choosing between them."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.trainers.megatron.launch import spawn

SEQ, BATCH, HEADS, GROUPS, HEAD_DIM = 24, 3, 4, 2, 8
WIDE_HEAD_DIM = 264  # over GQA_MAX_HEAD_DIM


def _config(dropout: float = 0.0, head_dim: int = HEAD_DIM, **extra: Any) -> Any:
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=2,
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_query_groups=GROUPS,
        kv_channels=head_dim,
        attention_dropout=dropout,
        masked_softmax_fusion=False,
        use_cpu_initialization=True,
        **extra,
    )


def _run(module: torch.nn.Module, inputs: list[torch.Tensor], mask: Any = None) -> dict[str, Any]:
    """Output, input gradients and the shapes autograd saved for backward."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    saved: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = module(*leaves, mask)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * weights).sum().backward()
    return {"out": out.detach(), "grads": [t.grad for t in leaves], "saved": saved}


def _squares(saved: list[tuple[int, ...]]) -> int:
    return sum(1 for shape in saved if len(shape) >= 2 and shape[-2:] == (SEQ, SEQ))


def attention_checks(rank: int, world: int) -> dict[str, Any]:
    import os

    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from agentgym.trainers.strategies.megatron.attention import SdpaAttention
    from agentgym.trainers.strategies.megatron.cpu import cpu_mode
    from agentgym.trainers.strategies.megatron.model import (
        Parallelism,
        build_gpt_model,
        init_parallel,
        transformer_config,
    )

    results: dict[str, Any] = {}
    with cpu_mode():
        init_parallel(Parallelism())
        torch.manual_seed(0)
        q = torch.randn(SEQ, BATCH, HEADS, HEAD_DIM)
        k, v = (torch.randn(SEQ, BATCH, GROUPS, HEAD_DIM) for _ in range(2))
        for mask_type in (AttnMaskType.causal, AttnMaskType.no_mask):
            for layer_scaling in (False, True):
                config = _config(apply_query_key_layer_scaling=layer_scaling, fp16=layer_scaling)
                config.fp16 = False  # layer scaling needs fp16 to build; the math is fp32 here
                args = (config, 2, mask_type, "self")
                name = f"{mask_type.name}-scaling{int(layer_scaling)}"
                results[name] = (
                    _run(DotProductAttention(*args), [q, k, v]),
                    _run(SdpaAttention(*args), [q, k, v]),
                )
        # Heads wider than the flash kernels' grouped path: keys and values repeated.
        wide = _config(head_dim=WIDE_HEAD_DIM)
        wq = torch.randn(SEQ, BATCH, HEADS, WIDE_HEAD_DIM)
        wk, wv = (torch.randn(SEQ, BATCH, GROUPS, WIDE_HEAD_DIM) for _ in range(2))
        args = (wide, 1, AttnMaskType.causal, "self")
        results["wide"] = (
            _run(DotProductAttention(*args), [wq, wk, wv]),
            _run(SdpaAttention(*args), [wq, wk, wv]),
        )
        # An explicit mask, and dropout while training, take the parent's path.
        mask = torch.rand(BATCH, 1, SEQ, SEQ) > 0.7
        args = (_config(), 1, AttnMaskType.padding, "self")
        results["mask"] = (
            _run(DotProductAttention(*args), [q, k, v], mask),
            _run(SdpaAttention(*args), [q, k, v], mask),
        )
        dropped = SdpaAttention(_config(dropout=0.5), 1, AttnMaskType.causal, "self")
        torch.manual_seed(1)
        results["dropout"] = _run(dropped, [q, k, v])
        # The backend variables pick the module.
        from transformers import Qwen2Config

        hf = Qwen2Config(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=1,
            num_attention_heads=HEADS,
            num_key_value_heads=GROUPS,
        )
        picked = {}
        for env in ({}, {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "0", "NVTE_UNFUSED_ATTN": "1"}):
            os.environ.update(env)
            model: Any = build_gpt_model(hf, transformer_config(hf, Parallelism()))
            layer = model.decoder.layers[0].self_attention.core_attention
            picked[bool(env)] = type(layer).__name__
        results["picked"] = picked
        # The final norm whatever megatron-core would pick by what is installed (here as
        # with Apex but no Transformer Engine: a LayerNorm that refuses RMSNorm).
        from megatron.core.transformer import transformer_block

        class ApexLike(torch.nn.Module):
            def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
                raise AssertionError("FusedLayerNorm takes LayerNorm only")

        installed = transformer_block.LayerNormImpl
        transformer_block.LayerNormImpl = ApexLike
        try:
            model = build_gpt_model(hf, transformer_config(hf, Parallelism()))
        finally:
            transformer_block.LayerNormImpl = installed
        results["final_norm"] = type(model.decoder.final_layernorm).__name__
    return results


@pytest.fixture(scope="module")
def checks() -> dict[str, Any]:
    return spawn(1, attention_checks)


@pytest.mark.parametrize(
    "case", ["causal-scaling0", "causal-scaling1", "no_mask-scaling0", "no_mask-scaling1"]
)
def test_fused_attention_matches_megatrons_and_keeps_no_square(
    checks: dict[str, Any], case: str
) -> None:
    parent, fused = checks[case]
    torch.testing.assert_close(fused["out"], parent["out"], rtol=0, atol=1e-5)
    for mine, theirs in zip(fused["grads"], parent["grads"], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
    assert _squares(parent["saved"]) >= 1  # the probabilities (and scores) kept
    assert _squares(fused["saved"]) == 0
    # keys and values kept per group, not repeated to the query heads
    assert fused["saved"].count((BATCH, GROUPS, SEQ, HEAD_DIM)) == 2
    assert (BATCH, GROUPS, SEQ, HEAD_DIM) not in parent["saved"]


def test_the_final_norm_is_the_layers_torch_norm_whatever_is_installed(
    checks: dict[str, Any],
) -> None:
    assert checks["final_norm"] == "RMSNorm"  # torch.nn.RMSNorm, as WrappedTorchNorm builds


def test_heads_wider_than_the_grouped_kernels_take_repeated_keys(checks: dict[str, Any]) -> None:
    parent, fused = checks["wide"]
    torch.testing.assert_close(fused["out"], parent["out"], rtol=0, atol=1e-5)
    for mine, theirs in zip(fused["grads"], parent["grads"], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
    assert (BATCH, GROUPS, SEQ, WIDE_HEAD_DIM) not in fused["saved"]
    assert fused["saved"].count((BATCH, HEADS, SEQ, WIDE_HEAD_DIM)) >= 3  # q, k, v


def test_a_mask_or_training_dropout_takes_megatrons_path(checks: dict[str, Any]) -> None:
    parent, fused = checks["mask"]
    assert torch.equal(fused["out"], parent["out"])
    assert _squares(fused["saved"]) >= 1
    dropped = checks["dropout"]
    assert _squares(dropped["saved"]) >= 1
    assert torch.isfinite(dropped["out"]).all()


def test_backend_variables_choose_the_attention(checks: dict[str, Any]) -> None:
    assert checks["picked"] == {False: "SdpaAttention", True: "DotProductAttention"}
