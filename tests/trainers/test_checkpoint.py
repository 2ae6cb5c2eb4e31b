"""Atomic checkpoint folders: kills and errors mid-save, pruning, overwrite, RNG round trip."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from agentgym.fileio import write_json_atomic
from agentgym.trainers.checkpoint import (
    COMPLETE_MARKER,
    LATEST_FILE,
    is_complete,
    latest_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def writer(payload: str):
    def write(folder: Path) -> None:
        (folder / "weights.txt").write_text(payload)
        (folder / "sub").mkdir()
        (folder / "sub" / "optimizer.txt").write_text(payload[::-1])

    return write


def names(root: Path) -> list[str]:
    return sorted(path.name for path in root.iterdir())


def test_save_writes_marker_latest_and_returns_the_folder(tmp_path):
    path = save_checkpoint(tmp_path, 7, writer("seven"))

    assert path == tmp_path / "checkpoint-7"
    assert (path / "weights.txt").read_text() == "seven"
    assert (path / "sub" / "optimizer.txt").read_text() == "neves"
    assert json.loads((path / COMPLETE_MARKER).read_text()) == {"step": 7}
    assert (tmp_path / LATEST_FILE).read_text().strip() == "checkpoint-7"
    assert latest_checkpoint(tmp_path) == path
    assert names(tmp_path) == ["checkpoint-7", "latest"]


def test_latest_checkpoint_of_an_empty_or_missing_root_is_none(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None


def test_keep_last_prunes_the_oldest(tmp_path):
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step, writer(str(step)), keep_last=2)

    assert names(tmp_path) == ["checkpoint-30", "checkpoint-40", "latest"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-40"


def test_keep_last_none_keeps_every_checkpoint(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, writer(str(step)), keep_last=None)

    assert names(tmp_path) == ["checkpoint-1", "checkpoint-2", "checkpoint-3", "latest"]


def test_the_new_checkpoint_survives_pruning_when_older_runs_left_higher_steps(tmp_path):
    save_checkpoint(tmp_path, 50, writer("old run"), keep_last=None)
    save_checkpoint(tmp_path, 60, writer("old run"), keep_last=None)

    path = save_checkpoint(tmp_path, 5, writer("new run"), keep_last=2)

    assert names(tmp_path) == ["checkpoint-5", "checkpoint-60", "latest"]
    assert latest_checkpoint(tmp_path) == path


def test_saving_the_same_step_again_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 3, writer("first"))
    path = save_checkpoint(tmp_path, 3, writer("second"))

    assert (path / "weights.txt").read_text() == "second"
    assert names(tmp_path) == ["checkpoint-3", "latest"]


def test_latest_naming_a_deleted_folder_falls_back_to_the_newest_complete(tmp_path):
    save_checkpoint(tmp_path, 1, writer("one"), keep_last=None)
    save_checkpoint(tmp_path, 2, writer("two"), keep_last=None)
    save_checkpoint(tmp_path, 3, writer("three"), keep_last=None)
    for file in (tmp_path / "checkpoint-3").rglob("*"):
        if file.is_file():
            file.unlink()
    for folder in sorted((tmp_path / "checkpoint-3").rglob("*"), reverse=True):
        folder.rmdir()
    (tmp_path / "checkpoint-3").rmdir()
    # An incomplete folder with a higher step and a tmp folder are never picked.
    (tmp_path / "checkpoint-9").mkdir()
    (tmp_path / ".tmp-checkpoint-10-abc").mkdir()
    (tmp_path / ".tmp-checkpoint-10-abc" / COMPLETE_MARKER).write_text("{}")

    assert (tmp_path / LATEST_FILE).read_text().strip() == "checkpoint-3"
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-2"


@pytest.mark.parametrize("content", ["", "garbage\n", "../checkpoint-2\n", "checkpoint-x"])
def test_an_unusable_latest_file_falls_back_to_scanning(tmp_path, content):
    save_checkpoint(tmp_path, 1, writer("one"), keep_last=None)
    save_checkpoint(tmp_path, 2, writer("two"), keep_last=None)
    (tmp_path / LATEST_FILE).write_text(content)

    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-2"


def test_latest_is_trusted_over_a_higher_step(tmp_path):
    save_checkpoint(tmp_path, 50, writer("old run"), keep_last=None)
    save_checkpoint(tmp_path, 5, writer("new run"), keep_last=None)

    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-5"


def test_an_error_inside_write_keeps_the_previous_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 1, writer("one"))

    def failing_write(folder: Path) -> None:
        (folder / "weights.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path, 2, failing_write)

    assert names(tmp_path) == ["checkpoint-1", "latest"]
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-1"
    assert (tmp_path / "checkpoint-1" / "weights.txt").read_text() == "one"


# A child process saves step 2; its write callback writes part of the files,
# then waits at `pause` for the test to SIGKILL it.
CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from agentgym.trainers import checkpoint

    root, pause = Path(sys.argv[1]), sys.argv[2]

    def wait_for_kill(*args, **kwargs):
        print("ready", flush=True)
        time.sleep(60)

    def write(folder):
        (folder / "weights.txt").write_text("two, half written")
        if pause == "write":
            wait_for_kill()
        (folder / "sub").mkdir()
        (folder / "sub" / "optimizer.txt").write_text("owt")

    if pause == "latest":
        checkpoint._point_latest = wait_for_kill
    checkpoint.save_checkpoint(root, 2, write)
    print("finished", flush=True)
    """
)


@pytest.mark.parametrize("pause", ["write", "latest"])
def test_a_kill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path, pause):
    save_checkpoint(tmp_path, 1, writer("one"))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), pause],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    latest = tmp_path / "checkpoint-1"
    assert latest_checkpoint(tmp_path) == latest
    assert (latest / "weights.txt").read_text() == "one"
    assert (latest / "sub" / "optimizer.txt").read_text() == "eno"
    if pause == "write":
        leftovers = [name for name in names(tmp_path) if name.startswith(".tmp-checkpoint-2-")]
        assert len(leftovers) == 1
        assert not (tmp_path / "checkpoint-2").exists()
    else:
        # Renamed into place but never named latest: complete, and harmless.
        assert is_complete(tmp_path / "checkpoint-2")

    save_checkpoint(tmp_path, 3, writer("three"), keep_last=2)

    expected_previous = "checkpoint-1" if pause == "write" else "checkpoint-2"
    assert names(tmp_path) == sorted([expected_previous, "checkpoint-3", "latest"])
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-3"


def test_invalid_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="step must be an integer ≥ 0, got -1"):
        save_checkpoint(tmp_path, -1, writer("x"))
    with pytest.raises(ValueError, match=r"step must be an integer ≥ 0, got 1\.5"):
        save_checkpoint(tmp_path, 1.5, writer("x"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep_last must be ≥ 1"):
        save_checkpoint(tmp_path, 1, writer("x"), keep_last=0)
    assert names(tmp_path) == []


def test_numpy_and_torch_integer_steps_are_accepted(tmp_path):
    steps: list[object] = [np.int64(4), torch.tensor(5)]
    paths = [save_checkpoint(tmp_path, step, writer("x")) for step in steps]  # type: ignore[arg-type]

    assert [path.name for path in paths] == ["checkpoint-4", "checkpoint-5"]


def test_write_json_atomic_replaces_the_file(tmp_path):
    path = tmp_path / "state.json"
    write_json_atomic(path, {"cursor": 1})
    write_json_atomic(path, {"cursor": 2, "tags": ["a"]})

    assert json.loads(path.read_text()) == {"cursor": 2, "tags": ["a"]}
    assert names(tmp_path) == ["state.json"]


def draw() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_state_round_trip_through_torch_save(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    draw()
    np.random.randn()  # leaves a cached Gaussian in NumPy's state
    torch.save(rng_state(), tmp_path / "rng.pt")
    expected = draw(), np.random.randn()

    draw(), np.random.randn()  # move every generator on
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))

    assert (draw(), np.random.randn()) == expected
    assert expected[0] != draw()
