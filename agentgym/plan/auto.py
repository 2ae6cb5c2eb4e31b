"""``actor_train.strategy_args.strategy_config: auto``: the planner's winner applied to a
run's config before anything is built.

The planner (:func:`~agentgym.plan.search.search`) gets what the config says: the
policy's shape (its ``config.json``, or the tiny model's), ``actor_train``'s ranks
(its ``device_mapping`` on Ray, one rank in process), each device's memory (the
GPU's, or this machine's memory shared by the ranks), the sequence length, the
rollout batch and the mini-batch the config asks for (``per_device_train_batch_size ×
gradient_accumulation_steps × ranks``, ROLL's rule with no model parallelism), and
whether the engines share the training devices. The winner's Megatron block
replaces ``auto``, and its micro-batch and accumulation replace the two training
arguments, so the mini-batch stays what the config asked for.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from agentgym.errors import ConfigError
from agentgym.plan.search import Devices, Plan, Workload, search
from agentgym.plan.shapes import load_shape
from agentgym.schema import validate

AUTO = "auto"
GIB = 1 << 30


def wants_plan(resolved: dict[str, Any]) -> bool:
    """Whether ``actor_train``'s (or the ``strategy`` group's) ``strategy_config`` is ``auto``."""
    return bool(_auto_places(resolved))


def _auto_places(resolved: dict[str, Any]) -> list[str]:
    places = []
    if (resolved.get("strategy") or {}).get("strategy_config") == AUTO:
        places.append("strategy")
    args = (resolved.get("actor_train") or {}).get("strategy_args") or {}
    if args.get("strategy_config") == AUTO:
        places.append("actor_train")
    return places


def strategy_block(plan: Plan) -> dict[str, Any]:
    """The plan's layout as ROLL's Megatron ``strategy_config`` keys."""
    lay = plan.layout
    block: dict[str, Any] = {
        "tensor_model_parallel_size": lay.tp,
        "pipeline_model_parallel_size": lay.pp,
        "context_parallel_size": lay.cp,
        "sequence_parallel": lay.sequence_parallel,
        "use_distributed_optimizer": lay.distributed_optimizer,
    }
    if lay.recompute != "none":
        block["recompute_granularity"] = lay.recompute
    return block


def device_memory_gib(ranks: int) -> float:
    """Memory per training device: the first GPU's, else this machine's over ``ranks``."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GIB
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB / ranks


def planned(resolved: dict[str, Any]) -> tuple[dict[str, Any], list[Plan]]:
    """``resolved`` with ``strategy_config: auto`` replaced by the planner's winner, and
    the kept plans, best first.

    Raises:
        ConfigError: When the strategy is not Megatron's, or no layout fits.
    """
    # builds the tiny model when no pretrain is given (torch): only with strategy_config=auto
    from agentgym.builders.model import model_path

    places = _auto_places(resolved)
    draft = copy.deepcopy(resolved)
    _set_block(draft, {}, places)
    config = validate(draft)
    name = config.actor_train.strategy_args.strategy_name
    if name != "megatron_train":
        raise ConfigError(
            f"actor_train.strategy_args.strategy_config=auto plans Megatron layouts; the "
            f"strategy is {name!r}: set strategy=megatron (strategy_name megatron_train)"
        )
    ranks = config.data_parallel["actor_train"]  # no model parallelism yet: every rank a replica
    args = config.actor_train.training_args
    mini_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * ranks
    shape = load_shape(str(model_path(config)))
    per_node = config.num_gpus_per_node or ranks
    devices = Devices(ranks, device_memory_gib(ranks), min(per_node, ranks))
    work = Workload(
        seq_len=config.sequence_length,
        rollout_batch_size=config.rollout_batch_size,
        mini_batch_size=mini_batch,
        dtype=config.actor_train.model_args.dtype,
        colocated=config.colocated,
        infer_tp=config.actor_infer.num_gpus_per_worker,
    )
    plans = search(shape, devices, work)
    kept = [plan for plan in plans if not plan.refused]
    if not kept:
        why = "; ".join(plans[0].refused) if plans else "no layout divides the ranks"
        raise ConfigError(
            f"actor_train.strategy_args.strategy_config=auto: no layout of {shape.name} fits "
            f"{ranks} × {devices.memory_gib:.1f} GiB at sequence_length="
            f"{config.sequence_length} and a mini-batch of {mini_batch} ({why}); add "
            "devices, or shorten the sequence or the mini-batch (agentgym plan lists them)"
        )
    winner = kept[0]
    _set_block(draft, strategy_block(winner), places)
    training = draft["actor_train"].setdefault("training_args", {})
    training["per_device_train_batch_size"] = winner.layout.micro_batch_size
    training["gradient_accumulation_steps"] = winner.gradient_accumulation_steps
    return draft, kept


def _set_block(draft: dict[str, Any], block: dict[str, Any], places: list[str]) -> None:
    if "strategy" in places:
        draft["strategy"]["strategy_config"] = dict(block)
    args = draft.setdefault("actor_train", {}).setdefault("strategy_args", {})
    args["strategy_config"] = dict(block)
