"""A plain ``gymnasium.Env`` with Text spaces, pip-installed as a plugin with an entry point,
trains with ``python -m agentgym.train env=<its name> generation=hf``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.envs.trainrun import TWO_STEPS, logged_steps, run_python, train_two_steps


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.mark.slow
def test_a_plain_gymnasium_plugin_trains_two_steps(
    plugin_site: Path, model_cache: Path, tmp_path: Path
) -> None:
    output = tmp_path / "run"
    result = train_two_steps(
        ["env=coin", "generation=hf"], output=output, model_cache=model_cache,
        pythonpath=plugin_site,
    )  # fmt: skip
    assert "generation backend: hf" in result.stdout
    steps = logged_steps(output)
    assert {1, 2} <= set(steps)
    assert steps[2]["train/coin/trajectories"] == 4.0  # 2 groups × 2 envs
    assert steps[2]["val/coin/trajectories"] == 2.0
    assert steps[2]["train/coin/failed"] == 0.0 and steps[2]["val/coin/failed"] == 0.0
    assert (output / "checkpoints" / "checkpoint-2").is_dir()


@pytest.mark.slow
def test_a_plain_gymnasium_plugin_is_played_from_the_terminal(
    plugin_site: Path, tmp_path: Path
) -> None:
    typed = "heads\ntails\ntails\n:q\n"
    result = run_python(
        ["-m", "agentgym.play", "coin", "--seed", "0", "--set", "length=3"],
        cwd=tmp_path, pythonpath=plugin_site, stdin=typed,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Guess the side of a hidden coin: answer heads or tails.")
    assert "flip 1 of 3" in result.stdout and "episode over: solved" in result.stdout


@pytest.mark.slow
def test_a_text_env_that_omits_action_is_valid_stops_training_naming_it(
    plugin_site: Path, model_cache: Path, tmp_path: Path
) -> None:
    args = ["-m", "agentgym.train", "env=forgetful_walk", "generation=hf", *TWO_STEPS]
    args += [f"model.cache_dir={model_cache}", f"output_dir={tmp_path / 'run'}"]
    result = run_python(args, cwd=tmp_path, pythonpath=plugin_site)
    assert result.returncode != 0
    assert (
        "EnvContractError: agentgym_test_plugins.walk.ForgetfulWalkEnv.step() returned an info "
        "without ['action_is_valid']"
    ) in result.stderr
