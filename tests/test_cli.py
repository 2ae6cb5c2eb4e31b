"""The ``agentgym`` console command: every tool under one name, a close match for a
misspelt command, and the commands' own ``--help`` under the same program name."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from agentgym.cli import COMMANDS, main
from tests.forkserver import run_python
from tests.trainers.test_train_e2e import SMALL


def test_every_command_names_a_module_with_main() -> None:
    for command in COMMANDS.values():
        assert callable(importlib.import_module(command.module).main)
    assert list(COMMANDS) == ["train", "eval", "bench", "play", "plan", "run", "serve-env"]


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(f"\n  {name} " in out for name in COMMANDS)


@pytest.mark.parametrize(
    ("typed", "meant"), [("trian", "train"), ("plya", "play"), ("evla", "eval")]
)
def test_a_misspelt_command_gets_the_closest_one(
    typed: str, meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([typed])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"unknown command {typed!r}; did you mean {meant!r}?" in err
    assert all(name in err for name in COMMANDS)


def test_a_command_far_from_any_gets_the_list_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["xyzzy"])
    assert exit_.value.code == 2
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("name", ["train", "eval", "play", "plan", "run"])
def test_each_commands_help_names_it_as_agentgym_does(name: str) -> None:
    result = run_python(["-m", "agentgym.cli", name, "--help"], cwd=Path.cwd(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"usage: agentgym {name} " in result.stdout


def test_agentgym_train_trains(tmp_path: Path) -> None:
    small = [item.format(cache=tmp_path / "cache") for item in SMALL]
    arguments = [*small, "max_steps=2", "eval_steps=0", "save_steps=2", "generation=hf"]
    output = tmp_path / "run"
    result = run_python(
        ["-m", "agentgym.cli", "train", *arguments, f"output_dir={output}"], cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [json.loads(line).get("step") for line in (output / "logs" / "metrics.jsonl").open()]
    assert max(s for s in steps if s is not None) == 2
