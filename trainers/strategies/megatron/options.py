"""ROLL's Megatron ``strategy_config`` keys: which run here, and why the others stop at start."""

from __future__ import annotations

from typing import Any

from agentgym.trainers.strategies.megatron.model import Parallelism

RECOMPUTE: dict[str, dict[str, Any]] = {
    "full": {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    },
    "selective": {"recompute_granularity": "selective"},
}
"""``recompute_granularity`` -> megatron-core's ``TransformerConfig`` fields."""


def _has_transformer_engine() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


def check_options(
    parallelism: Parallelism, *, sequence_parallel: bool, recompute_granularity: str | None
) -> dict[str, Any]:
    """The ``TransformerConfig`` overrides of these options.

    Raises:
        ValueError: On an option that needs Transformer Engine or a GPU when they
            are missing, one this strategy does not build, or an unknown value.
    """
    import torch

    gpu_te = torch.cuda.is_available() and _has_transformer_engine()
    if sequence_parallel and not gpu_te:
        raise ValueError(
            "sequence_parallel=True needs Transformer Engine on a GPU (megatron-core's local "
            "layer spec does not support it); set sequence_parallel: false"
        )
    if parallelism.context_parallel_size > 1 and not gpu_te:
        raise ValueError(
            f"context_parallel_size={parallelism.context_parallel_size} needs Transformer "
            "Engine's attention on a GPU; set context_parallel_size: 1"
        )
    if parallelism.expert_model_parallel_size > 1:
        raise ValueError(
            f"expert_model_parallel_size={parallelism.expert_model_parallel_size}: the mapped "
            "families (Qwen2, Llama, Qwen3) are dense; MoE models are not mapped yet"
        )
    if (parallelism.virtual_pipeline_model_parallel_size or 1) > 1:
        raise ValueError(
            "virtual_pipeline_model_parallel_size > 1 (interleaved pipeline) is not built yet; "
            "leave it unset"
        )
    overrides: dict[str, Any] = {"sequence_parallel": sequence_parallel}
    if recompute_granularity is not None:
        if recompute_granularity not in RECOMPUTE:
            raise ValueError(
                f"recompute_granularity={recompute_granularity!r}; valid options: "
                f"{list(RECOMPUTE)} or unset"
            )
        overrides |= RECOMPUTE[recompute_granularity]
    return overrides
