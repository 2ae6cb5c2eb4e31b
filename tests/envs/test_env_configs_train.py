"""Every env config in ``configs/env/`` trains from its name: ``python -m agentgym.train
env=<name> max_steps=2`` exits 0 with steps logged, on the budgets the env config
sets (only the batch, the warm start and the backend are shrunk for time), and an
argument the env rejects fails before any model work."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.envs.trainrun import logged_steps, run_python

TRAINED_ELSEWHERE = {"math_workflow": "tests/envs/test_math_workflow.py::test_train_two_steps"}
"""Env configs whose own test trains them from their name (and checks their metrics):
each run costs CI ~25 s, so it runs once."""
ENV_CONFIGS = sorted(
    p.stem
    for p in (Path(__file__).parents[2] / "configs" / "env").glob("*.yaml")
    if p.stem not in TRAINED_ELSEWHERE
)

# A plain Gymnasium text env (the test plugin's coin) under an id its module registers.
REGISTERING_MODULE = (
    "import gymnasium\n"
    "gymnasium.register('coin_cfg/Coin-v0', 'agentgym_test_plugins.coin:CoinEnv')\n"
)
GYMNASIUM_ID = "coin_cfg_registering:coin_cfg/Coin-v0"

# 2 groups × 2 episodes a step, 2 validation episodes, 3 turns (enough for the
# longest history window an env config keeps, 2 turns); a 2-step warm start on 8
# demonstrations (the env's expert all the same); HF generation (starts at once).
# sequence_length, max_new_tokens and history_length are the env config's.
TWO_STEPS = [
    "max_steps=2",
    "save_steps=2",
    "eval_steps=2",
    "max_turns=3",
    "train_env_manager.env_groups=2",
    "train_env_manager.group_size=2",
    "rollout_batch_size=4",
    "val_batch_size=2",
    "val_env_manager.env_groups=2",
    "generation=hf",
    "model.warm_start.steps=2",
    "model.warm_start.batch_size=4",
    "model.warm_start.examples_per_env=8",
    "render_save_dir=null",
]


def train_env(
    env: str, root: Path, model_cache: Path, plugin_site: Path
) -> tuple[Path, str | None]:
    """``python -m agentgym.train env=<env>`` two steps in ``root``: its output folder
    and, on failure, stderr."""
    root.mkdir(parents=True)
    output = root / "run"
    overrides = [f"env={env}", *TWO_STEPS]
    if env == "gymnasium":  # `python -m` imports from its working folder, root
        (root / "coin_cfg_registering.py").write_text(REGISTERING_MODULE)
        overrides.append(f"env.name={GYMNASIUM_ID}")
    started = time.monotonic()
    args = ["-m", "agentgym.train", *overrides]
    args += [f"model.cache_dir={model_cache}", f"output_dir={output}"]
    result = run_python(args, cwd=root, pythonpath=plugin_site)
    print(f"env={env}: {time.monotonic() - started:.1f} s")
    return output, (None if result.returncode == 0 else result.stderr[-4000:])


@pytest.fixture(scope="module")
def trained(
    plugin_site: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, str | None]]:
    """Every env config's run, two at a time (separate processes; the tiny models they
    build in the shared cache are built into temporary folders and renamed)."""
    root = tmp_path_factory.mktemp("env-configs")
    cache = root / "model-cache"
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            env: pool.submit(train_env, env, root / env, cache, plugin_site) for env in ENV_CONFIGS
        }
        return {env: future.result() for env, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("env", ENV_CONFIGS)
def test_every_env_config_trains_from_its_name(
    env: str, trained: dict[str, tuple[Path, str | None]]
) -> None:
    output, failure = trained[env]
    assert failure is None, failure
    steps = logged_steps(output)
    tag = env if env != "gymnasium" else GYMNASIUM_ID
    for step in (1, 2):
        assert steps[step][f"train/{tag}/trajectories"] == 4.0  # 2 groups × 2 episodes
        assert steps[step][f"train/{tag}/failed"] == 0.0
    for step in (0, 2):
        assert steps[step][f"val/{tag}/trajectories"] == 2.0
        assert steps[step][f"val/{tag}/failed"] == 0.0
    # the budgets fit: the first prompt and a whole response fit sequence_length
    assert all(steps[s][f"train/{tag}/turns"] >= 1 for s in (1, 2))


def test_an_argument_the_env_rejects_fails_before_any_model_work(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "agentgym.train", "env.kwargs.dim_room=[2,2]",
         f"model.cache_dir={cache}", f"output_dir={tmp_path / 'run'}"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    print(f"failed in {time.monotonic() - started:.1f} s")
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        "config error: env 'sokoban' rejects its arguments (env.kwargs.dim_room=[2, 2]): "
        "ValueError: dim_room must be at least (3, 3), got (2, 2)"
    ) in result.stderr
    assert not cache.exists()  # no model was built
    assert not (tmp_path / "run" / "checkpoints").exists()
