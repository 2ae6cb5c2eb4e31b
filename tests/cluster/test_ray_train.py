"""Training on Ray: a two-node cluster (``ray.cluster_utils``) with roles on both nodes,
and Ctrl-C on the driver leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgym.builders.train import build_train
from agentgym.schema import validate
from agentgym.trainers.grpo import train
from tests.forkserver import run_python
from tests.processes import descendants
from tests.test_config import composed
from tests.trainers.test_train_e2e import SMALL, command, default_sigint

pytestmark = pytest.mark.ray


def small(cache: Path, output: Path, *overrides: str) -> list[str]:
    return [
        *(item.format(cache=cache) for item in SMALL),
        "generation=hf",
        f"output_dir={output}",
        *overrides,
    ]


@pytest.fixture
def two_nodes() -> Iterator[Any]:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback; read when ray is imported
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}}
    )
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
        os.environ.pop("RAY_ADDRESS", None)  # ray.init exports it; later runs start their own


def node_resources(handle: Any) -> set[str]:
    """The custom resource (node_a / node_b) of the node the actor runs on."""

    def probe(_: Any) -> list[str]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        resources = next(n["Resources"] for n in ray.nodes() if n["NodeID"] == node)
        return [name for name in resources if name.startswith("node_")]

    return set(handle.call_sync("__ray_call__", probe, timeout=120))


def test_two_nodes_hold_the_ranks_and_train_two_steps(
    two_nodes: Any, tmp_path: Path, tiny_model_dir: Path
) -> None:
    overrides = small(
        tmp_path / "cache",
        tmp_path / "run",
        "max_steps=2",
        "eval_steps=0",
        "save_steps=2",
        "distributed=ray",
        f"ray_address={two_nodes.address}",
        "num_nodes=2",
        "++actor_train.device_mapping=[0,1]",
        "actor_train.training_args.per_device_train_batch_size=2",  # 2 × 2 × 2 replicas = 8
        "++actor_infer.device_mapping=[1]",
        "train_env_manager.max_env_num_per_worker=4",
    )
    config = validate(composed(*overrides))
    grpo, parts = build_train(config, composed(*overrides))
    try:
        ranks = parts.strategy.handles  # type: ignore[attr-defined]
        assert [node_resources(h) for h in ranks] == [{"node_a"}, {"node_b"}]
        assert parts.train is not None
        envs = parts.train.manager.workers  # 8 envs, 4 a worker: one worker per node
        assert [node_resources(h) for h in envs] == [{"node_a"}, {"node_b"}]
        engines = parts.train.backend.backends  # type: ignore[attr-defined]
        assert [node_resources(e.handle) for e in engines] == [{"node_b"}]
    except BaseException:
        parts.cluster.shutdown()  # type: ignore[union-attr]
        raise
    train(grpo, parts)
    lines = (tmp_path / "run" / "logs" / "metrics.jsonl").read_text().splitlines()
    assert sum('"actor/grad_norm"' in line for line in lines) == 2


def alive(pids: set[int]) -> set[int]:
    living = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            living.add(pid)
    return living


def test_ctrl_c_stops_every_actor_and_leaves_no_process(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = command(
        run,
        tmp_path / "cache",
        "generation=hf",
        "max_steps=200",
        "save_steps=200",
        "eval_steps=0",
        "distributed=ray",
        "++actor_train.device_mapping=[0,1]",
        "actor_train.training_args.per_device_train_batch_size=2",  # 2 × 2 × 2 replicas = 8
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a Ray of its own
    process = subprocess.Popen(
        args, cwd=tmp_path, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint
    )
    assert process.stdout is not None
    seen: set[int] = set()
    for line in process.stdout:
        seen |= descendants(process.pid)
        if line.startswith("step "):  # a step done: every worker is up
            break
    else:
        pytest.fail(f"the run ended before its first step line (exit {process.wait()})")
    seen |= descendants(process.pid)
    assert len(seen) >= 4  # Ray's own processes and the two trainer ranks at least
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 130
    deadline = time.monotonic() + 30
    while alive(seen) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = alive(seen)
    details = [Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in left]
    assert not left, details


@pytest.mark.parametrize("agent", ["env", "proxy"])
def test_async_generation_on_ray_keeps_the_staleness_bound(tmp_path: Path, agent: str) -> None:
    """async_generation_ratio=1 with the envs on env workers and the engine behind the
    router: samples are one version stale after the first step, never more, and
    validation runs on the freshly synced weights. Through the proxy too: its sessions
    then stay on the driver's server, where the pausable client holds them for each
    sync and versions every response (tests/proxy/test_proxy_ray.py has sessions on
    the engines' own servers, as a step without async generation places them)."""
    run = tmp_path / "run"
    args = command(
        run,
        tmp_path / "cache",
        "generation=hf",
        "max_steps=3",
        "save_steps=3",
        "eval_steps=2",
        "distributed=ray",
        "async_generation_ratio=1",
        f"agent={agent}",
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a Ray of its own
    result = run_python(args[1:], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    records = [
        json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    stale = {r["step"]: r["async/staleness_max"] for r in records if "async/staleness_max" in r}
    assert stale == {1: 0.0, 2: 1.0, 3: 1.0}
    assert [r["val/policy_version"] for r in records if "val/policy_version" in r] == [0, 2, 3]
    assert all(r["time/weight_sync"] > 0 for r in records if "time/weight_sync" in r)
    hosted = [r["train/proxy/on_engines"] for r in records if "train/proxy/on_engines" in r]
    assert hosted == ([0.0, 0.0, 0.0] if agent == "proxy" else [])
