"""Ray: start or join a cluster, one placement group per node, actors behind handles.

The only module that imports ``ray``. Nodes are ranked head first, then by IP
address and node id, and placement group ``i`` is pinned to node ``i`` by its
node-id label, so device ranks are contiguous and the same on every start
(the order of placement groups never depends on which became ready first).
Every actor asks for a small CPU share (and a GPU share on GPU nodes): Ray
enforces placement only for actors that request resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from agentgym.cluster.handles import RpcTimeoutError, WorkerDiedError, WorkerError
from agentgym.cluster.placement import WorkerSpec
from agentgym.errors import ConfigError

logger = logging.getLogger(__name__)

NODE_BUNDLE_CPUS = 1.0
"""CPUs each node's placement group reserves; the actors placed there share them."""

ACTOR_CPUS = 0.01
"""CPU share each actor requests: non-zero so Ray honours its placement, small so
that many actors fit a 2-core node."""


def physical_devices(slots: str, visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for device ``slots`` (node-local indices, comma-separated)
    on a node whose own list is ``visible`` (its raylet's ``CUDA_VISIBLE_DEVICES``:
    SLURM or a shared machine may give the job GPUs 4-7 only; None: every GPU, in order).

    Raises:
        RuntimeError: A slot past the node's list.
    """
    if visible is None:
        return slots
    names = [name.strip() for name in visible.split(",") if name.strip()]
    picked = []
    for slot in (int(s) for s in slots.split(",")):
        if slot >= len(names):
            raise RuntimeError(
                f"device slot {slot} is placed on a node whose CUDA_VISIBLE_DEVICES={visible!r} "
                f"names {len(names)} device(s): lower num_gpus_per_node to what each node has"
            )
        picked.append(names[slot])
    return ",".join(picked)


def visible_here() -> str | None:
    """This process's ``CUDA_VISIBLE_DEVICES`` (run as a task on a node, with Ray told to
    leave it alone: the node's own list, which its raylet was started with)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""With this, a Ray instance started here binds to 127.0.0.1 (not the external interface)."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:  # pragma: no cover - ray is a core dependency
        raise ImportError("distributed=ray needs Ray: pip install 'ray>=2.40'") from error
    return ray


def _init_keeping_sigterm(ray: Any, **kwargs: Any) -> None:
    """``ray.init(**kwargs)``, keeping the SIGTERM handler the program installed: Ray's
    own (``sys.exit``) would skip the run's stop line and watchdog
    (:mod:`agentgym.stopping`); a default handler is left to Ray."""
    handler = signal.getsignal(signal.SIGTERM)
    ray.init(**kwargs)
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


class RayHandle:
    """A Ray actor behind the :class:`~agentgym.cluster.handles.WorkerHandle` interface.

    Args:
        actor: The actor handle.
        name: The worker's name in messages.
        node: The node rank it was placed on.
        rpc_timeout: Default seconds a call may take.
    """

    def __init__(self, actor: Any, *, name: str, node: int, rpc_timeout: float | None) -> None:
        self.actor = actor
        self.name = name
        self.node = node
        self.rpc_timeout = rpc_timeout

    def _submit(self, method: str, args: Any, kwargs: Any) -> Any:
        return getattr(self.actor, method).remote(*args, **kwargs)

    def _translate(self, method: str, error: BaseException, limit: float | None) -> BaseException:
        """The error a caller sees: a named timeout or death, or the method's own exception."""
        ray = _import_ray()
        if isinstance(error, TimeoutError | asyncio.TimeoutError | ray.exceptions.GetTimeoutError):
            return RpcTimeoutError(
                f"{self.name}.{method} did not answer within rpc_timeout={limit} s"
            )
        if isinstance(error, ray.exceptions.RayActorError | ray.exceptions.WorkerCrashedError):
            return WorkerDiedError(f"{self.name}.{method}: the worker died ({error})")
        if isinstance(error, ray.exceptions.RayTaskError):
            cause = error.as_instanceof_cause()
            return cause if isinstance(cause, BaseException) else WorkerError(str(error))
        return error

    async def call(
        self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Call ``method`` on the actor; the method's own exception type is re-raised."""
        limit = timeout if timeout is not None else self.rpc_timeout
        try:
            ref = self._submit(method, args, kwargs)
            return await asyncio.wait_for(asyncio.wrap_future(ref.future()), limit)
        except Exception as error:
            translated = self._translate(method, error, limit)
            if translated is error:
                raise
            raise translated from error

    def call_sync(
        self, method: str, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """:meth:`call` from synchronous code."""
        ray = _import_ray()
        limit = timeout if timeout is not None else self.rpc_timeout
        try:
            return ray.get(self._submit(method, args, kwargs), timeout=limit)
        except Exception as error:
            translated = self._translate(method, error, limit)
            if translated is error:
                raise
            raise translated from error

    def kill(self) -> None:
        """Kill the actor (no restart)."""
        ray = _import_ray()
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)


class RayCluster:
    """A Ray instance this driver started or joined, with a placement group per node.

    Args:
        address: A cluster to join (``ray_address``); None: ``RAY_ADDRESS`` if set,
            else start a local instance on loopback.
        num_nodes: Nodes to use (the first ``num_nodes`` in rank order).
        num_gpus_per_node: GPUs reserved per node (0: CPU only).
        env_vars: Environment variables of every worker (``system_envs``).
        rpc_timeout: Default seconds a call to an actor may take.
        num_cpus: Logical CPUs of a local instance (None: the machine's count).

    Raises:
        ConfigError: If the cluster has fewer nodes than ``num_nodes`` or a node
            has fewer GPUs than ``num_gpus_per_node`` (naming the numbers).
    """

    kind = "ray"

    def __init__(
        self,
        *,
        address: str | None = None,
        num_nodes: int = 1,
        num_gpus_per_node: int = 0,
        env_vars: Mapping[str, str] | None = None,
        rpc_timeout: float | None = None,
        num_cpus: int | None = None,
    ) -> None:
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address is None:  # read when ray is imported: set it first
            os.environ.update(LOOPBACK_ENV)
        ray = _import_ray()
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.rpc_timeout = rpc_timeout
        self.num_gpus_per_node = num_gpus_per_node
        self.num_nodes = num_nodes
        self.started = False
        if not ray.is_initialized():
            _init_keeping_sigterm(
                ray,
                address=address,
                num_cpus=num_cpus if address is None else None,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                runtime_env={"env_vars": self.env_vars} if self.env_vars else None,
            )
            self.started = True
        try:  # a Ray this driver started is stopped on every way out of here
            self._place(ray)
        except BaseException:
            self.shutdown()
            raise
        self.handles: list[RayHandle] = []
        self._node_devices: dict[int, str | None] = {}

    def _place(self, ray: Any) -> None:
        """Rank the nodes and wait for one placement group per node.

        Raises:
            ConfigError: Too few nodes, or the placement groups were not ready in 60 s.
        """
        self.nodes = self._ranked_nodes(ray, self.num_nodes, self.num_gpus_per_node)
        self.placement_groups = [self._node_group(ray, node) for node in self.nodes]
        started = time.perf_counter()
        pending = [pg.ready() for pg in self.placement_groups]
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=60)
        if len(ready) < len(pending):
            raise ConfigError(
                f"only {len(ready)} of {len(pending)} node placement groups were ready after "
                f"{time.perf_counter() - started:.0f} s: each node needs {NODE_BUNDLE_CPUS} "
                f"CPU and num_gpus_per_node={self.num_gpus_per_node} GPUs free"
            )

    @staticmethod
    def _ranked_nodes(ray: Any, num_nodes: int, num_gpus_per_node: int) -> list[dict[str, Any]]:
        alive = [node for node in ray.nodes() if node.get("Alive")]
        ranked = sorted(
            alive,
            key=lambda n: (
                "node:__internal_head__" not in n["Resources"],
                n["NodeManagerAddress"],
                n["NodeID"],
            ),
        )
        usable = [n for n in ranked if n["Resources"].get("GPU", 0) >= num_gpus_per_node]
        if len(usable) < num_nodes:
            raise ConfigError(
                f"num_nodes={num_nodes} with num_gpus_per_node={num_gpus_per_node}: the Ray "
                f"cluster has {len(alive)} node(s), {len(usable)} of them with at least "
                f"{num_gpus_per_node} GPU(s) (GPUs per node: "
                f"{[int(n['Resources'].get('GPU', 0)) for n in ranked]})"
            )
        return usable[:num_nodes]

    def _node_group(self, ray: Any, node: Mapping[str, Any]) -> Any:
        from ray.util.placement_group import placement_group

        bundle: dict[str, float] = {"CPU": NODE_BUNDLE_CPUS}
        if self.num_gpus_per_node:
            bundle["GPU"] = float(self.num_gpus_per_node)
        return placement_group(
            [bundle],
            strategy="STRICT_PACK",
            bundle_label_selector=[{"ray.io/node-id": node["NodeID"]}],
        )

    def spawn(self, spec: WorkerSpec, cls: type, *args: Any, **kwargs: Any) -> RayHandle:
        """Start ``cls(*args, **kwargs)`` as an actor on node ``spec.node`` (an index into
        the ranked nodes). ``cls`` is an ordinary class; async methods make an async actor.
        """
        ray = _import_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        env_vars = dict(self.env_vars)
        if spec.visible_devices is not None:
            node_list = self.node_devices(spec.node)
            env_vars["CUDA_VISIBLE_DEVICES"] = physical_devices(spec.visible_devices, node_list)
            env_vars["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
        options: dict[str, Any] = {
            "num_cpus": ACTOR_CPUS,
            "num_gpus": ACTOR_CPUS if spec.gpu else 0,
            "max_concurrency": spec.concurrency,
            "max_restarts": spec.restarts,
            "max_task_retries": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.placement_groups[spec.node], placement_group_bundle_index=0
            ),
            "runtime_env": {"env_vars": env_vars},
        }
        actor = ray.remote(cls).options(**options).remote(*args, **kwargs)
        handle = RayHandle(actor, name=spec.name, node=spec.node, rpc_timeout=self.rpc_timeout)
        self.handles.append(handle)
        return handle

    def node_devices(self, node: int) -> str | None:
        """Node ``node``'s own ``CUDA_VISIBLE_DEVICES`` (None: unset, every GPU), read
        once by a task there."""
        if node not in self._node_devices:
            ray = _import_ray()
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            probe = ray.remote(visible_here).options(
                num_cpus=ACTOR_CPUS,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_groups[node], placement_group_bundle_index=0
                ),
                runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}},
            )
            self._node_devices[node] = ray.get(probe.remote(), timeout=self.rpc_timeout or 120)
        return self._node_devices[node]

    def node_address(self, node: int) -> str:
        """The IP address Ray reports for node ``node``."""
        return str(self.nodes[node]["NodeManagerAddress"])

    def share(self, value: Any) -> Any:
        """``value`` put in the object store once: an actor call given the reference
        receives the value (one copy per node, not one per call)."""
        return _import_ray().put(value)

    def shutdown(self) -> None:
        """Kill every actor started here, free the placement groups, and stop Ray if
        this driver started it."""
        ray = _import_ray()
        from ray.util.placement_group import remove_placement_group

        for handle in getattr(self, "handles", []):
            handle.kill()
        for group in getattr(self, "placement_groups", []):
            with contextlib.suppress(Exception):
                remove_placement_group(group)
        if self.started and ray.is_initialized():
            ray.shutdown()
