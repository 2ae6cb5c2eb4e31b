"""The ``agentgym`` console command."""

from __future__ import annotations

import pytest

from agentgym.cli import COMMANDS, main


def test_every_command_names_a_module_with_main() -> None:
    import importlib

    for module, _ in COMMANDS.values():
        assert callable(importlib.import_module(module).main)


def test_unknown_command_exits_2_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["nope"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unknown command 'nope'" in err
    assert all(name in err for name in COMMANDS)


def test_a_command_gets_the_remaining_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["play", "--help"])
    assert exit_.value.code == 0
    assert "--seed" in capsys.readouterr().out
