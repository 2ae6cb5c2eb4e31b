"""Failures that speak: a crashing plugin env or a dead engine stops the run with a
non-zero exit and the first traceback; nothing trains on all-failed rollouts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.forkserver import run_python
from tests.servers import free_port
from tests.trainers.test_train_e2e import command

CRASHING_PLUGIN = '''
from agentgym.envs.text_env import TextEnv


class CrashingEnv(TextEnv):
    """An env whose reset always fails."""

    action_names = ("Left", "Right")

    def _reset(self, options):
        raise RuntimeError("crashing_env cannot reset: its data file is missing")

    def _apply(self, action):
        return 0.0, False

    def _observation(self):
        return ""

    def _success(self):
        return False
'''


def install_plugin(root: Path) -> dict[str, str]:
    """A distribution with an ``agentgym.envs`` entry point; the environment to see it."""
    (root / "agentgym_crash_plugin.py").write_text(CRASHING_PLUGIN)
    dist_info = root / "agentgym_crash_plugin-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: agentgym-crash-plugin\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        "[agentgym.envs]\ncrashing_env = agentgym_crash_plugin:CrashingEnv\n"
    )
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def test_a_plugin_env_that_always_fails_stops_the_run_with_its_traceback(
    tmp_path: Path, cache: Path
) -> None:
    # the env is built and reset once before any model work: the run stops there
    env = install_plugin(tmp_path)
    arguments = command(tmp_path / "run", cache, "generation=hf")
    arguments[arguments.index("env=sokoban")] = "env=crashing_env"
    result = run_python(arguments[1:], cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "config error: env 'crashing_env'" in result.stderr
    assert not (tmp_path / "run" / "meta.json").exists()  # written once the parts are built
    assert "RuntimeError: crashing_env cannot reset: its data file is missing" in result.stderr
    assert "agentgym_crash_plugin.py" in result.stderr  # the env's own frame, not just ours
    assert not (tmp_path / "run" / "checkpoints").exists()  # it never trained


def test_a_dead_openai_server_stops_the_run(tmp_path: Path, cache: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    arguments = command(tmp_path / "run", cache, "generation=openai", f"generation.base_url={url}")
    result = run_python(arguments[1:], cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "generation_error" in result.stderr
    assert f"POST {url}/v1/completions failed" in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
