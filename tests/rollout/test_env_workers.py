"""Env workers: trajectories identical to in-process envs, other processes, a killed worker.

The Ray tests (``-m ray``) share one local Ray instance per module; the same
checks run on a :class:`~agentgym.cluster.LocalCluster` (workers in this process).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym.cluster import (
    Cluster,
    LocalCluster,
    LocalHandle,
    WorkerDiedError,
    WorkerHandle,
    WorkerSpec,
    start_cluster,
)
from agentgym.rollout.backends.base import SamplingParams
from agentgym.rollout.backends.hf import HFBackend
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, RolloutResult, collect
from agentgym.rollout.metrics import failure_report
from agentgym.rollout.worker_client import WorkerEnv
from agentgym.rollout.workers import EnvWorker
from agentgym.trajectory import Trajectory
from tests.rollout.envs import AddToolEnv, CountEnv, registered

REPOSITORY = Path(__file__).resolve().parents[2]
CLUSTERS = ["local", pytest.param("ray", marks=pytest.mark.ray)]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    # PYTHONPATH: the workers unpickle this test package's env classes by reference
    cluster = start_cluster("ray", rpc_timeout=120, env_vars={"PYTHONPATH": str(REPOSITORY)})
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(params=CLUSTERS)
def cluster(request: pytest.FixtureRequest) -> Cluster:
    if request.param == "ray":
        ray: Cluster = request.getfixturevalue("ray_cluster")
        return ray
    return LocalCluster()


def rollout(manager: EnvManager, backend: Any, tokenizer: Any, **config: Any) -> RolloutResult:
    config.setdefault("mode", "trajectory")
    config.setdefault("prefix_check", "strict")
    config.setdefault("sequence_length", 4096)
    config.setdefault("sampling", SamplingParams(max_new_tokens=48, seed=0))
    return asyncio.run(collect(manager, backend, ChatTokenizer(tokenizer), RolloutConfig(**config)))


def essentials(trajectory: Trajectory) -> dict[str, Any]:
    """Everything a trainer reads from a trajectory (the error text aside)."""
    fields = dataclasses.asdict(trajectory)
    fields.pop("error")
    fields["input_ids"] = trajectory.input_ids
    fields["loss_mask"] = trajectory.loss_mask
    return fields


def assert_same(
    ours: list[Trajectory], reference: list[Trajectory], *, logprobs_tolerance: float = 0.0
) -> None:
    assert len(ours) == len(reference)
    for mine, theirs in zip(ours, reference, strict=True):
        if logprobs_tolerance:
            for turn, other in zip(mine.turns, theirs.turns, strict=True):
                assert turn.logprobs == pytest.approx(other.logprobs, abs=logprobs_tolerance)
                turn.logprobs = other.logprobs
        assert essentials(mine) == essentials(theirs)


def test_scripted_solver_trajectories_match_in_process(
    cluster: Cluster, tiny_tokenizer: Any, qwen_model_dir: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen_model_dir)
    settings: dict[str, Any] = {
        "tags": ["sokoban", "add_tool_test", "frozen_lake"],
        "env_groups": 4,
        "group_size": 2,
        "seed": 5,
        "max_traj_per_env": 2,
    }
    with registered("add_tool_test", AddToolEnv):
        reference = EnvManager(**settings)
        spread = EnvManager(**settings, cluster=cluster, max_env_num_per_worker=3)
        try:
            assert len(spread.workers) == 3  # 8 envs, 3 per worker
            results = []
            for manager in (reference, spread):  # two rounds: the seed cursor moves on
                rounds = [rollout(manager, ScriptedBackend(tokenizer), tokenizer, max_turns=40)]
                rounds.append(rollout(manager, ScriptedBackend(tokenizer), tokenizer, max_turns=40))
                results.append([t for r in rounds for t in r.trajectories])
        finally:
            spread.close()
            reference.close()
    assert len(results[0]) == 32
    assert all(t.success for t in results[0])
    assert {t.tag for t in results[0]} == {"sokoban", "add_tool_test", "frozen_lake"}
    assert_same(results[1], results[0])


def test_random_agent_keeps_its_stream_per_env(cluster: Cluster, tiny_tokenizer: Any) -> None:
    settings: dict[str, Any] = {"tags": ["sokoban"], "env_groups": 2, "group_size": 2}
    reference = EnvManager(**settings, max_traj_per_env=2)
    spread = EnvManager(**settings, max_traj_per_env=2, cluster=cluster, max_env_num_per_worker=2)
    try:
        results = [
            rollout(
                m, ScriptedBackend(tiny_tokenizer, "random", seed=3), tiny_tokenizer, max_turns=4
            )
            for m in (reference, spread)
        ]
    finally:
        spread.close()
        reference.close()
    texts = {turn.response_text for t in results[0].trajectories for turn in t.turns}
    assert len(texts) > 1  # random actions, not one answer repeated
    assert_same(results[1].trajectories, results[0].trajectories)


@pytest.mark.parametrize("max_batch_size", [1, 64])
def test_seeded_hf_trajectories_match_in_process(
    cluster: Cluster, tiny_model_dir: Path, tiny_tokenizer: Any, max_batch_size: int
) -> None:
    """Seeded sampling makes the ids independent of how requests were batched; the
    logprobs are bit-identical when every request is generated alone, and equal to
    float32 rounding when requests share a padded batch (which ones do depends on
    timing, in process or not)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    settings: dict[str, Any] = {
        "tags": ["sokoban", "frozen_lake"],
        "env_groups": 2,
        "group_size": 2,
    }
    reference = EnvManager(**settings)
    spread = EnvManager(**settings, cluster=cluster, max_env_num_per_worker=2)
    try:
        results = [
            rollout(
                manager,
                HFBackend(
                    model, pad_token_id=tiny_tokenizer.pad_token_id, max_batch_size=max_batch_size
                ),
                tiny_tokenizer,
                max_turns=3,
                sampling=SamplingParams(max_new_tokens=12, seed=11),
            )
            for manager in (reference, spread)
        ]
    finally:
        spread.close()
        reference.close()
    assert all(len(t.turns) == 3 for t in results[0].trajectories)
    assert all(turn.logprobs for t in results[0].trajectories for turn in t.turns)
    tolerance = 0.0 if max_batch_size == 1 else 1e-4
    assert_same(results[1].trajectories, results[0].trajectories, logprobs_tolerance=tolerance)


def test_frames_are_recorded_on_the_worker(cluster: Cluster, tiny_tokenizer: Any) -> None:
    settings: dict[str, Any] = {
        "tags": ["sokoban"],
        "env_groups": 1,
        "group_size": 2,
        "render_mode": "rgb_array",
    }
    reference = EnvManager(**settings)
    spread = EnvManager(**settings, cluster=cluster, max_env_num_per_worker=1)
    try:
        results = [
            rollout(
                m, ScriptedBackend(tiny_tokenizer), tiny_tokenizer, max_turns=3, record_frames=True
            )
            for m in (reference, spread)
        ]
        home = spread.slots[0].home
        assert isinstance(home, WorkerEnv) and home.render_mode == "rgb_array"
    finally:
        spread.close()
        reference.close()
    mine, theirs = results[1].trajectories[0], results[0].trajectories[0]
    assert len(theirs.frames) == len(theirs.turns) + 1
    assert len(mine.frames) == len(theirs.frames)
    assert all((a == b).all() for a, b in zip(mine.frames, theirs.frames, strict=True))


@pytest.mark.ray
def test_envs_run_in_worker_processes(ray_cluster: Cluster) -> None:
    manager = EnvManager(
        tags=["sokoban"], env_groups=5, group_size=1, cluster=ray_cluster, max_env_num_per_worker=2
    )
    try:
        pids = [handle.call_sync("pid") for handle in manager.workers]
        with pytest.raises(RuntimeError, match="lives on env_worker"):
            _ = manager.slots[0].env
    finally:
        manager.close()
    assert len(pids) == 3
    assert len(set(pids)) == 3
    assert os.getpid() not in pids


class SpreadRecorder(LocalCluster):
    """A two-node cluster that builds workers here and records where each was placed."""

    num_nodes = 2

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[tuple[str, int, int, int, int]] = []

    def spawn(self, spec: WorkerSpec, cls: type, *args: Any, **kwargs: Any) -> LocalHandle:
        worker = cls(*args, **kwargs)
        self.spawned.append(
            (spec.name, spec.node, spec.concurrency, spec.restarts, len(worker.envs))
        )
        handle = LocalHandle(worker, name=spec.name, concurrency=spec.concurrency)
        self.handles.append(handle)
        return handle


def test_workers_take_contiguous_envs_round_robin_over_nodes() -> None:
    recorder = SpreadRecorder()
    manager = EnvManager(
        tags=["sokoban", "frozen_lake"],
        env_groups=5,
        group_size=2,
        cluster=recorder,
        max_env_num_per_worker=3,
    )
    try:
        assert recorder.spawned == [
            ("env_worker[0]", 0, 4, -1, 3),
            ("env_worker[1]", 1, 4, -1, 3),
            ("env_worker[2]", 0, 4, -1, 3),
            ("env_worker[3]", 1, 4, -1, 1),
        ]
        homes = [slot.home for slot in manager.slots]
        assert all(isinstance(home, WorkerEnv) for home in homes)
        assert [(h.handle.name, h.index) for h in homes if isinstance(h, WorkerEnv)][3:5] == [
            ("env_worker[1]", 0),
            ("env_worker[1]", 1),
        ]
        assert [slot.name for slot in manager.slots] == ["sokoban"] * 6 + ["frozen_lake"] * 4
        assert [slot.group_index for slot in manager.slots] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    finally:
        manager.close()
    recorder = SpreadRecorder()
    EnvManager(tags=["sokoban"], env_groups=3, group_size=1, cluster=recorder).close()
    assert [(node, envs) for _, node, _, _, envs in recorder.spawned] == [(0, 2), (1, 1)]


def test_max_env_num_per_worker_needs_a_cluster() -> None:
    with pytest.raises(ValueError, match="needs a cluster"):
        EnvManager(tags=["sokoban"], env_groups=1, group_size=1, max_env_num_per_worker=2)
    with pytest.raises(ValueError, match="max_env_num_per_worker must be >= 1"):
        EnvManager(
            tags=["sokoban"],
            env_groups=1,
            group_size=1,
            cluster=LocalCluster(),
            max_env_num_per_worker=0,
        )


def test_close_closes_the_workers_envs() -> None:
    manager = EnvManager(
        tags=["sokoban"],
        env_groups=2,
        group_size=1,
        cluster=LocalCluster(),
        max_env_num_per_worker=1,
    )
    workers = [handle.worker for handle in manager.workers if isinstance(handle, LocalHandle)]
    manager.close()
    assert len(workers) == 2
    assert all(isinstance(w, EnvWorker) and w._closed for w in workers)
    assert manager.workers == []


def alive_pid(handle: WorkerHandle) -> int:
    """The worker's pid once it answers (Ray refuses calls while an actor restarts)."""
    for _ in range(600):
        try:
            return int(handle.call_sync("pid"))
        except WorkerDiedError:
            time.sleep(0.1)
    raise AssertionError(f"{handle.name} did not come back")


class HangOnceEnv(CountEnv):
    """A counter whose first second step anywhere writes its pid to ``marker`` and hangs."""

    action_names: ClassVar[tuple[str, ...]] = ("Inc", "Dec")

    def __init__(self, marker: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.marker = marker

    def _apply(self, action: str) -> tuple[float, bool]:
        if self.num_steps == 2 and self.marker:
            try:
                with open(self.marker, "x") as file:
                    file.write(str(os.getpid()))
            except FileExistsError:
                pass
            else:
                time.sleep(600)  # until the test kills this process
        return super()._apply(action)

    def _reset(self, options: dict[str, Any]) -> dict[str, Any]:
        info = super()._reset(options)
        self.target = 5  # every episode needs five steps, so the hang comes mid-episode
        return info


@pytest.mark.ray
def test_a_killed_worker_fails_its_episodes_and_comes_back(
    ray_cluster: Cluster, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "hung.pid"
    with registered("hang_once", HangOnceEnv):
        manager = EnvManager(
            tags=["hang_once"],
            env_groups=4,
            group_size=1,
            env_configs={"hang_once": {"name": "hang_once", "kwargs": {"marker": str(marker)}}},
            max_traj_per_env=2,
            cluster=ray_cluster,
            max_env_num_per_worker=2,
        )
        try:
            pids = [handle.call_sync("pid") for handle in manager.workers]

            def kill_the_hung_worker() -> int:
                while not marker.exists() or not marker.read_text():
                    time.sleep(0.05)
                pid = int(marker.read_text())
                os.kill(pid, signal.SIGKILL)
                return pid

            async def scenario() -> tuple[RolloutResult, int]:
                killer = asyncio.create_task(asyncio.to_thread(kill_the_hung_worker))
                result = await collect(
                    manager,
                    ScriptedBackend(tiny_tokenizer),
                    ChatTokenizer(tiny_tokenizer),
                    RolloutConfig(mode="trajectory", max_turns=10, sequence_length=4096),
                )
                return result, await killer

            result, killed = asyncio.run(scenario())
            after = [alive_pid(handle) for handle in manager.workers]
            next_round = rollout(manager, ScriptedBackend(tiny_tokenizer), tiny_tokenizer)
        finally:
            manager.close()
    rank = pids.index(killed)
    assert after[rank] != killed and after[1 - rank] == pids[1 - rank]  # restarted by Ray
    on_killed = {2 * rank, 2 * rank + 1}
    trajectories = result.trajectories
    assert len(trajectories) == 8
    failed = [t for t in trajectories if t.failed]
    assert 1 <= len(failed) <= 2  # the hung episode, and its neighbour's if it was mid-episode
    assert {t.env_index for t in failed} <= on_killed
    assert all(t.termination_reason == "env_error" for t in failed)
    assert all("EnvLostError" in (t.error or "") for t in failed)
    assert all(t.success for t in trajectories if not t.failed)
    assert failure_report(trajectories).failed == len(failed)
    assert result.metrics["all/failed"] == len(failed)
    # the restarted worker's envs played their later episodes, this step and the next
    assert {t.env_index for t in trajectories if t.success} == set(range(4))
    assert all(t.success for t in next_round.trajectories)


def test_a_slow_env_does_not_hold_back_its_workers_other_envs(
    cluster: Cluster, tiny_tokenizer: Any
) -> None:
    with registered("slow_count", lambda **kw: CountEnv(delay=0.3, **kw)):
        manager = EnvManager(
            tags=["slow_count", "frozen_lake"],
            n_groups=[1, 3],
            env_groups=4,
            group_size=1,
            cluster=cluster,
            max_env_num_per_worker=4,  # all four on one worker, sharing its connection
        )
        order: list[str] = []
        try:
            result = asyncio.run(
                collect(
                    manager,
                    ScriptedBackend(tiny_tokenizer),
                    ChatTokenizer(tiny_tokenizer),
                    RolloutConfig(mode="trajectory", max_turns=10, sequence_length=4096),
                    on_trajectory=lambda t: order.append(t.tag),
                )
            )
        finally:
            manager.close()
    assert len(manager.workers) == 0 and len(order) == 4
    assert order[-1] == "slow_count"
    assert all(t.success for t in result.trajectories)
