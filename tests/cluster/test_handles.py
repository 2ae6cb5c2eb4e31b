"""Worker handles on a local Ray instance and in-process: results, the method's own
errors, rpc_timeout naming the worker and the method, a dead worker, system_envs."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import pytest

from agentgym.cluster import (
    Cluster,
    LocalCluster,
    RpcTimeoutError,
    WorkerDiedError,
    WorkerSpec,
    start_cluster,
)
from tests.faults import kill_actor_process


class Probe:
    def __init__(self, value: int) -> None:
        self.value = value

    def read(self, name: str) -> tuple[int, int, str | None]:
        return self.value, os.getpid(), os.environ.get(name)

    def fail(self) -> None:
        raise KeyError("no such key")

    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return "awake"

    async def twice(self, x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x


NODE_GPUS = "4,5,6,7"
"""The node's own CUDA_VISIBLE_DEVICES (as SLURM gives a job GPUs 4-7): its raylet,
started here, inherits it, and so do the actors' processes."""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    with pytest.MonkeyPatch.context() as patch:  # only while the raylet starts
        patch.setenv("CUDA_VISIBLE_DEVICES", NODE_GPUS)
        cluster = start_cluster(
            "ray", env_vars={"AGENTGYM_PROBE": "from system_envs"}, rpc_timeout=60
        )
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.ray
def test_an_actor_runs_in_its_own_process_with_system_envs_and_devices(
    ray_cluster: Cluster,
) -> None:
    handle = ray_cluster.spawn(WorkerSpec("probe[0]", 0, visible_devices="1,3"), Probe, 7)
    value, pid, probe = handle.call_sync("read", "AGENTGYM_PROBE")
    assert (value, probe) == (7, "from system_envs")
    assert pid != os.getpid()
    # slots 1 and 3 of the node's own GPUs (4, 5, 6, 7), not physical GPUs 1 and 3
    assert handle.call_sync("read", "CUDA_VISIBLE_DEVICES")[2] == "5,7"
    plain = ray_cluster.spawn(WorkerSpec("probe[1]", 0), Probe, 7)
    assert plain.call_sync("read", "CUDA_VISIBLE_DEVICES")[2] == NODE_GPUS  # untouched


def test_device_slots_map_through_the_nodes_own_list() -> None:
    from agentgym.cluster.ray_cluster import physical_devices

    assert physical_devices("0,1", None) == "0,1"  # every GPU, in order
    assert physical_devices("0,2", "4, 5,6") == "4,6"
    assert physical_devices("1", "GPU-uuid-a,GPU-uuid-b") == "GPU-uuid-b"
    with pytest.raises(RuntimeError, match="names 2 device"):
        physical_devices("2", "4,5")


@pytest.mark.ray
def test_errors_keep_their_type_and_timeouts_name_the_worker(ray_cluster: Cluster) -> None:
    handle = ray_cluster.spawn(WorkerSpec("actor_infer[2]", 0, concurrency=2), Probe, 1)
    with pytest.raises(KeyError, match="no such key"):
        handle.call_sync("fail")
    with pytest.raises(RpcTimeoutError, match=r"actor_infer\[2\]\.sleep did not answer within"):
        asyncio.run(handle.call("sleep", 3, timeout=1))
    assert asyncio.run(handle.call("twice", 4)) == 8


@pytest.mark.ray
def test_a_killed_actor_gives_a_named_error(ray_cluster: Cluster) -> None:
    handle = ray_cluster.spawn(WorkerSpec("actor_train[1]", 0), Probe, 1)
    kill_actor_process(handle)
    with pytest.raises(WorkerDiedError, match=r"actor_train\[1\]\.read: the worker died"):
        handle.call_sync("read", "X")


def test_a_local_handle_runs_the_same_class_here() -> None:
    cluster = LocalCluster(rpc_timeout=1)
    handle = cluster.spawn(WorkerSpec("probe[0]"), Probe, 5)
    assert handle.call_sync("read", "HOME")[:2] == (5, os.getpid())
    with pytest.raises(RpcTimeoutError, match=r"probe\[0\]\.sleep did not answer within"):
        asyncio.run(handle.call("sleep", 3))
    assert asyncio.run(handle.call("twice", 2)) == 4
    with pytest.raises(ValueError, match="a local cluster has one node"):
        cluster.spawn(WorkerSpec("far", 1), Probe, 1)
    cluster.shutdown()
