"""The docs' commands that start Ray (``distributed=ray``), run as
tests/test_docs_commands.py runs the others. They live here so that the docs module
stays out of the suite's one worker for Ray tests (see tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_docs_commands import ON_RAY, assert_as_documented, play

pytestmark = pytest.mark.ray


def test_the_docs_have_commands_on_ray() -> None:
    assert any(c.startswith("python -m agentgym.train env=sokoban distributed=ray") for c in ON_RAY)


@pytest.mark.parametrize("command", ON_RAY)
def test_docs_command_on_ray(command: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    assert_as_documented(play(command, tmp_path, tiny_model_dir, tmp_path), command)
