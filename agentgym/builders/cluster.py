"""The cluster the roles run on (this process, or Ray), and the process environment its
workers inherit."""

from __future__ import annotations

import os

from agentgym.cluster import Cluster, start_cluster
from agentgym.schema import TrainConfig


def build_cluster(config: TrainConfig) -> Cluster:
    """The local process or the Ray cluster the roles run on (``distributed``)."""
    return start_cluster(
        config.distributed,
        address=config.ray_address,
        num_nodes=config.num_nodes,
        num_gpus_per_node=config.num_gpus_per_node,
        env_vars=config.system_envs,
        rpc_timeout=config.rpc_timeout,
    )


def apply_system_envs(config: TrainConfig) -> None:
    """Set ``system_envs`` in this process's environment (its workers inherit them)."""
    os.environ.update({key: str(value) for key, value in config.system_envs.items()})
