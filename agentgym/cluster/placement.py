"""Where each worker runs: ROLL's ``device_mapping`` turned into (node, device) slots.

Pure functions, no Ray: the plan is computed and checked before any process
starts, so a mapping the cluster cannot hold fails in a second with the numbers.

Devices are numbered globally and contiguously, node by node: global device
``g`` is device ``g % devices_per_node`` of node ``g // devices_per_node``
(ROLL's rule). With ``num_gpus_per_node > 0`` a device is a GPU; with
``num_gpus_per_node = 0`` it is a CPU slot, and each node holds
``ceil(devices / num_nodes)`` of them, so the same config runs on CPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agentgym.errors import ConfigError


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


DEVICE_ROLES = ("actor_train", "actor_infer", "reference", "critic")
"""Roles that take devices through ``device_mapping``."""


@dataclass(frozen=True)
class WorkerSpec:
    """How :meth:`~agentgym.cluster.Cluster.spawn` runs one worker.

    Attributes:
        name: The worker's name in messages (``env_worker[2]``).
        node: The node rank.
        visible_devices: The worker's device slots on its node, comma-separated (its
            ``CUDA_VISIBLE_DEVICES`` names those of the node's own GPUs:
            :func:`~agentgym.cluster.ray_cluster.physical_devices`); None: not set.
        gpu: Whether the worker uses GPUs (Ray: a GPU share).
        concurrency: Calls served at once (threads, or asyncio tasks).
        restarts: Restarts after the worker's process dies (-1: always; Ray only).
    """

    name: str
    node: int = 0
    visible_devices: str | None = None
    gpu: bool = False
    concurrency: int = 1
    restarts: int = 0


@dataclass(frozen=True)
class Slot:
    """One device a worker owns: the node's rank and the device's index on that node."""

    node: int
    device: int


@dataclass(frozen=True)
class WorkerPlacement:
    """Where one worker of a role runs.

    Attributes:
        role: The role (``actor_train``, ``actor_infer``, ...).
        rank: The worker's rank within its role.
        slots: Its devices (one per trainer rank; ``num_gpus_per_worker`` per engine),
            all on one node.
        gpu: Whether the slots are GPUs (else CPU slots).
    """

    role: str
    rank: int
    slots: tuple[Slot, ...]
    gpu: bool

    @property
    def node(self) -> int:
        """The node the worker runs on."""
        return self.slots[0].node

    @property
    def visible_devices(self) -> str:
        """The worker's device slots on its node, comma-separated (its
        ``CUDA_VISIBLE_DEVICES`` names those of the node's own GPUs:
        :func:`~agentgym.cluster.ray_cluster.physical_devices`)."""
        return ",".join(str(slot.device) for slot in self.slots)

    def spec(self) -> WorkerSpec:
        """How to spawn the worker: named ``role[rank]``, on its node and devices (GPUs only)."""
        devices = self.visible_devices if self.gpu else None
        return WorkerSpec(f"{self.role}[{self.rank}]", self.node, devices, self.gpu)


@dataclass(frozen=True)
class PlacementPlan:
    """Every device role's workers, and the cluster's shape they assume.

    Attributes:
        num_nodes: Nodes used.
        devices_per_node: GPUs (or CPU slots) per node.
        gpu: Whether devices are GPUs.
        workers: Role -> its workers in rank order.
    """

    num_nodes: int
    devices_per_node: int
    gpu: bool
    workers: Mapping[str, tuple[WorkerPlacement, ...]]

    def world_size(self, role: str) -> int:
        """Workers of ``role`` (0 when the role has no devices)."""
        return len(self.workers.get(role, ()))


def plan_placement(
    mappings: Mapping[str, Sequence[int] | None],
    *,
    num_nodes: int,
    num_gpus_per_node: int,
    devices_per_worker: Mapping[str, int] | None = None,
) -> PlacementPlan:
    """Check the roles' device mappings and give each worker its slots.

    Args:
        mappings: Role -> its ``device_mapping`` (global device ranks); None or
            empty: the role has no devices of its own.
        num_nodes: Nodes of the cluster.
        num_gpus_per_node: GPUs per node; 0 places every device on CPU slots.
        devices_per_worker: Role -> devices per worker (``num_gpus_per_worker``
            of ``actor_infer``); 1 when not given.

    Raises:
        ConfigError: Naming the role, its mapping and the numbers: a negative
            or repeated rank, more devices than ``num_nodes × num_gpus_per_node``,
            a worker split across nodes, or ``num_gpus_per_worker`` that does not
            divide the mapping.

    Roles may share devices (ROLL's colocation: ``actor_train`` and ``actor_infer``
    on the same GPUs, the critic on the trainer's); shared devices are shared as
    they are, with no offload between phases.
    """
    used = {role: list(m) for role, m in mappings.items() if m}
    per_worker = dict(devices_per_worker or {})
    for role, ranks in used.items():
        if min(ranks) < 0:
            raise ConfigError(f"{role}.device_mapping={ranks} has a negative device rank")
        repeated = sorted({r for r in ranks if ranks.count(r) > 1})
        if repeated:
            raise ConfigError(
                f"{role}.device_mapping={ranks} names device(s) {repeated} more than once; "
                "each rank of a role needs its own device"
            )
        size = per_worker.get(role, 1)
        if len(ranks) % size:
            raise ConfigError(
                f"{role}.device_mapping has {len(ranks)} devices, not a multiple of "
                f"num_gpus_per_worker={size}"
            )
    gpu = num_gpus_per_node > 0
    highest = max((max(ranks) for ranks in used.values()), default=0)
    if gpu:
        per_node = num_gpus_per_node
        if highest >= num_nodes * per_node:
            role = next(r for r, ranks in used.items() if max(ranks) == highest)
            raise ConfigError(
                f"{role}.device_mapping={used[role]} uses device {highest}, but the cluster has "
                f"num_nodes × num_gpus_per_node = {num_nodes} × {per_node} = "
                f"{num_nodes * per_node} devices (ranks 0..{num_nodes * per_node - 1})"
            )
    else:
        per_node = max(1, math.ceil((highest + 1) / num_nodes))
    workers: dict[str, tuple[WorkerPlacement, ...]] = {}
    for role, ranks in used.items():
        size = per_worker.get(role, 1)
        placed = []
        for rank, start in enumerate(range(0, len(ranks), size)):
            slots = tuple(Slot(g // per_node, g % per_node) for g in ranks[start : start + size])
            if len({slot.node for slot in slots}) > 1:
                raise ConfigError(
                    f"{role} worker {rank} would span nodes {sorted({s.node for s in slots})} "
                    f"(devices {ranks[start : start + size]} with {per_node} devices per node); "
                    "one worker's devices must sit on one node"
                )
            placed.append(WorkerPlacement(role, rank, slots, gpu))
        workers[role] = tuple(placed)
    return PlacementPlan(num_nodes, per_node, gpu, workers)


def spread(count: int, num_nodes: int) -> list[int]:
    """Nodes for ``count`` CPU-only workers (env workers): round-robin from node 0."""
    return [index % num_nodes for index in range(count)]
