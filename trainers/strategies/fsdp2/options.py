"""ROLL's ``fsdp2_train`` ``strategy_config`` keys: which run here, and why the others
stop at start (before any model is loaded)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from agentgym.errors import ConfigError, did_you_mean

KEYS = (
    "fsdp_size",
    "param_dtype",
    "reduce_dtype",
    "reshard_after_forward",
    "offload_policy",
    "wrap_policy",
    "reduce_scatter_during_grad_accumulation",
    "async_save_ckpt",
)
"""The ``strategy_config`` keys the FSDP2 strategy honours (``async_save_ckpt`` only
as ``false``)."""

WRAP_KEYS = ("transformer_layer_cls_to_wrap", "wrap_embeddings", "wrap_lm_output")
"""The ``wrap_policy`` keys the FSDP2 strategy honours."""

_MOE = "ROLL's MoE patches are not built here (the mapped models are dense); remove it"
UNHONOURED = {
    "ulysses_size": "Ulysses sequence (context) parallelism is not built; remove it and "
    "bound activation memory with gradient checkpointing "
    "(actor_train.model_args.disable_gradient_checkpointing: false)",
    "apply_expert_patch": _MOE,
    "ep_size": "expert parallelism: " + _MOE,
    "efsdp_size": "expert sharding: " + _MOE,
    "moe_use_grouped_mm": _MOE,
    "apply_tiled_mlp": "ROLL's tiled-MLP patch is not built; bound activation memory with "
    "gradient checkpointing (actor_train.model_args.disable_gradient_checkpointing: false)",
    "tiled_num_shards": "it sizes ROLL's tiled-MLP patch, which is not built; remove it",
    "save_only_model": "a checkpoint here always holds the optimizer, so a resume is exact; "
    "remove it",
    "wrap_policy.moe_experts": "MoE expert units: " + _MOE,
}
"""ROLL's keys this strategy cannot honour -> why and what to do (an error at start)."""

DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
"""ROLL's dtype spellings -> torch dtypes."""


@dataclass(frozen=True)
class WrapPolicy:
    """Which modules are FSDP units (each all-gathered and freed on its own); the rest
    of the model is the root unit.

    Attributes:
        layer_classes: Class names of the decoder layers (None: the model's
            ``_no_split_modules``, as ROLL's default).
        wrap_embeddings: The input embedding is a unit of its own.
        wrap_lm_output: The output layer (``lm_head``) is a unit of its own.
    """

    layer_classes: tuple[str, ...] | None = None
    wrap_embeddings: bool = False
    wrap_lm_output: bool = False


def parse_dtype(key: str, value: str | torch.dtype | None) -> torch.dtype | None:
    """``value`` as a torch dtype (None stays None).

    Raises:
        ConfigError: Naming ``key``, the value and the valid spellings.
    """
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in DTYPE_NAMES:
        raise ConfigError(
            f"strategy_config.{key}={value!r} is not a dtype.{did_you_mean(value, DTYPE_NAMES)} "
            f"Valid: {list(DTYPE_NAMES)}"
        )
    return DTYPE_NAMES[value]


def wrap_policy(value: Mapping[str, Any] | None) -> WrapPolicy:
    """ROLL's ``wrap_policy`` mapping as a :class:`WrapPolicy`.

    Raises:
        ConfigError: On a key of :data:`UNHONOURED` or an unknown key (naming it).
    """
    value = dict(value or {})
    _raise(_problems(value, WRAP_KEYS, prefix="wrap_policy."), WRAP_KEYS, "wrap_policy.")
    layers = value.get("transformer_layer_cls_to_wrap")
    if isinstance(layers, str):
        layers = [layers]
    return WrapPolicy(
        layer_classes=None if layers is None else tuple(str(name) for name in layers),
        wrap_embeddings=bool(value.get("wrap_embeddings", False)),
        wrap_lm_output=bool(value.get("wrap_lm_output", False)),
    )


def _problems(config: Mapping[str, Any], known: tuple[str, ...], *, prefix: str) -> list[str]:
    """Each key of ``config`` that is not ``known``: a key of :data:`UNHONOURED` with
    its reason, an unknown one with a close match."""
    problems = []
    for key in config:
        name = prefix + str(key)
        if name in UNHONOURED:
            problems.append(f"{name} ({UNHONOURED[name]})")
        elif key not in known:
            problems.append(f"{name} is not a key of it.{did_you_mean(key, known)}")
    return problems


def _raise(problems: list[str], known: tuple[str, ...], prefix: str = "") -> None:
    if problems:
        raise ConfigError(
            "actor_train.strategy_args.strategy_config of fsdp2_train: "
            + "; ".join(problems)
            + f". Keys honoured: {[prefix + key for key in known]}"
        )


def check_config(config: Mapping[str, Any]) -> None:
    """Check ROLL's ``strategy_config`` of ``fsdp2_train`` before any model work.

    Raises:
        ConfigError: Naming every key it cannot honour (:data:`UNHONOURED`, with the
            reason) and every unknown key, in ``wrap_policy`` too; on a bad dtype or
            ``async_save_ckpt: true``.
    """
    problems = _problems(config, KEYS, prefix="")
    problems += _problems(config.get("wrap_policy") or {}, WRAP_KEYS, prefix="wrap_policy.")
    _raise(problems, KEYS + tuple("wrap_policy." + key for key in WRAP_KEYS))
    for key in ("param_dtype", "reduce_dtype"):
        parse_dtype(key, config.get(key))
    if config.get("async_save_ckpt", False):
        raise ConfigError(
            "strategy_config.async_save_ckpt=true: checkpoints are written synchronously here "
            "(each rank its shard, torch.distributed.checkpoint); set it false or remove it"
        )


def mesh_shape(world: int, fsdp_size: int) -> tuple[int, ...]:
    """The device mesh of ``world`` ranks: ``(world,)`` (full sharding) when
    ``fsdp_size`` is <= 1 or >= ``world`` (ROLL's rule), else ``(world // fsdp_size,
    fsdp_size)`` (hybrid: replicate across groups, shard within each).

    Raises:
        ConfigError: When ``fsdp_size`` does not divide ``world``.
    """
    if fsdp_size <= 1 or fsdp_size >= world:
        return (world,)
    if world % fsdp_size:
        raise ConfigError(
            f"strategy_config.fsdp_size={fsdp_size} does not divide the {world} ranks "
            "(actor_train.device_mapping) into whole sharding groups; pick a divisor of "
            f"{world}, or {world} (or 1) for full sharding"
        )
    return (world // fsdp_size, fsdp_size)
