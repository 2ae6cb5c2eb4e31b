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


def check_options(
    parallelism: Parallelism, *, sequence_parallel: bool, recompute_granularity: str | None
) -> dict[str, Any]:
    """The ``TransformerConfig`` overrides of these options.

    Raises:
        ValueError: On an option this strategy does not build (sequence and context
            parallelism need Transformer Engine's layer spec; the strategy builds
            megatron-core's local one on every device), or an unknown value.
    """
    if sequence_parallel:
        raise ValueError(
            "sequence_parallel=True needs Transformer Engine's layer spec; this strategy "
            "builds megatron-core's local one (its norms cannot take a sequence split), on "
            "a GPU too; set sequence_parallel: false"
        )
    if parallelism.context_parallel_size > 1:
        raise ValueError(
            f"context_parallel_size={parallelism.context_parallel_size} needs Transformer "
            "Engine's attention; this strategy builds megatron-core's local layer spec, on "
            "a GPU too; set context_parallel_size: 1"
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
