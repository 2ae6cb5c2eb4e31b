"""Where workers run: in this process (``distributed: local``) or on Ray (``distributed: ray``).

A :class:`Cluster` spawns worker objects and returns :class:`WorkerHandle`\\ s;
the driver's code is the same for both kinds. Ray is imported only by
:mod:`agentgym.cluster.ray_cluster`, and only when a Ray cluster is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from agentgym.cluster.handles import (
    LocalHandle,
    RpcTimeoutError,
    WorkerDiedError,
    WorkerError,
    WorkerHandle,
    call_all,
)
from agentgym.cluster.placement import (
    PlacementPlan,
    Slot,
    WorkerPlacement,
    WorkerSpec,
    device_type,
    plan_placement,
)
from agentgym.errors import ConfigError, check_choice

__all__ = [
    "DISTRIBUTED",
    "Cluster",
    "LocalCluster",
    "LocalHandle",
    "PlacementPlan",
    "RpcTimeoutError",
    "Slot",
    "WorkerDiedError",
    "WorkerError",
    "WorkerHandle",
    "WorkerPlacement",
    "WorkerSpec",
    "call_all",
    "device_type",
    "plan_placement",
    "start_cluster",
]

DISTRIBUTED = ("local", "ray")
"""Values of the ``distributed`` key."""


class Cluster(Protocol):
    """Starts workers and stops them all.

    Attributes:
        kind: ``"local"`` or ``"ray"``.
        num_nodes: Nodes workers may be placed on.
    """

    kind: str
    num_nodes: int

    def spawn(self, spec: WorkerSpec, cls: type, *args: Any, **kwargs: Any) -> WorkerHandle:
        """Start ``cls(*args, **kwargs)`` as ``spec`` says and return its handle."""
        ...

    def node_address(self, node: int) -> str:
        """The IP address of node ``node`` (where a process group's rank 0 listens)."""
        ...

    def share(self, value: Any) -> Any:
        """``value`` in a form many workers can take as an argument without a copy per
        call (Ray: an object-store reference; locally: the value itself)."""
        ...

    def shutdown(self) -> None:
        """Stop every worker this cluster started."""
        ...


class LocalCluster:
    """Workers are objects in this process behind :class:`LocalHandle`\\ s (one node).

    Args:
        rpc_timeout: Default seconds a call may take.
    """

    kind = "local"
    num_nodes = 1

    def __init__(self, *, rpc_timeout: float | None = None) -> None:
        self.rpc_timeout = rpc_timeout
        self.handles: list[LocalHandle] = []

    def spawn(self, spec: WorkerSpec, cls: type, *args: Any, **kwargs: Any) -> LocalHandle:
        """Build ``cls(*args, **kwargs)`` here (``spec.visible_devices`` and
        ``spec.restarts`` do not apply)."""
        if spec.node != 0:
            raise ValueError(f"{spec.name}: a local cluster has one node (0), not node {spec.node}")
        worker = cls(*args, **kwargs)
        handle = LocalHandle(
            worker, name=spec.name, rpc_timeout=self.rpc_timeout, concurrency=spec.concurrency
        )
        self.handles.append(handle)
        return handle

    def node_address(self, node: int) -> str:
        """Loopback: every worker is in this process."""
        return "127.0.0.1"

    def share(self, value: Any) -> Any:
        """The value itself: local workers take it by reference."""
        return value

    def shutdown(self) -> None:
        """Close every worker."""
        for handle in self.handles:
            handle.kill()
        self.handles.clear()


def start_cluster(
    distributed: str,
    *,
    address: str | None = None,
    num_nodes: int = 1,
    num_gpus_per_node: int = 0,
    env_vars: Mapping[str, str] | None = None,
    rpc_timeout: float | None = None,
) -> Cluster:
    """A :class:`LocalCluster`, or a Ray cluster started here or joined at ``address``.

    Raises:
        ConfigError: On an unknown ``distributed`` value, or a Ray cluster that
            cannot hold ``num_nodes`` × ``num_gpus_per_node``.
    """
    check_choice("distributed", distributed, DISTRIBUTED)
    if distributed == "local":
        if num_nodes != 1:
            raise ConfigError(
                f"num_nodes={num_nodes} needs distributed=ray (distributed=local is one process)"
            )
        return LocalCluster(rpc_timeout=rpc_timeout)
    from agentgym.cluster.ray_cluster import RayCluster  # the one module that imports ray

    return RayCluster(
        address=address,
        num_nodes=num_nodes,
        num_gpus_per_node=num_gpus_per_node,
        env_vars=env_vars,
        rpc_timeout=rpc_timeout,
    )
