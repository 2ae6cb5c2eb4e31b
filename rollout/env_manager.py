"""Env groups: ``env_groups`` × ``group_size`` envs, one seed per group.

The envs of a group reset with the same seed, so their trajectories form a
GRPO group. Groups are split among tags (env configurations). Seeds come from
the experiment seed and a cursor that only moves forward, so a run resumed
from a checkpoint (which stores :meth:`EnvManager.state_dict`) sees the same
seeds it would have seen.

An env that plays a task set in order asks for a task index (its class sets
``uses_task_index = True``): each of its resets then also gets
``options={"task_index": n}``, ``n`` numbering its tag's groups round after
round from 0 (training: from the same checkpointed cursor; validation: from 0
at every call), so consecutive groups play consecutive rows of its task set
(docs/tasksets.md). The seed is the same either way.

Envs live in this process (the default) or, given a cluster, on env workers
(:mod:`agentgym.rollout.workers`): ``max_env_num_per_worker`` envs each,
the workers placed round-robin over the cluster's nodes. Seeds, task
indices, group ids and the order of episodes do not depend on where the envs live.
"""

from __future__ import annotations

import contextlib
import math
import secrets
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from agentgym import registry
from agentgym.cluster import WorkerHandle, WorkerSpec
from agentgym.cluster.placement import spread
from agentgym.envs.text_env import TextEnv
from agentgym.rollout.worker_client import WorkerChannel, WorkerEnv
from agentgym.rollout.workers import (
    WORKER_SWITCH_INTERVAL,
    EnvBuild,
    EnvClient,
    EnvWorker,
    LocalEnv,
    uses_task_index,
)

if TYPE_CHECKING:
    from agentgym.cluster import Cluster

CLOSE_TIMEOUT = 30.0
"""Seconds an env worker is given to close its envs before it is killed."""

WORKER_CONCURRENCY = 4
"""Ray calls an env worker serves at once (``data_address``, ``close``, probes); its
requests come over its data plane, and its envs play in threads of its own."""


@dataclass(frozen=True)
class EnvConfig:
    """What a tag names: a registered env and its constructor arguments.

    Attributes:
        name: A registered env name or Gymnasium id.
        kwargs: Constructor arguments.
    """

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class EnvSlot:
    """One env of the manager and where it sits.

    Attributes:
        home: The env itself (unwrapped :class:`TextEnv`) when it lives in this
            process, else its :class:`~agentgym.rollout.workers.WorkerEnv` client.
        name: The registered env name it was made from.
        tag: Its tag.
        group_index: Index of its group within the manager.
        index: Its index within the manager.
        task_indexed: Whether the env asks for the reset option ``task_index``
            (:func:`~agentgym.rollout.workers.uses_task_index`).
    """

    home: TextEnv | WorkerEnv
    name: str
    tag: str
    group_index: int
    index: int
    task_indexed: bool = False

    @property
    def env(self) -> TextEnv:
        """The env, when it lives in this process.

        Raises:
            RuntimeError: If it lives on an env worker (drive it through :meth:`client`).
        """
        if isinstance(self.home, WorkerEnv):
            raise RuntimeError(
                f"env {self.index} ({self.tag}) lives on {self.home.handle.name}, not in this "
                "process; drive it through EnvSlot.client()"
            )
        return self.home

    def client(self, executor: Executor) -> EnvClient:
        """The env's client; ``executor`` runs the calls of an env in this process."""
        if isinstance(self.home, WorkerEnv):
            return self.home
        return LocalEnv(self.home, executor)


@dataclass(frozen=True)
class Assignment:
    """An episode to run.

    Attributes:
        slot: Which env.
        seed: The reset seed, shared by the group.
        group_id: The group's id.
        task_index: The group's task number, for an env that asks for one
            (``slot.task_indexed``); None otherwise.
    """

    slot: EnvSlot
    seed: int
    group_id: int
    task_index: int | None = None

    @property
    def reset_options(self) -> dict[str, Any] | None:
        """The reset's options: ``{"task_index": n}`` for an env that asks, else None."""
        return None if self.task_index is None else {"task_index": self.task_index}


def even_split(total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` near-equal integers, larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


class EnvManager:
    """Builds and seeds the envs of one rollout (train or validation).

    Args:
        tags: Env tags; a tag is a key of ``env_configs`` or a registered env name.
        env_groups: Number of groups per round.
        group_size: Envs per group (GRPO's G); all reset with the group's seed.
        n_groups: Groups per tag (sums to ``env_groups``); default an even split.
        env_configs: Tag → :class:`EnvConfig` (or a ``{name, kwargs}`` mapping, as
            in a YAML config) for tags that are not plain env names.
        seed: The experiment seed.
        fixed_seeds: Reuse the same seeds (and task indices, from 0) every call
            (validation) instead of advancing the cursor (training).
        max_traj_per_env: Episodes each env runs per :meth:`assignments` call.
        format_penalty: Overrides every env's ``format_penalty`` when given.
        render_mode: Passed to envs that support it (``"rgb_array"`` to record frames).
        cluster: Where env workers run; None keeps every env in this process.
        max_env_num_per_worker: Envs per env worker (each served by its own
            thread); None puts one worker on each of the cluster's nodes.
            Only with a cluster.
        additional_groups: Groups started each round beyond ``env_groups``
            (ROLL's ``max_additional_running_prompts``): their envs are built
            too, and :func:`~agentgym.rollout.loop.collect` keeps the first
            ``env_groups`` groups of each round's worth that complete. Extra
            group ``k`` plays tag ``tags`` of batch group ``k % env_groups``.
            An extra group has a task index too; the rows of groups left out
            of a batch are not played.

    Raises:
        ValueError: On an unknown tag, sizes below 1, ``n_groups`` that
            does not match ``tags`` and ``env_groups``, or
            ``max_env_num_per_worker`` without a cluster.
        UnknownEnvError: If a tag's env name is not registered.
    """

    def __init__(
        self,
        *,
        tags: Sequence[str],
        env_groups: int,
        group_size: int,
        n_groups: Sequence[int] | None = None,
        env_configs: Mapping[str, EnvConfig | Mapping[str, Any]] | None = None,
        seed: int = 0,
        fixed_seeds: bool = False,
        max_traj_per_env: int = 1,
        format_penalty: float | None = None,
        render_mode: str | None = None,
        cluster: Cluster | None = None,
        max_env_num_per_worker: int | None = None,
        additional_groups: int = 0,
    ) -> None:
        if additional_groups < 0:
            raise ValueError(f"additional_groups must be >= 0, got {additional_groups}")
        for key, value in [
            ("env_groups", env_groups),
            ("group_size", group_size),
            ("max_traj_per_env", max_traj_per_env),
            (
                "max_env_num_per_worker",
                1 if max_env_num_per_worker is None else max_env_num_per_worker,
            ),
        ]:
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        if max_env_num_per_worker is not None and cluster is None:
            raise ValueError(
                f"max_env_num_per_worker={max_env_num_per_worker} needs a cluster to place env "
                "workers on; without one every env runs in this process"
            )
        if not tags:
            raise ValueError("tags must name at least one env")
        if n_groups is None:
            n_groups = even_split(env_groups, len(tags))
        if len(n_groups) != len(tags) or sum(n_groups) != env_groups or min(n_groups) < 0:
            raise ValueError(
                f"n_groups={list(n_groups)} must give a count >= 0 for each of the tags "
                f"{list(tags)} summing to env_groups={env_groups}"
            )
        configs = {
            tag: config if isinstance(config, EnvConfig) else EnvConfig(**config)
            for tag, config in (env_configs or {}).items()
        }
        self.seed = seed
        self.fixed_seeds = fixed_seeds
        self.group_size = group_size
        self.max_traj_per_env = max_traj_per_env
        self.batch_groups = env_groups
        self.additional_groups = additional_groups
        self.cursor = 0
        batch_tags = [tag for tag, count in zip(tags, n_groups, strict=True) for _ in range(count)]
        self.group_tags = batch_tags + [
            batch_tags[k % env_groups] for k in range(additional_groups)
        ]
        builds: list[EnvBuild] = []
        places: list[tuple[str, int]] = []  # (tag, group index) of each env
        for group_index, tag in enumerate(self.group_tags):
            config = configs.get(tag, EnvConfig(tag))
            kwargs = dict(config.kwargs)
            if format_penalty is not None:
                kwargs["format_penalty"] = format_penalty
            for _ in range(group_size):
                builds.append(EnvBuild(config.name, kwargs, render_mode))
                places.append((tag, group_index))
        # a task-indexed env numbers its tag's groups: group k of the tag's n in a round
        # is task round * n + k, so each tag's task set is read in order without gaps
        self.tag_groups: dict[str, int] = {}
        self.tag_ranks: list[int] = []
        for tag in self.group_tags:
            self.tag_ranks.append(self.tag_groups.get(tag, 0))
            self.tag_groups[tag] = self.tag_ranks[-1] + 1
        self.workers: list[WorkerHandle] = []
        homes: Sequence[TextEnv | WorkerEnv]
        flags: Sequence[bool]
        if cluster is None:
            local = [build.make() for build in builds]
            homes = list(local)
            flags = [uses_task_index(env) for env in local]
        else:
            homes, flags = self._spawn(cluster, builds, max_env_num_per_worker)
        self.slots = [
            EnvSlot(home, build.name, tag, group_index, index, flag)
            for index, (home, build, (tag, group_index), flag) in enumerate(
                zip(homes, builds, places, flags, strict=True)
            )
        ]

    def _spawn(
        self, cluster: Cluster, builds: Sequence[EnvBuild], per_worker: int | None
    ) -> tuple[list[WorkerEnv], list[bool]]:
        """Start the env workers (contiguous runs of envs); return a client per env and
        whether each env asks for a task index."""
        if per_worker is None:
            per_worker = math.ceil(len(builds) / cluster.num_nodes)
        registrations = _registrations({build.name for build in builds})
        chunks = [builds[i : i + per_worker] for i in range(0, len(builds), per_worker)]
        key = secrets.token_bytes(32)  # the workers' data plane takes requests from us only
        for rank, node in enumerate(spread(len(chunks), cluster.num_nodes)):
            self.workers.append(
                cluster.spawn(
                    WorkerSpec(
                        f"env_worker[{rank}]", node, concurrency=WORKER_CONCURRENCY, restarts=-1
                    ),
                    EnvWorker,
                    chunks[rank],
                    registrations,
                    (cluster.node_address(node), key),
                    # a process of its own: a longer switch interval keeps it busy
                    WORKER_SWITCH_INTERVAL if cluster.kind == "ray" else None,
                )
            )
        clients: list[WorkerEnv] = []
        flags: list[bool] = []
        for handle in self.workers:  # waits for the envs to be built; raises their errors
            channel = WorkerChannel(handle, key)
            modes = handle.call_sync("render_modes")
            clients += [WorkerEnv(channel, index, mode) for index, mode in enumerate(modes)]
            flags += handle.call_sync("task_index_flags")
        return clients, flags

    @property
    def num_groups(self) -> int:
        """Groups started per round (``env_groups`` plus ``additional_groups``)."""
        return len(self.group_tags)

    @property
    def batch_size(self) -> int:
        """Trajectories a batch holds: ``env_groups × group_size × max_traj_per_env``."""
        return self.batch_groups * self.group_size * self.max_traj_per_env

    def assignments(self) -> list[list[Assignment]]:
        """The next batch of episodes: for each env, its episodes in order.

        Each of the ``max_traj_per_env`` rounds gives every group a fresh seed
        (or, with ``fixed_seeds``, the same seeds as every call) and a group id
        unique across the batch and, for training, across the run. An env that
        asks for a task index gets its group's: in round ``R`` of the run (of
        the call, with ``fixed_seeds``), group ``k`` of its tag's ``n`` groups
        is task ``R * n + k``.
        """
        first = 0 if self.fixed_seeds else self.cursor
        if not self.fixed_seeds:
            self.cursor += self.num_groups * self.max_traj_per_env
        first_round = first // self.num_groups
        seeds: dict[int, int] = {}  # a group's members share their group's seed
        return [
            [
                self._assignment(slot, first_round + r, first + r * self.num_groups, seeds)
                for r in range(self.max_traj_per_env)
            ]
            for slot in self.slots
        ]

    def _assignment(
        self, slot: EnvSlot, round_number: int, round_start: int, seeds: dict[int, int]
    ) -> Assignment:
        number = round_start + slot.group_index
        task_index = None
        if slot.task_indexed:
            task_index = round_number * self.tag_groups[slot.tag] + self.tag_ranks[slot.group_index]
        seed = seeds.get(number)
        if seed is None:
            seed = seeds[number] = self._seed(number)
        return Assignment(slot, seed, number, task_index)

    def _seed(self, group_number: int) -> int:
        stream = 1 if self.fixed_seeds else 0
        state = np.random.SeedSequence([self.seed, stream, group_number]).generate_state(1)
        return int(state[0] & 0x7FFFFFFF)

    def state_dict(self) -> dict[str, int]:
        """The seed cursor (it also places the task indices), for checkpoints."""
        return {"cursor": self.cursor}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Restore the seed cursor from :meth:`state_dict`."""
        self.cursor = int(state["cursor"])

    def clients(self, executor: Executor) -> list[EnvClient]:
        """A client per env, in slot order; ``executor`` runs the calls of envs in this process."""
        return [slot.client(executor) for slot in self.slots]

    def close(self) -> None:
        """Close every env, and stop the env workers."""
        for slot in self.slots:
            if isinstance(slot.home, TextEnv):
                slot.home.close()
        for handle in self.workers:
            with contextlib.suppress(Exception):  # a dead worker has nothing left to close
                handle.call_sync("close", timeout=CLOSE_TIMEOUT)
            handle.kill()
        self.workers.clear()


def _registrations(names: set[str]) -> list[registry.EnvSpec]:
    """The specs of envs registered under agentgym's namespace, for workers to register.

    An env registered in the driver's code (a test's, a notebook's) is unknown
    to a fresh worker process; built-in and plugin envs register themselves
    there too, and other Gymnasium ids are found by their module.
    """
    specs = [registry.spec(name) for name in sorted(names)]
    return [
        spec
        for spec in specs
        if spec.plugin is None and spec.id.startswith(f"{registry.NAMESPACE}/")
    ]
