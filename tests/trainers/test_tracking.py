"""Trackers: the stdout line, metrics.jsonl, TensorBoard event files, offline wandb runs."""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentgym.console import StepTimer, format_duration, format_line
from agentgym.progress import progress
from agentgym.trainers.local_trackers import StdoutTracker
from agentgym.trainers.tracking import (
    CONSOLE_LOG_FILE,
    METRICS_FILE,
    TRACKERS,
    CompositeTracker,
    Tracker,
    make_tracker,
)

STEP_12 = {
    "train/all/score": 3.2,
    "train/all/success": 0.41,
    "actor/pg_loss": -0.012,
    "actor/kl": 0.001,
    "time/step": 2.8,
    "train/sokoban/score": 3.0,
    "actor/grad_norm": 0.5,
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for_bytes(path: Path, needle: bytes, timeout: float = 10.0) -> bytes:
    """The file's bytes once they hold ``needle`` (wandb-core may still write after finish())."""
    deadline = time.monotonic() + timeout
    while needle not in (data := path.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return data


def test_the_step_line_shows_the_figures_that_matter():
    assert format_line(STEP_12, 12) == (
        "step 12 | success 41.0% | score 3.20 | loss -0.012 | kl 0.001 | grad 0.5 | 2.8 s/step"
    )
    assert format_line(STEP_12, 12, total_steps=60, seconds_left=134) == (
        "step 12/60 | success 41.0% | score 3.20 | loss -0.012 | kl 0.001 | grad 0.5"
        " | 2.8 s/step | ETA 2m14s"
    )
    # the step is padded to the width of the total: lines stay aligned
    assert format_line({"time/step": 12.345}, 3, total_steps=100) == "step   3/100 | 12.3 s/step"
    assert format_line({"train/success": 0.5, "train/score": 1, "actor/loss": 2}, 1) == (
        "step 1 | success 50.0% | score 1.00 | loss 2"
    )
    assert format_line({"actor/entropy": 1.25, "actor/token_level_kl": 0.5}, 2) == (
        "step 2 | kl 0.5 | entropy 1.25"
    )
    # failed episodes are on the line
    assert format_line({"train/success": 0.25, "train/failed": 3.0}, 4) == (
        "step 4 | success 25.0% | failed 3"
    )
    assert format_line({"custom": 1.0}, 0) == "step 0"
    assert format_line({}, 0) == "step 0"


def test_the_validation_line_shows_success_and_score_per_tag():
    one_tag = {
        "val/sokoban/success": 0.4,
        "val/sokoban/score": 3.2,
        "val/sokoban/turns": 4.0,
        "val/all/success": 0.4,
        "val/all/score": 3.2,
        "val/all/trajectories": 512.0,
    }
    assert format_line(one_tag, 15, total_steps=60, seconds_left=99) == (
        "val  15/60 | sokoban success 40.0% score 3.20 | 512 episodes"
    )
    two_tags = {
        "val/sokoban/success": 0.5,
        "val/sokoban/score": 2.0,
        "val/frozen_lake/success": 0.25,
        "val/frozen_lake/score": -0.5,
        "val/all/success": 0.375,
        "val/all/score": 0.75,
        "val/all/trajectories": 8.0,
    }
    assert format_line(two_tags, 4) == (
        "val  4 | sokoban success 50.0% score 2.00 | frozen_lake success 25.0% score -0.50"
        " | all success 37.5% score 0.75 | 8 episodes"
    )
    assert format_line({"val/success": 1.0}, 0) == "val  0 | all success 100.0%"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.4, "59s"), (60, "1m00s"), (3599, "59m59s"), (3600, "1h00m"), (7500, "2h05m")],
)
def test_durations_read_at_the_precision_a_person_needs(seconds, text):
    assert format_duration(seconds) == text


class FakeClock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_the_eta_is_the_mean_wall_time_per_step_times_the_steps_left():
    timer = StepTimer(clock=FakeClock(100.0, 103.0, 109.0))
    # step 1 took 2 s by its own measure: 2 s × 9 steps left
    assert timer.seconds_left(1, total_steps=10, step_seconds=2.0) == 18.0
    # 3 s later (a validation ran too) step 2 ends: (2 + 3) / 2 steps = 2.5 s × 8 left
    assert timer.seconds_left(2, total_steps=10, step_seconds=2.0) == 20.0
    # logged every other step: (2 + 9) / 4 steps = 2.75 s × 6 left
    assert timer.seconds_left(4, total_steps=10, step_seconds=2.0) == 16.5

    untimed = StepTimer(clock=FakeClock(0.0, 8.0))
    assert untimed.seconds_left(5, total_steps=10) is None  # nothing measured yet
    assert untimed.seconds_left(7, total_steps=10) == 12.0  # 8 s / 2 steps × 3 left


class FlushCounter(io.StringIO):
    flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_stdout_tracker_prints_an_eta_line_per_step_and_repeats_it_in_the_console_log(tmp_path):
    stream = FlushCounter()
    console_log = tmp_path / "run" / "train.log"
    console_log.parent.mkdir()
    console_log.write_text("[hydra] a line already there\n")
    tracker = StdoutTracker(
        tmp_path / "logs" / METRICS_FILE,
        stream=stream,
        total_steps=4,
        console_log=console_log,
        timer=StepTimer(clock=FakeClock(10.0, 13.0)),
    )
    tracker.log({"train/all/success": 0.25, "time/step": 3.0}, step=1)
    tracker.log({"val/all/success": 0.5, "val/all/score": 1.5}, step=1)
    tracker.log({"train/all/success": 0.5, "time/step": 3.0}, step=2)
    tracker.close()

    lines = [
        "step 1/4 | success 25.0% | 3 s/step | ETA 9s",
        "val  1/4 | all success 50.0% score 1.50",
        "step 2/4 | success 50.0% | 3 s/step | ETA 6s",
    ]
    assert stream.getvalue().splitlines() == lines
    assert stream.flushes >= 3  # each line shows at once, in a pipe too
    assert console_log.read_text().splitlines() == ["[hydra] a line already there", *lines]
    assert read_jsonl(tmp_path / "logs" / METRICS_FILE)[1] == {
        "step": 1,
        "val/all/success": 0.5,
        "val/all/score": 1.5,
    }


def test_stdout_tracker_prints_a_line_and_writes_every_metric_to_jsonl(tmp_path, capsys):
    tracker = make_tracker("stdout", logging_dir=tmp_path, exp_name="exp")
    tracker.log(STEP_12, step=12)
    tracker.log({"train/all/score": 4}, step=13)
    # Flushed at every log: readable before close, as after a kill.
    lines = read_jsonl(tmp_path / METRICS_FILE)
    tracker.close()

    out = capsys.readouterr().out.splitlines()
    assert out == [format_line(STEP_12, 12), "step 13 | score 4.00"]
    assert lines == [{"step": 12, **STEP_12}, {"step": 13, "train/all/score": 4.0}]


def test_make_tracker_passes_the_total_and_the_console_log_to_the_stdout_line(tmp_path, capsys):
    tracker = make_tracker(
        "stdout",
        logging_dir=tmp_path / "logs",
        exp_name="exp",
        total_steps=60,
        console_log=tmp_path / CONSOLE_LOG_FILE,
    )
    tracker.log({"train/all/score": 4, "time/step": 2.0}, step=1)
    tracker.close()
    line = capsys.readouterr().out.strip()
    assert line.startswith("step  1/60 | score 4.00 | 2 s/step | ETA ")
    assert (tmp_path / CONSOLE_LOG_FILE).read_text() == line + "\n"


def test_a_resumed_run_appends_and_a_new_run_starts_the_file_anew(tmp_path):
    first = make_tracker("stdout", logging_dir=tmp_path, exp_name="exp")
    for step in (1, 2, 3):
        first.log({"loss": step}, step=step)
    first.close()
    with (tmp_path / METRICS_FILE).open("a") as file:
        file.write('{"step": 4, "lo')  # torn by a kill mid-write

    resumed = make_tracker("stdout", logging_dir=tmp_path, exp_name="exp", run_id=first.run_id)
    resumed.log({"loss": 40}, step=4)
    resumed.close()
    assert read_jsonl(tmp_path / METRICS_FILE) == [
        {"step": 1, "loss": 1.0},
        {"step": 2, "loss": 2.0},
        {"step": 3, "loss": 3.0},
        {"step": 4, "loss": 40.0},
    ]

    # Resuming from the checkpoint of step 2 drops what the interrupted run logged after it.
    again = make_tracker(
        "stdout", logging_dir=tmp_path, exp_name="exp", run_id=first.run_id, resume_step=2
    )
    again.log({"loss": 30}, step=3)
    again.close()
    assert [line["loss"] for line in read_jsonl(tmp_path / METRICS_FILE)] == [1.0, 2.0, 30.0]

    fresh = make_tracker("stdout", logging_dir=tmp_path, exp_name="exp")
    fresh.log({"loss": 0}, step=0)
    fresh.close()
    assert read_jsonl(tmp_path / METRICS_FILE) == [{"step": 0, "loss": 0.0}]


def test_the_training_step_wins_over_a_metric_named_step(tmp_path):
    tracker = make_tracker("stdout", logging_dir=tmp_path, exp_name="exp")
    tracker.log({"step": 99.0, "a": 1.0}, step=3)
    tracker.close()
    assert (tmp_path / METRICS_FILE).read_text() == '{"step": 3, "a": 1.0}\n'


def test_stdout_tracker_without_a_file_only_prints(tmp_path):
    stream = io.StringIO()
    tracker = StdoutTracker(None, stream=stream)
    tracker.log({"actor/kl": 0.25}, step=1)
    tracker.close()

    assert stream.getvalue() == "step 1 | kl 0.25\n"
    assert list(tmp_path.iterdir()) == []


def test_a_metric_that_is_not_a_number_is_refused(tmp_path):
    tracker = StdoutTracker(None, stream=io.StringIO())
    with pytest.raises(TypeError, match=r"Metric 'train/all/tag' must be a number .*, got 'a'"):
        tracker.log({"train/all/tag": "a"}, step=1)  # type: ignore[dict-item]


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        EventAccumulator,
    )

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def test_tensorboard_writes_scalars_into_the_run_folder_and_resume_purges(tmp_path):
    tracker = make_tracker(
        ["tensorboard"], logging_dir=tmp_path, exp_name="exp", config={"lr": 1e-3}
    )
    for step in (1, 2, 3):
        tracker.log({"train/all/score": step * 0.5, "actor/kl": 0.25}, step=step)
    tracker.close()
    log_dir = tmp_path / "tensorboard" / str(tracker.run_id)
    assert scalars(log_dir, "train/all/score") == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert scalars(log_dir, "actor/kl") == [(1, 0.25), (2, 0.25), (3, 0.25)]
    assert not (tmp_path / METRICS_FILE).exists()

    # Resumed from the checkpoint of step 1: the same folder, steps 2.. replaced.
    resumed = make_tracker(
        ["tensorboard"], logging_dir=tmp_path, exp_name="exp", run_id=tracker.run_id, resume_step=1
    )
    resumed.log({"train/all/score": 20.0}, step=2)
    resumed.close()
    assert resumed.run_id == tracker.run_id
    assert scalars(log_dir, "train/all/score") == [(1, 0.5), (2, 20.0)]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """wandb with no key, no mode, and all its folders in tmp: it must run offline."""
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    # Were anything to go online, it would fail at once instead of reaching the network.
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    yield tmp_path / "logs"
    import wandb

    wandb.teardown()  # forget the settings read from this test's environment


def test_wandb_runs_offline_without_a_key_and_resume_reuses_the_run_id(offline_wandb):
    logging_dir = offline_wandb
    tracker = make_tracker(
        ["stdout", "wandb"],
        logging_dir=logging_dir,
        exp_name="exp",
        config={"lr": 0.001},
        tracker_kwargs={"project": "agentgym-test", "tags": ["ci"]},
    )
    run = tracker.trackers[1]._run  # type: ignore[attr-defined]
    assert run.offline
    assert (run.project, run.name, list(run.tags)) == ("agentgym-test", "exp", ["ci"])
    assert run.config["lr"] == 0.001
    tracker.log({"train/all/score": 3.25}, step=1)
    tracker.close()

    run_id = tracker.run_id
    assert run_id == run.id
    (run_folder,) = (logging_dir / "wandb").glob(f"offline-run-*-{run_id}")
    data = wait_for_bytes(run_folder / f"run-{run_id}.wandb", b"train/all/score")
    assert b"3.25" in data
    assert read_jsonl(logging_dir / METRICS_FILE) == [{"step": 1, "train/all/score": 3.25}]

    resumed = make_tracker(["wandb"], logging_dir=logging_dir, exp_name="exp", run_id=run_id)
    resumed.log({"train/all/score": 4.0}, step=2)
    resumed.close()
    assert resumed.run_id == run_id
    # Offline, a resumed run is a second folder with the same id; `wandb sync` joins them.
    assert len(list((logging_dir / "wandb").glob(f"offline-run-*-{run_id}*"))) == 2


class FakeRun:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.id = kwargs["id"]
        self.offline = kwargs.get("mode") == "offline"
        self.dir = "/nonexistent/run/files"
        self.logged: list[tuple[dict[str, float], int]] = []
        self.finished = False

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.logged.append((metrics, step))

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    """wandb.init replaced by a recorder, to check what it is given."""
    import wandb

    runs: list[FakeRun] = []

    @functools.wraps(wandb.init)  # keeps the signature that tracker_kwargs are checked against
    def init(**kwargs: Any) -> FakeRun:
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    monkeypatch.setattr(wandb, "init", init)
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    return runs


def test_wandb_init_arguments(tmp_path, fake_wandb, monkeypatch):
    new = make_tracker("wandb", logging_dir=tmp_path, exp_name="exp", config={"seed": 1})
    new.log({"a": 1}, step=5)
    new.close()
    (run,) = fake_wandb
    assert run.kwargs == {
        "project": "agentgym",
        "name": "exp",
        "dir": str(tmp_path),
        "config": {"seed": 1},
        "id": new.run_id,
        "resume": "allow",
        "mode": "offline",
    }
    assert run.logged == [({"a": 1.0}, 5)]
    assert run.finished

    make_tracker("wandb", logging_dir=tmp_path, exp_name="exp", run_id="abc123").close()
    assert fake_wandb[-1].kwargs["id"] == "abc123"

    # A mode, WANDB_MODE or a key leave the mode to wandb / the user.
    make_tracker("wandb", logging_dir=tmp_path, exp_name="e", tracker_kwargs={"mode": "online"})
    assert fake_wandb[-1].kwargs["mode"] == "online"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    make_tracker("wandb", logging_dir=tmp_path, exp_name="e")
    assert "mode" not in fake_wandb[-1].kwargs

    # tracker_kwargs may override what make_tracker sets, the id included.
    tracker = make_tracker(
        "wandb", logging_dir=tmp_path, exp_name="e", tracker_kwargs={"id": "mine", "name": "n"}
    )
    assert (tracker.run_id, fake_wandb[-1].kwargs["name"]) == ("mine", "n")


def test_hydra_configs_reach_wandb_as_plain_dicts_and_lists(tmp_path, fake_wandb):
    from omegaconf import OmegaConf

    make_tracker(
        OmegaConf.create(["wandb"]),
        logging_dir=tmp_path,
        exp_name="exp",
        config=OmegaConf.create({"actor": {"lr": 0.1}, "envs": ["sokoban"]}),
        tracker_kwargs=OmegaConf.create({"project": "p", "tags": ["a", "b"]}),
    ).close()

    kwargs = fake_wandb[-1].kwargs
    assert type(kwargs["config"]) is dict and type(kwargs["config"]["actor"]) is dict
    assert type(kwargs["config"]["envs"]) is list
    assert type(kwargs["tags"]) is list and kwargs["tags"] == ["a", "b"]


def test_the_run_id_is_the_wandb_id_and_names_the_tensorboard_folder(tmp_path, fake_wandb):
    tracker = make_tracker(
        ["tensorboard", "wandb"],
        logging_dir=tmp_path,
        exp_name="exp",
        tracker_kwargs={"wandb": {"id": "run42"}, "tensorboard": {"flush_secs": 5}},
    )
    tracker.close()

    assert tracker.run_id == "run42"
    assert (tmp_path / "tensorboard" / "run42").is_dir()


def test_unknown_tracker_names_the_options_and_a_close_match(tmp_path):
    with pytest.raises(ValueError, match="Unknown tracker 'tensorbord'") as error:
        make_tracker(["stdout", "tensorbord"], logging_dir=tmp_path, exp_name="exp")
    assert str(list(TRACKERS)) in str(error.value)
    assert "Did you mean 'tensorboard'?" in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_unknown_tracker_kwargs_are_refused_with_a_close_match(tmp_path):
    with pytest.raises(ValueError, match=r"tracker_kwargs.projcet='x'.*Did you mean 'project'"):
        make_tracker("wandb", logging_dir=tmp_path, exp_name="exp", tracker_kwargs={"projcet": "x"})
    with pytest.raises(ValueError, match=r"tracker_kwargs.project='x' is not an argument"):
        make_tracker(
            "stdout", logging_dir=tmp_path, exp_name="exp", tracker_kwargs={"project": "x"}
        )
    with pytest.raises(ValueError, match=r"tracker_kwargs.tensorboard.flush is not .*'flush_secs'"):
        make_tracker(
            "tensorboard",
            logging_dir=tmp_path,
            exp_name="exp",
            tracker_kwargs={"tensorboard": {"flush": 1}},
        )
    with pytest.raises(ValueError, match="mixes per-tracker sections"):
        make_tracker(
            "wandb",
            logging_dir=tmp_path,
            exp_name="exp",
            tracker_kwargs={"wandb": {}, "project": "x"},
        )


def test_a_section_for_a_tracker_that_is_off_is_ignored(tmp_path):
    tracker = make_tracker(
        "stdout", logging_dir=tmp_path, exp_name="exp", tracker_kwargs={"wandb": {"project": "x"}}
    )
    tracker.close()
    assert [type(t).__name__ for t in tracker.trackers] == ["StdoutTracker"]


def test_tracker_names_from_a_string_keep_their_order_and_drop_repeats(tmp_path):
    tracker = make_tracker("tensorboard, stdout,stdout", logging_dir=tmp_path, exp_name="exp")
    tracker.close()
    assert [type(t).__name__ for t in tracker.trackers] == ["TensorBoardTracker", "StdoutTracker"]
    assert make_tracker([], logging_dir=tmp_path, exp_name="exp").trackers == ()


class Recorder:
    def __init__(self, fail_on_close: bool = False) -> None:
        self.run_id: str | None = None
        self.calls: list[tuple[Any, ...]] = []
        self.fail_on_close = fail_on_close

    def log(self, metrics, step):
        self.calls.append(("log", dict(metrics), step))

    def close(self):
        self.calls.append(("close",))
        if self.fail_on_close:
            raise OSError("flush failed")


def test_composite_fans_out_and_closes_everything_even_after_a_failure():
    first, second = Recorder(fail_on_close=True), Recorder()
    composite = CompositeTracker([first, second], run_id="r")
    assert isinstance(composite, Tracker)
    composite.log({"a": 1.0}, step=3)

    with pytest.raises(OSError, match="flush failed"):
        composite.close()
    assert first.calls == second.calls == [("log", {"a": 1.0}, 3), ("close",)]


@pytest.mark.parametrize(
    ("kind", "module", "message"),
    [
        ("wandb", "wandb", r"pip install 'agentgym\[wandb\]'"),
        ("tensorboard", "torch.utils.tensorboard", r"pip install 'agentgym\[tensorboard\]'"),
    ],
)
def test_a_missing_backend_names_what_to_install(tmp_path, monkeypatch, kind, module, message):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(ImportError, match=message):
        make_tracker(kind, logging_dir=tmp_path, exp_name="exp")


def test_progress_wraps_an_iterable_or_a_total(capsys):
    assert list(progress(range(3), desc="rollout", enabled=False)) == [0, 1, 2]
    with progress(4, desc="train", enabled=True) as bar:
        bar.update(4)
        assert bar.n == 4
    assert "train" in capsys.readouterr().err


def test_importing_the_module_imports_no_backend():
    code = (
        "import sys, agentgym.trainers.tracking; "
        "print(sorted({'wandb', 'torch', 'tensorboard'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.fixture
def offline_swanlab(tmp_path, monkeypatch):
    """SwanLab with no key and no mode: it must run offline, its files in tmp."""
    pytest.importorskip("swanlab")
    for name in ("SWANLAB_API_KEY", "SWANLAB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # its settings folder
    return tmp_path / "logs"


def test_swanlab_runs_offline_without_a_key_and_resume_reuses_the_run_id(offline_swanlab):
    logging_dir = offline_swanlab
    tracker = make_tracker(
        ["stdout", "swanlab"],
        logging_dir=logging_dir,
        exp_name="exp",
        config={"lr": 0.001},
        tracker_kwargs={"project": "agentgym-test"},
    )
    swanlab_tracker = tracker.trackers[1]
    assert swanlab_tracker.offline  # type: ignore[attr-defined]
    tracker.log({"train/all/score": 3.25}, step=1)
    tracker.close()
    run_id = tracker.run_id
    assert run_id is not None and swanlab_tracker.run_id == run_id
    (run_folder,) = (logging_dir / "swanlab").glob(f"run-*-{run_id}")
    assert b"train/all/score" in (run_folder / f"run-{run_id}.swanlab").read_bytes()
    assert read_jsonl(logging_dir / METRICS_FILE) == [{"step": 1, "train/all/score": 3.25}]

    resumed = make_tracker(["swanlab"], logging_dir=logging_dir, exp_name="exp", run_id=run_id)
    resumed.log({"train/all/score": 4.0}, step=2)
    resumed.close()
    assert resumed.run_id == run_id
    # Offline, a resumed run writes a folder with the same id (named by the second it
    # started, so the two may share one); `swanlab sync` joins them.
    folders = sorted((logging_dir / "swanlab").glob("run-*"))
    assert folders and all(folder.name.endswith(f"-{run_id}") for folder in folders)


def test_swanlab_keyword_arguments_are_checked_against_swanlab_init(offline_swanlab):
    with pytest.raises(ValueError, match="not an argument of the swanlab tracker"):
        make_tracker(
            "swanlab", logging_dir=offline_swanlab, exp_name="e",
            tracker_kwargs={"swanlab": {"entity": "x"}},
        )  # fmt: skip
