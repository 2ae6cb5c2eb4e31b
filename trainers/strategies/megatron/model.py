"""A megatron-core ``GPTModel`` built from a Hugging Face config, and the parallel groups.

Supported families: Qwen2/Qwen2.5 (qkv bias), Llama (``attention_bias``) and
Qwen3 (q/k RMSNorm): grouped-query attention, RMSNorm, SwiGLU, RoPE with the
config's theta, tied or untied embeddings. The layer spec is megatron-core's
local one (no Transformer Engine) with its core attention through PyTorch's fused
kernels (:class:`~agentgym.trainers.strategies.megatron.attention.SdpaAttention`,
unless ``attention_backend`` is ``local`` or ``unfused``); it runs on the CPU under
:func:`~agentgym.trainers.strategies.megatron.cpu.cpu_mode`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "qwen3")
"""Hugging Face ``model_type`` values :func:`build_gpt_model` maps."""


@dataclass(frozen=True)
class Parallelism:
    """Megatron's model-parallel sizes (ROLL's ``strategy_config`` keys)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1


def attention_backend(environ: Mapping[str, str]) -> str:
    """megatron-core's ``attention_backend`` for Transformer Engine's ``NVTE_FLASH_ATTN``,
    ``NVTE_FUSED_ATTN`` and ``NVTE_UNFUSED_ATTN`` (ROLL's files set them in a role's
    ``system_envs``), by ROLL's rule (``mcore_adapter``'s
    ``check_and_get_attention_backend_by_env``): megatron-core asserts that the variables
    agree with the backend, so ``auto`` fails once one of them is 0. Without Transformer
    Engine, ``auto``, ``flash`` and ``fused`` run PyTorch's fused attention kernels (no
    ``s × s`` matrix kept); ``local`` and ``unfused`` run megatron-core's own
    ``DotProductAttention``, which keeps the scores and probabilities.

    Returns:
        ``local``, ``flash``, ``fused``, ``unfused`` or ``auto``.
    """
    flash, fused, unfused = (
        environ.get(name) for name in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")
    )
    if flash == fused == unfused == "0":
        return "local"
    if flash == "1" and "0" in (fused, unfused):
        return "flash"
    if fused == "1" and "0" in (flash, unfused):
        return "fused"
    if unfused == "1" and "0" in (flash, fused):
        return "unfused"
    return "auto"


def init_parallel(parallelism: Parallelism, *, seed: int = 0) -> None:
    """Join (or start, for one process) ``torch.distributed`` and build megatron's groups.

    Raises:
        ValueError: If the world size is not a multiple of TP × PP × CP.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
        )
    model_parallel = (
        parallelism.tensor_model_parallel_size
        * parallelism.pipeline_model_parallel_size
        * parallelism.context_parallel_size
    )
    if dist.get_world_size() % model_parallel:
        raise ValueError(
            f"world size {dist.get_world_size()} is not a multiple of tensor_model_parallel_size "
            f"× pipeline_model_parallel_size × context_parallel_size = {model_parallel}; "
            "change the sizes or the number of devices in actor_train.device_mapping"
        )
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallelism.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallelism.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallelism.virtual_pipeline_model_parallel_size,
        context_parallel_size=parallelism.context_parallel_size,
        expert_model_parallel_size=parallelism.expert_model_parallel_size,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def padded_vocab_size(vocab_size: int, tensor_parallel_size: int) -> int:
    """``vocab_size`` rounded up so every TP rank holds the same number of rows."""
    return -(-vocab_size // tensor_parallel_size) * tensor_parallel_size


def transformer_config(hf_config: Any, parallelism: Parallelism, **overrides: Any) -> Any:
    """megatron-core's ``TransformerConfig`` for a Hugging Face decoder config.

    Raises:
        ValueError: On a ``model_type`` outside :data:`SUPPORTED_MODEL_TYPES`.
    """
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    model_type = hf_config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type={model_type!r} has no Megatron mapping; supported: "
            f"{list(SUPPORTED_MODEL_TYPES)} (use strategy_name: torch for other models)"
        )
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    qkv_bias = model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False))
    dtype = overrides.pop("params_dtype", torch.float32)
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=qkv_bias,
        qk_layernorm=model_type == "qwen3",
        hidden_dropout=0.0,
        attention_dropout=float(getattr(hf_config, "attention_dropout", 0.0)),
        tensor_model_parallel_size=parallelism.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallelism.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=parallelism.virtual_pipeline_model_parallel_size,
        context_parallel_size=parallelism.context_parallel_size,
        expert_model_parallel_size=parallelism.expert_model_parallel_size,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=not torch.cuda.is_available(),
        perform_initialization=True,  # also marks the TP-split weights (the grad norm reads it)
        variable_seq_lengths=True,  # micro-batches differ in length
        moe_token_dispatcher_type="alltoall",  # the one megatron-core allows with the line above
        calculate_per_token_loss=True,  # losses are already shares of the mini-batch
        bias_activation_fusion=False,
        use_te_activation_func=True,  # the spec's activation module: swiglu.SwiGLU
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        attention_backend=AttnBackend[attention_backend(os.environ)],
        **overrides,
    )


def build_gpt_model(hf_config: Any, config: Any, *, vp_stage: int | None = None) -> torch.nn.Module:
    """This rank's stage of the ``GPTModel`` (random weights; load them with
    :func:`~agentgym.trainers.strategies.megatron.weights.load_hf_weights`)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    from agentgym.trainers.strategies.megatron.attention import FUSED_BACKENDS, SdpaAttention
    from agentgym.trainers.strategies.megatron.swiglu import SwiGLU

    spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")
    if config.attention_backend.name in FUSED_BACKENDS:
        spec.submodules.self_attention.submodules.core_attention = SdpaAttention
    spec.submodules.mlp.submodules.activation_func = SwiGLU  # with use_te_activation_func
    # The final norm is the layers' torch RMSNorm on every machine: given a layer spec
    # alone, megatron-core picks it by what is installed (Transformer Engine's norm, or
    # Apex's LayerNorm, which refuses RMSNorm).
    block = TransformerBlockSubmodules(
        layer_specs=[spec] * get_num_layers_to_build(config, vp_stage=vp_stage),
        layer_norm=WrappedTorchNorm,
    )
    rope = getattr(hf_config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    return GPTModel(
        config=config,
        transformer_layer_spec=block,
        vocab_size=padded_vocab_size(hf_config.vocab_size, config.tensor_model_parallel_size),
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings),
        position_embedding_type="rope",
        rotary_base=float(theta),
        vp_stage=vp_stage,
    )


class HeadFrom:
    """A forward pre-hook on a ``GPTModel``'s output layer: the LM head runs on the hidden
    states from sequence position :attr:`start` on (``[s, b, h]``), as megatron-core itself
    slices them for inference's last-token logits. A forward pass sets ``start`` to the
    position before the batch's first scored token: the prompt before it needs no logits,
    and at a half-prompt batch this skips half the head's FLOPs and its fp32 logits.
    Without sequence or context parallelism only (the hidden states reach the head
    split along the sequence there)."""

    def __init__(self) -> None:
        self.start = 0
        """0 (every position) outside a scored forward pass."""

    def __call__(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if self.start == 0:
            return None
        return (args[0][self.start :], *args[1:]), kwargs

    def attach(self, model: torch.nn.Module) -> None:
        """Hook ``model``'s output layer (a stage without one: nothing to do)."""
        head = getattr(model, "output_layer", None)
        if head is not None:
            head.register_forward_pre_hook(self, with_kwargs=True)
