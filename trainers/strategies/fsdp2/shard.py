"""Sharding a Hugging Face causal LM with torch's FSDP2 (``fully_shard``) over a
device mesh: which modules are units, mixed precision, CPU offload, and gradients
summed (not averaged) over the ranks."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from agentgym.errors import ConfigError
from agentgym.trainers.strategies.fsdp2.options import WrapPolicy, mesh_shape


def ensure_process_group(device: torch.device) -> None:
    """Join a process group of one on a free loopback port when none is set up (one
    process, ``distributed=local``); a rank group's ranks have joined theirs already."""
    if dist.is_initialized():
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def device_mesh(fsdp_size: int, device: torch.device) -> DeviceMesh:
    """The mesh of all ranks (:func:`~.options.mesh_shape`): 1-D ``(fsdp,)`` or 2-D
    ``(replicate, fsdp)``."""
    shape = mesh_shape(dist.get_world_size(), fsdp_size)
    names = ("fsdp",) if len(shape) == 1 else ("replicate", "fsdp")
    return init_device_mesh(device.type, shape, mesh_dim_names=names)


def units(model: Any, policy: WrapPolicy) -> list[torch.nn.Module]:
    """The modules that become FSDP units below the root, bottom-up: the input
    embedding (``wrap_embeddings``), each decoder layer, the output layer
    (``wrap_lm_output``).

    Raises:
        ConfigError: When a named layer class is not in the model (naming the classes
            it has), or the embeddings are tied and asked to be units of their own.
    """
    names = policy.layer_classes
    if names is None:
        names = tuple(getattr(model, "_no_split_modules", None) or ())
    present = {type(module).__name__ for module in model.modules()}
    missing = [name for name in names if name not in present]
    if missing or not names:
        layers = sorted(name for name in present if "Layer" in name or "Block" in name)
        raise ConfigError(
            f"strategy_config.wrap_policy.transformer_layer_cls_to_wrap={list(names)}: the model "
            f"has no {missing or 'layer class named'}; its layer classes: {layers}"
        )
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    if tied and (policy.wrap_embeddings or policy.wrap_lm_output):
        raise ConfigError(
            "strategy_config.wrap_policy.wrap_embeddings / wrap_lm_output: this model ties its "
            "output layer to the input embedding, so the shared weight stays in the root unit; "
            "set both false"
        )
    chosen: list[torch.nn.Module] = []
    if policy.wrap_embeddings:
        chosen.append(model.get_input_embeddings())
    chosen += [module for module in model.modules() if type(module).__name__ in names]
    if policy.wrap_lm_output:
        chosen.append(model.get_output_embeddings())
    return chosen


def shard(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    policy: WrapPolicy,
    *,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
    reshard_after_forward: bool | None,
    offload: bool,
) -> Any:
    """Shard ``model`` in place: each of :func:`units` then the root with
    ``fully_shard``; gradients are summed over the ranks (each micro-batch's loss is
    already its share of the mini-batch), as the single-process strategy sums them.

    Args:
        model: The model (its parameters in their storage dtype).
        mesh: :func:`device_mesh`.
        policy: Which modules are units.
        param_dtype: The dtype parameters are gathered and computed in (None: their own).
        reduce_dtype: The dtype gradients are reduced in (None: ``param_dtype``).
        reshard_after_forward: Free each unit's gathered parameters after forward
            (True: ZeRO-3) or keep them for backward (False: ZeRO-2); None: torch's
            default (True for units, False for the root).
        offload: Keep the sharded parameters, gradients and optimizer state in CPU memory.

    Returns:
        ``model``, now an ``FSDPModule``.
    """
    options: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
        "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        if offload
        else OffloadPolicy(),
    }
    if reshard_after_forward is not None:
        options["reshard_after_forward"] = reshard_after_forward
    for unit in units(model, policy):
        fully_shard(unit, **options)
    fully_shard(model, **options)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # sum, not average: gloo has no pre-scaled sum, so scale (by 1) apart
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def reshard(model: torch.nn.Module) -> None:
    """Free every unit's gathered parameters (after a forward without backward)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside the block, every parameter a module registers lives on the meta device
    (no memory); buffers stay where they are made, so a model built here keeps its
    rotary frequencies (non-persistent buffers no checkpoint holds). A parameter
    registered again (a tied one) keeps its object, so ties survive.

    Not thread-safe: it replaces ``torch.nn.Module.register_parameter`` for the block.
    """
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and not param.is_meta:
            kind = type(param)
            module._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original  # type: ignore[method-assign]


def materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Give the sharded ``model``'s meta parameters uninitialized storage on ``device``
    (FSDP2's meta-device flow: ``to_empty`` after ``fully_shard``), in place, so tied
    parameters stay one parameter; its buffers keep their values (``to_empty`` would
    leave them uninitialized)."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


def load_from_rank0(model: torch.nn.Module, full: Mapping[str, torch.Tensor]) -> None:
    """Fill the sharded ``model`` with rank 0's ``full`` state dict (empty on the other
    ranks, whose shards :func:`materialize` made): each tensor is broadcast from rank
    0 and each rank copies in its shard (torch's ``set_model_state_dict`` with
    ``broadcast_from_rank0``, as verl's ``fsdp2_load_full_state_dict``). Every rank
    calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, dict(full), options=options)
