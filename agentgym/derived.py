"""Values derived from a config, each in one place: the checks (:mod:`agentgym.config_checks`)
and the build floor (:mod:`agentgym.builders`) both read them here, so that neither derives
what the other imports.

Pure functions of :class:`~agentgym.schema.TrainConfig`: no torch (``import
agentgym.schema`` stays light), nothing built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agentgym.cluster import PlacementPlan, plan_placement
from agentgym.config_sections import Role
from agentgym.errors import ConfigError
from agentgym.job.schedule import SyncSchedule
from agentgym.rollout.backends import resolve_backend

if TYPE_CHECKING:
    from agentgym.schema import TrainConfig


def device_mappings(config: TrainConfig) -> dict[str, list[int]]:
    """Each device role's ``device_mapping``, with the defaults filled in: one device
    (rank 0) for ``actor_train`` and for ``actor_infer`` (colocated), the
    reference inside the ``actor_train`` ranks (the torch strategy holds it), and
    GAE's critic on ``actor_train``'s devices unless ``critic.device_mapping`` says."""
    train = config.actor_train.device_mapping or [0]
    infer = config.actor_infer.device_mapping or range(config.actor_infer.num_gpus_per_worker)
    mappings = {"actor_train": list(train), "actor_infer": list(infer)}
    if config.adv_estimator == "gae":
        mappings["critic"] = list(config.critic.device_mapping or train)
    return mappings


def placement_plan(config: TrainConfig) -> PlacementPlan:
    """Where the device roles' workers run: (node, device) slots for each role's
    ``device_mapping`` (:func:`~agentgym.cluster.plan_placement`)."""
    return plan_placement(
        device_mappings(config),
        num_nodes=config.num_nodes,
        num_gpus_per_node=config.num_gpus_per_node,
        devices_per_worker={"actor_infer": config.actor_infer.num_gpus_per_worker},
    )


def colocated(config: TrainConfig) -> bool:
    """Whether the engines share devices with the trainer (one process, or overlapping
    ``device_mapping``s)."""
    mappings = device_mappings(config)
    return config.distributed == "local" or bool(
        set(mappings["actor_train"]) & set(mappings["actor_infer"])
    )


MODEL_PARALLEL_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
)
"""``strategy_config`` keys whose product is a model replica's ranks (ROLL's TP × PP × CP)."""


def data_parallel_size(config: TrainConfig, role: str = "actor_train") -> int:
    """Data-parallel replicas of ``role``: its ranks (one per device of its
    ``device_mapping`` on Ray, one in process) over TP × PP × CP.

    Raises:
        ConfigError: When the ranks do not split into whole replicas.
    """
    mapping = device_mappings(config).get(role)
    if config.distributed == "local" or mapping is None:  # one process, or no such role
        return 1
    section: Role = getattr(config, role)
    world = len(mapping)
    parallel = 1
    for key in MODEL_PARALLEL_KEYS:
        parallel *= int(section.strategy_args.strategy_config.get(key) or 1)
    if world % parallel:
        raise ConfigError(
            f"{role} has {world} ranks (device_mapping), which TP × PP × CP = {parallel} "
            "does not divide into whole model replicas; change the mapping or the parallel sizes"
        )
    return world // parallel


def device_type(device: str) -> str:
    """``cuda`` or ``cpu``: the type of the torch device ``model.device`` names.

    Raises:
        ConfigError: Naming a value torch does not read as a device.
    """
    import torch  # only where a device is named: the schema's import stays without torch

    try:
        return torch.device(device).type
    except RuntimeError as error:
        raise ConfigError(f"model.device={device!r} is not a torch device: {error}") from None


def dual_clip_c(config: TrainConfig) -> float | None:
    """The dual-clip bound ``c``: ``dual_clip_ratio_c`` (verl's ``clip_ratio_c``), or with
    ROLL's ``dual_clip_loss`` ROLL's ``1 + 2 × pg_clip`` (1.4 at the default clip of 0.2)."""
    if config.dual_clip_loss:
        return 1.0 + 2.0 * config.clip_ratio_low
    return config.dual_clip_ratio_c


def backend_name(config: TrainConfig) -> str:
    """The generation backend: ``actor_infer.strategy_args.strategy_name`` (``auto`` resolved)."""
    return resolve_backend(str(config.actor_infer.strategy_args.strategy_name))


def sync_schedule(config: TrainConfig) -> SyncSchedule:
    """The decoupled job's sync schedule (``synchronizer.sync_interval``, ``sync_offset``,
    ``sync_style``)."""
    sync = config.synchronizer
    return SyncSchedule(sync.sync_interval, sync.sync_offset, sync.sync_style)


def staleness_versions(config: TrainConfig) -> float:
    """How many versions behind the weights it updates a trained sample may be in a
    decoupled job: ``async_generation_ratio`` where set, else what the sync schedule
    implies (``sync_interval + sync_offset - 1``: 0 for Trinity-RFT's defaults, where
    the explorer waits for each version)."""
    return config.async_generation_ratio or float(sync_schedule(config).implied_bound)


def job_dir(config: TrainConfig) -> Path:
    """A decoupled job's folder, where its processes meet:
    ``checkpoint_root_dir/project/name`` (``name`` defaults to ``exp_name``)."""
    return (
        Path(config.checkpoint_root_dir).expanduser()
        / config.project
        / (config.name or config.exp_name)
    )


def job_name(config: TrainConfig) -> str:
    """The job's name among a Ray cluster's jobs: ``project/name``."""
    return f"{config.project}/{config.name or config.exp_name}"
