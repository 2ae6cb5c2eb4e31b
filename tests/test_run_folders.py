"""``agentgym train`` without an ``output_dir``: each process makes a run folder of its
own, even when another process of the same command started in the same second."""

from __future__ import annotations

import multiprocessing
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from agentgym.command_line import own_run_folder, register_resolvers
from agentgym.fileio import new_folder
from tests.forkserver import run_python


def _make(path: str, start: Any, results: Any) -> None:
    start.wait()  # all at once
    results.put(new_folder(path))


def test_processes_racing_for_one_folder_each_make_their_own(tmp_path: Path) -> None:
    path = str(tmp_path / "outputs" / "train" / "run" / "2026-11-29_12-00-00")
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(4), context.Queue()
    processes = [context.Process(target=_make, args=(path, start, results)) for _ in range(4)]
    for process in processes:
        process.start()
    made = sorted(results.get(timeout=60) for _ in processes)
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    assert made == [path, f"{path}-2", f"{path}-3", f"{path}-4"]
    assert all(Path(folder).is_dir() for folder in made)


def test_a_folder_made_before_is_passed_over_and_the_answer_kept(tmp_path: Path) -> None:
    path = tmp_path / "2026-11-29_12-00-01"
    path.mkdir()
    (path / "train.log").write_text("another run's\n")
    assert new_folder(str(path)) == f"{path}-2"
    assert new_folder(str(path)) == f"{path}-2"  # asked again: the same, no -3
    assert not (tmp_path / "2026-11-29_12-00-01-3").exists()
    assert (path / "train.log").read_text() == "another run's\n"


@pytest.mark.parametrize(
    ("arguments", "ending"),
    [
        (["env=sokoban"], r"/sokoban_grpo/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d"),
        (["env=sokoban", "mode=train"], r"_\d\d-\d\d-\d\d-train"),
        (["mode=explore", "explorer.name=b"], r"_\d\d-\d\d-\d\d-explore-b"),
    ],
)
def test_the_command_lines_run_folder_is_made_once_through_hydras_grammar(
    arguments: list[str], ending: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    register_resolvers()
    overrides = own_run_folder(arguments)
    with initialize_config_module("agentgym.configs", version_base=None):
        cfg = compose("config", overrides=overrides)
    first = OmegaConf.to_container(cfg, resolve=True)
    again = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(first, dict) and isinstance(again, dict)
    folder = str(first["output_dir"])
    assert folder == again["output_dir"] and first["logging_dir"] == f"{folder}/logs"
    assert (tmp_path / folder).is_dir()
    assert re.search(ending + "$", folder), folder


def test_a_given_output_dir_is_left_as_given() -> None:
    arguments = ["env=sokoban", "output_dir=runs/mine"]
    assert own_run_folder(arguments) == arguments


def test_printing_the_resolved_config_makes_no_folder(tmp_path: Path) -> None:
    arguments = ["env=sokoban", "--cfg", "job", "--resolve"]
    assert own_run_folder(arguments) == arguments
    assert own_run_folder(["--cfg=job", "env=sokoban"]) == ["--cfg=job", "env=sokoban"]
    done = run_python(["-m", "agentgym.train", *arguments], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = yaml.safe_load(done.stdout)
    assert printed["model"]["warm_start"]["envs"]["sokoban"]["dim_room"] == [6, 6]
    assert printed["output_dir"].startswith("outputs/train/sokoban_grpo/")
    assert not (tmp_path / "outputs").exists()
