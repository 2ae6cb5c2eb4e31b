"""Five bad inputs a newcomer makes: each ends in one ``config error:`` line naming the
key as it was written, exit code 2, no traceback, in seconds, and leaves no run folder
that does not say why it stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.forkserver import run_python

ROLL = Path(__file__).parent / "data" / "roll"


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (["env=sokoban", "mode=explor"], "Did you mean 'explore'?"),
        (["env=sokoban", "env.kwargs.dim_rom=6"], "env.kwargs.dim_rom: env 'sokoban' takes no"),
        (["--config-path", "roll", "--config-name", "agentic_sokobn"], "Did you mean"),
        (["--config-path", "rol", "--config-name", "agentic_sokoban"], "no such folder"),
        (["env=sokoban", "model.path=Qwen/Qwen2.5-0.5B"], "model.path='Qwen/Qwen2.5-0.5B' is not"),
    ],
)
def test_a_bad_input_gets_one_line_and_exit_2(
    tmp_path: Path, arguments: list[str], says: str
) -> None:
    (tmp_path / "roll").symlink_to(ROLL)  # a ROLL file given relative to the working folder
    result = run_python(["-m", "agentgym.train", *arguments], cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: "), result.stderr
    assert says in lines[0] and "Traceback" not in result.stdout + result.stderr
    for log in (tmp_path / "outputs").rglob("train.log"):  # a run folder says why it stopped
        assert lines[0] in log.read_text()


def test_a_relative_roll_path_runs_from_the_working_folder(tmp_path: Path) -> None:
    (tmp_path / "roll").symlink_to(ROLL)
    result = run_python(
        ["-m", "agentgym.train", "--config-path", "roll", "--config-name", "agentic_sokoban",
         "--cfg", "job"], cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "custom_envs" in result.stdout


MY_RUN = """\
env: frozen_lake            # a config group: picks its option
max_steps: 5
generation:
  max_new_tokens: 64
"""


@pytest.mark.parametrize("how", ["--config-path", "agentgym run"])
def test_a_config_file_of_your_own_holds_only_the_keys_it_changes(tmp_path: Path, how: str) -> None:
    (tmp_path / "my_run.yaml").write_text(MY_RUN)
    if how == "agentgym run":
        command = ["-m", "agentgym.cli", "run", "--config", "my_run.yaml", "max_steps=7"]
    else:
        command = ["-m", "agentgym.train", "--config-path", ".", "--config-name", "my_run"]
    result = run_python([*command, "--cfg", "job"], cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    steps = "max_steps: 7" if how == "agentgym run" else "max_steps: 5"  # the command line last
    assert steps in lines and "  max_new_tokens: 64" in lines and "  name: frozen_lake" in lines


def test_a_misspelt_key_in_your_config_file_gets_its_close_match(tmp_path: Path) -> None:
    (tmp_path / "my_run.yaml").write_text("max_step: 5\n")
    result = run_python(
        ["-m", "agentgym.train", "--config-path", ".", "--config-name", "my_run"],
        cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "max_steps" in result.stderr, result.stderr[-2000:]
