"""``mode=explore`` and ``mode=train`` as two real processes of one job (SQLite buffer,
weights by checkpoint): either may start first, every group is trained exactly once,
the staleness bound holds on the recorded versions, and a ``kill -9`` of either side
loses nothing and repeats nothing."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgym.errors import ConfigError
from agentgym.job.buffer import ExperienceBuffer
from agentgym.schema import validate
from tests.forkserver import Process, start_python
from tests.test_config import composed

JOB = [
    "env=sokoban", "max_turns=2", "sequence_length=512", "generation=hf",
    "generation.max_new_tokens=6", "train_env_manager.env_groups=2",
    "train_env_manager.group_size=2", "rollout_mode=trajectory", "step_advantage_weight=0",
    "rollout_batch_size=4", "val_batch_size=2", "val_env_manager.env_groups=2",
    "actor_train.training_args.per_device_train_batch_size=2",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "reward_normalization.method=identity", "drop_zero_variance_groups=false",
    "model.warm_start=null", "project=p", "name=job", "save_steps=1", "eval_steps=2",
]  # fmt: skip
"""A tiny job; async_generation_ratio is unset, so the staleness bound is what the sync
schedule implies: sync_interval + sync_offset - 1 = 0 (Trinity-RFT's defaults: the
explorer waits for each version)."""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


STARTED: list[Process] = []


@pytest.fixture(autouse=True)
def no_process_left() -> Iterator[None]:
    """A test that fails midway leaves none of its processes running."""
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait()


def start(root: Path, cache: Path, mode: str, *extra: str, name: str | None = None) -> Process:
    folder = root / (name or mode)
    command = [
        "-m", "agentgym.train", *JOB, f"mode={mode}",
        f"model.cache_dir={cache}", f"checkpoint_root_dir={root / 'jobs'}",
        f"output_dir={folder}", *extra,
    ]  # fmt: skip
    STARTED.append(start_python(command, cwd=Path.cwd(), output=root / f"{name or mode}.log"))
    return STARTED[-1]


def finish(process: Process, log: Path, timeout: float = 300) -> None:
    assert process.wait(timeout) == 0, log.read_text()[-4000:]


def buffer(root: Path) -> ExperienceBuffer:
    return ExperienceBuffer(root / "jobs" / "p" / "job" / "buffer.sqlite")


def metrics(folder: Path) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for line in (folder / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "step" in record:
            rows.setdefault(int(record["step"]), {}).update(record)
    return rows


def assert_each_group_once(root: Path, steps: int, groups_per_step: int = 2) -> None:
    consumed = buffer(root).consumed_by_step()
    assert sorted(consumed) == list(range(1, steps + 1))
    assert all(len(keys) == groups_per_step for keys in consumed.values())
    keys = [key for step_keys in consumed.values() for key in step_keys]
    assert len(keys) == len(set(keys))


def assert_staleness_within(folder: Path, bound: int) -> None:
    rows = metrics(folder)
    trained = [row for row in rows.values() if "async/staleness_max" in row]
    assert trained and all(0 <= row["async/staleness_max"] <= bound for row in trained)


@pytest.mark.parametrize(
    ("first", "schedule", "versions", "sync", "on_startup"),
    [
        # one step off-policy: the explorer plays a batch ahead of each version
        ("explore", "synchronizer.sync_offset=1", {0, 1, 2, 3}, "checkpoint", True),
        # a version every 2 steps (and the last): explorers never hold an odd one but 3;
        # weights from the trainer's memory over a process group (nccl's channel, gloo);
        # the starting weights not validated (Trinity's eval_on_startup: false)
        ("train", "synchronizer.sync_interval=2", {0, 2, 3}, "nccl", False),
    ],
)
def test_explorer_and_trainer_started_in_either_order(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    first: str,
    schedule: str,
    versions: set[int],
    sync: str,
    on_startup: bool,
) -> None:
    from agentgym.job.collective_weights import COLLECTIVE_BACKEND

    monkeypatch.setenv(COLLECTIVE_BACKEND, "gloo")  # the processes inherit it
    second = "train" if first == "explore" else "explore"
    settings = (
        "max_steps=3",
        schedule,
        f"synchronizer.sync_method={sync}",
        f"validation.on_startup={str(on_startup).lower()}",
    )
    processes = {first: start(tmp_path, cache, first, *settings)}
    time.sleep(3)
    processes[second] = start(tmp_path, cache, second, *settings)
    for mode, process in processes.items():
        finish(process, tmp_path / f"{mode}.log")
    assert_each_group_once(tmp_path, 3)
    assert_staleness_within(tmp_path / "train", bound=1)
    explored = metrics(tmp_path / "explore")
    played = {
        int(row["explore/policy_version"])
        for row in explored.values()
        if "explore/policy_version" in row
    }
    assert played <= versions and 0 in played
    batches = [row for row in explored.values() if "explore/policy_version" in row]
    assert all(row["time/explorer_wait"] >= 0 for row in batches)
    validated = {step for step, row in explored.items() if "val/all/success" in row}
    assert 3 in validated and validated & {2, 3}  # version 2 or the next one loaded
    assert (0 in validated) == on_startup
    weights = tmp_path / "jobs" / "p" / "job" / "weights"
    on_disk = sorted(p.name for p in weights.glob("v*"))
    if sync == "nccl":  # versions went process to process; only the last, at the end, to disk
        assert on_disk == ["v00000003"] and (weights / "collective.json").is_file()
        assert "loaded version 2" in (tmp_path / "explore.log").read_text()
    else:
        assert on_disk


def wait_for(path: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


def trained_steps(folder: Path) -> list[int]:
    return [step for step, row in metrics(folder).items() if "actor/loss" in row]


def test_a_trainer_killed_before_and_after_its_first_checkpoint_restarts_with_one_command(
    tmp_path: Path, cache: Path
) -> None:
    """One command restarts the trainer whether or not a checkpoint exists (Trinity's
    continue_from_checkpoint, verl's resume_mode=auto): killed after training step 1 and
    before any checkpoint it starts afresh, killed after checkpoint 2 it continues there;
    the explorer loads the restarted trainer's older versions and plays on."""
    command = ("max_steps=5", "save_steps=2", "resume_from_checkpoint=auto")
    explorer = start(tmp_path, cache, "explore", *command)
    trainer = start(tmp_path, cache, "train", *command)
    checkpoints = tmp_path / "jobs" / "p" / "job" / "checkpoints"
    deadline = time.monotonic() + 240
    while not (tmp_path / "train" / "logs" / "metrics.jsonl").is_file() or not trained_steps(
        tmp_path / "train"
    ):
        assert time.monotonic() < deadline and trainer.poll() is None
        time.sleep(0.2)
    trainer.send_signal(signal.SIGKILL)  # step 1 trained, its groups leased, no checkpoint
    trainer.wait()
    assert not list(checkpoints.glob("checkpoint-*"))
    trainer = start(tmp_path, cache, "train", *command)
    wait_for(checkpoints / "checkpoint-2" / "trainer_state.json")
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    trainer = start(tmp_path, cache, "train", *command)
    finish(trainer, tmp_path / "train.log")
    finish(explorer, tmp_path / "explore.log")
    assert_each_group_once(tmp_path, 5)
    log = (tmp_path / "train.log").read_text()
    assert "resume_from_checkpoint=auto: no checkpoint in" in log  # the first restart
    assert trained_steps(tmp_path / "train")[-1] == 5
    # the run folder shows the job's checkpoints (bench, eval and the stop line use it)
    assert (tmp_path / "train" / "checkpoints").resolve() == checkpoints.resolve()
    assert "the trainer restarted at version" in (tmp_path / "explore.log").read_text()


def test_an_explorer_whose_trainer_is_gone_gives_up_naming_it(tmp_path: Path, cache: Path) -> None:
    trainer = start(tmp_path, cache, "train", "max_steps=4")
    wait_for(tmp_path / "jobs" / "p" / "job" / "weights" / "LATEST.json")
    explorer = start(tmp_path, cache, "explore", "max_steps=4", "synchronizer.sync_timeout=8")
    wait_for(tmp_path / "train" / "checkpoints" / "checkpoint-1" / "trainer_state.json")
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    assert explorer.wait(120) == 1
    log = (tmp_path / "explore.log").read_text()
    assert "explorer stopped: explorer explorer: the trainer published no version after" in log
    assert "synchronizer.sync_timeout=8); is the trainer (mode=train) running?" in log
    assert "Traceback" not in log


def test_a_killed_explorer_restarts_from_its_cursor_and_writes_no_group_twice(
    tmp_path: Path, cache: Path
) -> None:
    trainer = start(tmp_path, cache, "train", "max_steps=4")
    explorer = start(tmp_path, cache, "explore", "max_steps=4")
    deadline = time.monotonic() + 240
    while buffer(tmp_path).counts()["ready"] + buffer(tmp_path).counts()["consumed"] < 4:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.kill(explorer.pid, signal.SIGKILL)
    explorer.wait()
    written_before = buffer(tmp_path).explorer("explorer")
    assert written_before is not None
    restarted = start(tmp_path, cache, "explore", "max_steps=4")
    finish(trainer, tmp_path / "train.log")
    finish(restarted, tmp_path / "explore.log")
    assert_each_group_once(tmp_path, 4)
    store = buffer(tmp_path)
    played = [row[0] for row in store._db.execute("SELECT group_id FROM groups")]
    assert len(played) == len(set(played))  # no group of the env manager stored twice
    record = store.explorer("explorer")
    assert record is not None and record.next_seq == record.written >= written_before.written
    assert "resumed at group" in (tmp_path / "explore.log").read_text()


def test_a_trainer_without_explorers_fails_naming_them(tmp_path: Path, cache: Path) -> None:
    trainer = start(tmp_path, cache, "train", "max_steps=2", "buffer.max_read_timeout=3")
    assert trainer.wait(240) != 0
    log = (tmp_path / "train.log").read_text()
    assert "max_read_timeout" in log and "no explorer has joined yet" in log


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mode=colocate", "use mode=both"),
        ("synchronizer.sync_method=nccl", r"needs GPUs \(torch sees no CUDA device\); use check"),
        ("synchronizer.sync_method=online", "nccl needs GPUs"),  # Trinity's alias
        ("buffer.storage_type=jsonl", r"not one of \['sql', 'queue', 'file'\]"),
        ("mode=expolre", r"not one of \['both', 'explore', 'train', 'serve', 'bench'"),
    ],
)
def test_modes_and_methods_not_built_fail_at_the_config_check(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(composed(override))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("distributed=ray",), "its ranks' weights reach the driver on the host"),
        ((), r"model.device='cpu': set model.device=cuda"),
    ],
)
def test_nccl_sync_needs_a_trainer_on_its_own_gpu(
    overrides: tuple[str, ...], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine
    nccl = ("mode=train", "synchronizer.sync_method=nccl", *overrides)
    with pytest.raises(ConfigError, match=message):
        validate(composed(*nccl))
    validate(composed(*nccl[:2], "model.device=cuda"))  # the trainer's own GPU: kept
    validate(composed(*nccl[:2], "strategy=megatron"))  # Megatron trains on the GPU anyway


def test_gpus_placed_with_the_model_on_the_cpu_fail_naming_model_device() -> None:
    placed = ("distributed=ray", "num_gpus_per_node=2")
    with pytest.raises(ConfigError, match="num_gpus_per_node=2 places the roles on GPUs"):
        validate(composed(*placed))
    with pytest.raises(ConfigError, match=r"model\.device='cuda:x' is not a torch device"):
        validate(composed(*placed, "model.device=cuda:x"))
    validate(composed(*placed, "model.device=cuda"))


def test_file_storage_is_the_sql_store_with_a_jsonl_copy_in_the_job_folder(
    tmp_path: Path,
) -> None:
    from agentgym.builders.job import connect_to_job

    config = validate(composed("buffer.storage_type=file", f"checkpoint_root_dir={tmp_path}"))
    buffer = connect_to_job(config).buffer
    assert isinstance(buffer, ExperienceBuffer)
    assert buffer.copy_to == config.job_dir.absolute() / "experiences.jsonl"
    assert buffer.path == buffer.copy_to.with_suffix(".sqlite")
    named = validate(
        composed("buffer.storage_type=file", f"buffer.path={tmp_path / 'out' / 'exp.jsonl'}")
    )
    assert connect_to_job(named).buffer.path == tmp_path / "out" / "exp.sqlite"
    folder = validate(composed("buffer.storage_type=file", f"buffer.path={tmp_path / 'exps'}"))
    assert connect_to_job(folder).buffer.path == tmp_path / "exps" / "experiences.sqlite"


def test_a_second_explorer_joins_mid_run_and_leaves_without_stopping_the_trainer(
    tmp_path: Path, cache: Path
) -> None:
    trainer = start(tmp_path, cache, "train", "max_steps=10", "buffer.explorer_timeout=10")
    first = start(tmp_path, cache, "explore")
    wait_for(tmp_path / "train" / "checkpoints" / "checkpoint-1" / "trainer_state.json")
    # the first explorer dies, so the run is still going when the second joins, however
    # fast the machine: the trainer gives up the slots it held
    first.send_signal(signal.SIGKILL)
    first.wait()
    second = start(
        tmp_path, cache, "explore", "explorer.name=second", "seed=7",
        "train_env_manager.env_groups=1", "rollout_batch_size=2", name="second",
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while (record := buffer(tmp_path).explorer("second")) is None or record.written < 2:
        assert time.monotonic() < deadline, (tmp_path / "second.log").read_text()[-3000:]
        time.sleep(0.2)
    first = start(tmp_path, cache, "explore")  # back, under its own name
    joined = max(buffer(tmp_path).consumed_by_step(), default=0)
    wait_for(tmp_path / "train" / "checkpoints" / f"checkpoint-{joined + 3}" / "trainer_state.json")
    second.send_signal(signal.SIGTERM)  # it leaves, perhaps holding a reservation
    second.wait(60)
    finish(trainer, tmp_path / "train.log")
    finish(first, tmp_path / "explore.log")
    assert_each_group_once(tmp_path, 10)
    consumed = buffer(tmp_path).consumed_by_step()
    after = {key[0] for step, keys in consumed.items() if step > joined for key in keys}
    assert after == {"explorer", "second"}, consumed


@pytest.mark.ray
def test_a_queue_buffer_on_ray_loses_nothing_when_its_actor_is_killed(
    tmp_path: Path, cache: Path
) -> None:
    """``queue`` + ``memory``: the job's state in Ray actors, no shared filesystem used for
    it; the buffer's actor is killed mid-run, Ray restarts it on the same SQLite file,
    and every group is still trained exactly once."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback; read when ray is imported
    import ray
    from ray.cluster_utils import Cluster

    from agentgym.job.ray_job import NAMESPACE, remove_job_actors

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        ray_job = [
            "buffer.storage_type=queue", "synchronizer.sync_method=memory",
            f"ray_address={cluster.address}", "synchronizer.sync_offset=1", "max_steps=5",
        ]  # fmt: skip
        trainer = start(tmp_path, cache, "train", *ray_job)
        explorer = start(tmp_path, cache, "explore", *ray_job)
        wait_for(tmp_path / "train" / "checkpoints" / "checkpoint-2" / "trainer_state.json")
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        actor: Any = ray.get_actor("p/job:buffer", namespace=NAMESPACE)
        killed = int(ray.get(actor.pid.remote()))
        os.kill(killed, signal.SIGKILL)
        finish(trainer, tmp_path / "train.log")
        finish(explorer, tmp_path / "explore.log")
        assert ray.get(actor.pid.remote()) != killed  # Ray restarted it
        assert_each_group_once(tmp_path, 5)
        assert_staleness_within(tmp_path / "train", bound=1)
        assert not (tmp_path / "jobs" / "p" / "job" / "weights").exists()  # weights in memory
        remove_job_actors("p/job")
    finally:
        ray.shutdown()
        cluster.shutdown()
        os.environ.pop("RAY_ADDRESS", None)
