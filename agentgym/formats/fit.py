"""Fitting a translated config to the machine it runs on, as one named step.

A file written for a GPU cluster (ROLL's examples ask for 8 GPUs, Megatron with
tensor parallelism, flash attention) runs on a CPU machine after a few changes:
its GPU placement becomes one CPU process, ``megatron_train`` runs on one rank
(or as the torch strategy where megatron-core is missing or the role trains a LoRA
adapter), flash attention
becomes SDPA. :func:`fit_to_machine` makes exactly those changes, returns each
as a :class:`Change` (printed as a table at the start of the run), and with
``fit_to_machine: false`` in the config refuses them all, naming each.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentgym.errors import ConfigError

DEVICE_ROLES = ("actor_train", "actor_infer", "reference", "critic")
"""The roles whose ``device_mapping`` places them on GPUs."""

ONE_RANK = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "context_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "sequence_parallel": False,
}
"""The Megatron ``strategy_config`` of one process: every parallel size 1."""


@dataclass(frozen=True)
class Machine:
    """What this machine offers that a config may ask for.

    Attributes:
        cuda: torch sees a CUDA device.
        megatron: megatron-core is installed.
        flash_attn: flash-attn is installed (and usable: with CUDA).
    """

    cuda: bool
    megatron: bool
    flash_attn: bool

    @classmethod
    def detect(cls) -> Machine:
        """This machine."""
        import torch

        cuda = torch.cuda.is_available()
        return cls(
            cuda=cuda,
            megatron=importlib.util.find_spec("megatron") is not None,
            flash_attn=cuda and importlib.util.find_spec("flash_attn") is not None,
        )


@dataclass(frozen=True)
class Change:
    """One key the fitting changed: its value as written, here, and why."""

    key: str
    written: Any
    fitted: Any
    why: str


@dataclass(frozen=True)
class Fitting:
    """The fitted config and what changed."""

    config: dict[str, Any]
    changes: list[Change]

    def table(self) -> str:
        """The changes as an aligned table (empty when nothing changed)."""
        if not self.changes:
            return ""
        rows = [("key", "as written", "here", "why")] + [
            (c.key, _show(c.written), _show(c.fitted), c.why) for c in self.changes
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        lines = [
            "machine fitting (fit_to_machine=false refuses these):",
            *(
                "  "
                + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
                + "  "
                + row[3]
                for row in rows
            ),
        ]
        return "\n".join(line.rstrip() for line in lines)


def fit_to_machine(raw: Mapping[str, Any], machine: Machine | None = None) -> Fitting:
    """Fit ``raw`` (a translated config, plain data) to ``machine`` (default: this one).

    On a machine without CUDA, with ``distributed`` left ``local``: the GPU
    placement becomes one CPU process (``num_gpus_per_node`` → 0, every role's
    ``device_mapping`` dropped) and ``megatron_train`` one rank (its parallel
    sizes 1; the torch strategy where megatron-core is missing or the role trains a
    LoRA adapter), and float16 bfloat16. Flash attention
    becomes SDPA (the same attention, computed by torch) where flash-attn cannot run.
    Where the roles are placed on GPUs (CUDA here, or ``distributed: ray``),
    ``model.device`` becomes cuda.

    Raises:
        ConfigError: With ``fit_to_machine: false`` in ``raw`` and anything to change,
            naming every change.
    """
    machine = machine or Machine.detect()
    data = copy.deepcopy(dict(raw))
    changes: list[Change] = []
    if data.get("distributed", "local") == "local" and not machine.cuda:
        _one_cpu_process(data, changes)
        _no_float16(data, changes)
        for role in ("actor_train", "critic"):
            strategy = (data.get(role) or {}).get("strategy_args") or {}
            if strategy.get("strategy_name") == "megatron_train":
                lora = ((data.get(role) or {}).get("model_args") or {}).get("lora_target")
                _one_megatron_rank(role, strategy, machine, changes, lora=lora is not None)
    if data.get("fit_to_machine", True) is not False:  # runnable as written: on the CPU
        _train_where_placed(data, machine, changes)
    if not machine.flash_attn:
        for role in DEVICE_ROLES:
            model_args = (data.get(role) or {}).get("model_args") or {}
            if model_args.get("attn_implementation") == "flash_attention_2":
                model_args["attn_implementation"] = "sdpa"
                changes.append(
                    Change(
                        f"{role}.model_args.attn_implementation",
                        "flash_attention_2",
                        "sdpa",
                        "flash-attn cannot run here (no CUDA or not installed); SDPA is "
                        "the same attention",
                    )
                )
    if changes and data.get("fit_to_machine", True) is False:
        listed = "; ".join(f"{c.key}={_show(c.written)} ({c.why})" for c in changes)
        raise ConfigError(
            f"fit_to_machine=false, and this machine cannot run the config as written: "
            f"{listed}. Change these keys yourself, or drop fit_to_machine=false to have "
            "them fitted"
        )
    return Fitting(data, changes)


def _one_cpu_process(data: dict[str, Any], changes: list[Change]) -> None:
    why = "torch sees no CUDA device: the run is one CPU process (distributed=local)"
    if data.get("num_gpus_per_node"):
        changes.append(Change("num_gpus_per_node", data["num_gpus_per_node"], 0, why))
        data["num_gpus_per_node"] = 0
    for role in DEVICE_ROLES:
        section = data.get(role)
        if isinstance(section, dict) and section.get("device_mapping") is not None:
            written = section.pop("device_mapping")
            changes.append(Change(f"{role}.device_mapping", written, None, why))


def _no_float16(data: dict[str, Any], changes: list[Change]) -> None:
    why = (
        "float16 trains with loss scaling on GPUs (megatron_train refuses it); on this CPU "
        "bfloat16 is the half-width type"
    )
    for role in DEVICE_ROLES:
        model_args = (data.get(role) or {}).get("model_args") or {}
        if model_args.get("dtype") in ("fp16", "float16"):
            changes.append(Change(f"{role}.model_args.dtype", model_args["dtype"], "bf16", why))
            model_args["dtype"] = "bf16"


def _train_where_placed(data: dict[str, Any], machine: Machine, changes: list[Change]) -> None:
    """Roles placed on GPUs (``num_gpus_per_node`` > 0, where there are GPUs: CUDA here,
    or Ray's nodes) train and generate on them: ``model.device`` cuda. ROLL's files have
    no such key, and the default, cpu, would leave the GPUs idle."""
    gpus = data.get("num_gpus_per_node")
    ray = data.get("distributed", "local") == "ray"
    if not gpus or not (machine.cuda or ray):
        return
    model = data.setdefault("model", {})
    if str(model.get("device", "cpu")) == "cpu":
        model["device"] = "cuda"
        why = f"num_gpus_per_node={gpus} places the roles on GPUs: they train and generate there"
        changes.append(Change("model.device", "cpu", "cuda", why))


def _one_megatron_rank(
    role: str, strategy: dict[str, Any], machine: Machine, changes: list[Change], *, lora: bool
) -> None:
    config = strategy.get("strategy_config") or {}
    if not machine.megatron or lora:
        why = (
            "one CPU process is one rank, and the torch strategy trains LoRA adapters "
            "(megatron_train does not)"
            if lora
            else "megatron-core is not installed (pip install 'agentgym[megatron]')"
        )
        strategy.update(strategy_name="torch", strategy_config={})
        changes.append(
            Change(
                f"{role}.strategy_args.strategy_name",
                "megatron_train",
                "torch",
                f"{why}; strategy_config {config} dropped",
            )
        )
        return
    if config == "auto":  # the planner fits the layout to this process's one rank
        return
    for key, value in ONE_RANK.items():
        one = 1 if value is None else value
        if config.get(key, value) not in (value, one):
            changes.append(
                Change(
                    f"{role}.strategy_args.strategy_config.{key}",
                    config[key],
                    value,
                    "one CPU process is one Megatron rank",
                )
            )
            config[key] = value


def _show(value: Any) -> str:
    return "(none)" if value is None else str(value)
