"""``mode=bench`` on a finished run: one row per complete checkpoint plus the base model,
each equal to ``agentgym.eval`` on the same checkpoint and to the run's own validation."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentgym.bench import bench_checkpoints, candidates
from agentgym.errors import ConfigError
from agentgym.schema import TrainConfig, validate
from tests.forkserver import run_python

# two steps of the tiny model, a checkpoint and a validation at each; a short warm start
# (a few seconds) makes it end some answers early, so each model's figures differ
RUN = [
    "env=sokoban",
    "generation=hf",
    "max_steps=2",
    "save_steps=1",
    "eval_steps=1",
    "max_turns=2",
    "sequence_length=512",
    "generation.max_new_tokens=6",
    "train_env_manager.env_groups=2",
    "train_env_manager.group_size=2",
    "rollout_batch_size=4",
    "rollout_mode=trajectory",
    "step_advantage_weight=0",
    "val_batch_size=3",
    "val_env_manager.env_groups=3",
    "actor_train.training_args.per_device_train_batch_size=2",
    "actor_train.training_args.gradient_accumulation_steps=2",
    "actor_train.training_args.learning_rate=1e-3",
    "reward_normalization.method=identity",
    "drop_zero_variance_groups=false",
    "render_save_dir=null",
    "model.warm_start.steps=12",
    "model.warm_start.batch_size=8",
    "model.warm_start.examples_per_env=64",
    "model.warm_start.learning_rate=3e-3",
    "model.warm_start.envs={sokoban: {dim_room: [6, 6], num_boxes: 1, max_steps: 10, "
    "search_depth: 3}}",
]


def python(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = run_python(["-m", *arguments], cwd=cwd)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def records(output: Path, prefix: str) -> dict[int, dict[str, float]]:
    """The run's metrics with ``prefix`` by step (the last record of a step wins)."""
    rows: dict[int, dict[str, float]] = {}
    for line in (output / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        values = {k[len(prefix) :]: v for k, v in record.items() if k.startswith(prefix)}
        if values:
            rows[record["step"]] = values
    return rows


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run with checkpoints 1 and 2, and a checkpoint-3 whose save never finished."""
    root = tmp_path_factory.mktemp("bench")
    output = root / "run"
    python("agentgym.train", *RUN, f"model.cache_dir={root / 'cache'}", f"output_dir={output}",
           cwd=root)  # fmt: skip
    torn = output / "checkpoints" / "checkpoint-3"
    shutil.copytree(output / "checkpoints" / "checkpoint-2", torn)
    (torn / "COMPLETE").unlink()
    return output


@pytest.fixture(scope="module")
def benched(run: Path) -> dict[str, Any]:
    """``mode=bench`` on the run: its output, table, data and the metrics it logged."""
    result = python("agentgym.train", "mode=bench", f"output_dir={run}", "generation=hf",
                    cwd=run.parent)  # fmt: skip
    return {
        "stdout": result.stdout,
        "table": (run / "bench" / "bench.md").read_text(),
        "rows": json.loads((run / "bench" / "bench.json").read_text()),
        "logged": records(run, "bench/"),
        "validated": records(run, "val/"),
    }


def test_bench_has_one_row_per_complete_checkpoint_and_the_base_model(
    run: Path, benched: dict[str, Any]
) -> None:
    assert [(row["step"], row["name"]) for row in benched["rows"]] == [
        (0, "base"), (1, "checkpoint-1"), (2, "checkpoint-2"),
    ]  # fmt: skip
    assert (
        f"skipping {run / 'checkpoints' / 'checkpoint-3'}: no COMPLETE marker"
        in (benched["stdout"])
    )
    assert all(row["metrics"]["all/trajectories"] == 3.0 for row in benched["rows"])
    # the models play differently, so the equalities below would catch a mixed-up model
    assert len({json.dumps(row["metrics"]) for row in benched["rows"]}) == 3


def test_bench_logs_bench_metrics_by_step_and_writes_the_table_and_plot(
    run: Path, benched: dict[str, Any]
) -> None:
    for row in benched["rows"]:
        logged = benched["logged"][row["step"]]
        assert logged == pytest.approx(row["metrics"], abs=0), row["name"]
    lines = benched["table"].splitlines()
    assert lines[0].startswith("| step | model | episodes | success | score |")
    assert [line.split(" | ")[1] for line in lines[2:]] == ["base", "checkpoint-1", "checkpoint-2"]
    assert (run / "bench" / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_equals_the_runs_own_validation_at_each_step(benched: dict[str, Any]) -> None:
    # the run validated at steps 0 (base), 1 and 2 with the same seeds and sampling
    for row in benched["rows"]:
        validated = benched["validated"][row["step"]]
        for key in ("all/success", "all/score", "all/turns", "all/invalid_action_rate"):
            assert row["metrics"][key] == pytest.approx(validated[key], abs=1e-9), key


def test_bench_equals_eval_on_the_same_checkpoint(run: Path, benched: dict[str, Any]) -> None:
    checkpoint = run / "checkpoints" / "checkpoint-1"
    folder = run.parent / "eval"
    python("agentgym.eval", f"model.path={checkpoint}", "generation=hf",
           f"hydra.run.dir={folder}", cwd=run.parent)  # fmt: skip
    evaluated = json.loads((folder / "eval.json").read_text())["metrics"]
    row = next(row for row in benched["rows"] if row["name"] == "checkpoint-1")
    assert row["metrics"] == pytest.approx(evaluated, abs=0)


def bench_config(run: Path, **settings: Any) -> TrainConfig:
    return validate(
        {
            **TrainConfig().model_dump(),
            "mode": "bench",
            "output_dir": str(run),
            "logging_dir": str(run / "logs"),
            "generation": {**TrainConfig().generation.model_dump(), "backend": "hf"},
            **settings,
        }
    )


def test_bench_on_latest_checkpoint_evaluates_only_the_newest(
    run: Path, benched: dict[str, Any]
) -> None:
    config = bench_config(run, explorer={"name": "explorer", "bench_on_latest_checkpoint": True})
    rows = bench_checkpoints(config)
    assert [(row.step, row.name) for row in rows] == [(2, "checkpoint-2")]
    newest = next(row for row in benched["rows"] if row["name"] == "checkpoint-2")
    assert rows[0].metrics == pytest.approx(newest["metrics"], abs=0)


def test_a_run_without_checkpoints_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / "checkpoint-1").mkdir(parents=True)  # a save that never finished
    with pytest.raises(
        ConfigError, match=r"no complete checkpoint in .*checkpoints \(1 incomplete"
    ):
        candidates(tmp_path, latest_only=False)
    with pytest.raises(ConfigError, match="the trainer's: the explorer's holds no checkpoints"):
        candidates(tmp_path / "explorer", latest_only=True)


def test_without_eval_on_startup_the_base_model_is_not_benched(run: Path) -> None:
    chosen, _ = candidates(run, latest_only=False, base=False)
    assert [candidate.name for candidate in chosen] == ["checkpoint-1", "checkpoint-2"]
    config = bench_config(
        run, validation={**TrainConfig().validation.model_dump(), "on_startup": False}
    )
    assert not config.validation.on_startup  # what bench passes as base


def test_eval_of_a_run_plays_each_of_its_validation_envs_with_its_engine_arguments(
    run: Path,
) -> None:
    from agentgym.bench import eval_settings
    from agentgym.eval import eval_config, resolve_model

    model, saved = resolve_model(str(run))
    assert saved is not None
    lake = {"name": "frozen_lake", "kwargs": {"size": 4}}
    managed = {"tags": ["sokoban", "lake"], "n_groups": [2, 1], "env_configs": {"lake": lake}}
    engine = {"strategy_name": "vllm", "strategy_config": {"block_size": 32}}
    saved = {
        **saved,
        "val_env_manager": {**saved["val_env_manager"], **managed},
        "actor_infer": {**saved["actor_infer"], "strategy_args": engine},
    }
    config = eval_config(eval_settings(bench_config(run), model), saved, set())
    assert config.actor_infer.strategy_args.strategy_config == {"block_size": 32}
    assert config.val_env_manager.tags == ["sokoban", "lake"]
    assert config.val_env_manager.n_groups == [2, 1] and config.val_batch_size == 3
    assert config.val_env_manager.env_configs == {"lake": lake}
    more = eval_settings(bench_config(run), model)
    more.episodes = 4  # other counts: the groups split evenly over the tags
    config = eval_config(more, saved, {"episodes"})
    assert config.val_env_manager.n_groups is None and config.val_env_manager.env_groups == 4
    named = eval_settings(bench_config(run), model)
    named.env = {"name": "frozen_lake", "kwargs": {}}  # env=... on the command line: that env
    config = eval_config(named, saved, {"env"})
    assert config.val_env_manager.tags == ["frozen_lake"] and not config.val_env_manager.env_configs
