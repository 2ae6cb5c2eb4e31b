"""Trinity-RFT's config files (its async GSM8K example: an explorer, a trainer, and an
explorer that joins), saved verbatim in tests/data/trinity, read as agentgym runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentgym.envs.math_workflow.problems import generate_problems
from agentgym.errors import ConfigError
from agentgym.formats.fit import Machine
from agentgym.formats.trinity import from_trinity, load_trinity, trinity_arguments
from agentgym.job.buffer import ExperienceBuffer
from tests.forkserver import run_python, start_python

FILES = Path(__file__).parent / "data" / "trinity"
CPU = Machine(cuda=False, megatron=True, flash_attn=False)


def gsm8k_folder(root: Path, rows: int, test_rows: int = 0) -> Path:
    """A task set in openai/gsm8k's layout: subset ``main``, split ``train`` (and
    ``test``, other problems, when ``test_rows``)."""
    folder = root / "gsm8k"
    (folder / "main").mkdir(parents=True)
    card = "---\nconfigs:\n- config_name: main\n  data_files:\n"
    for split, count, seed in (("train", rows, 0), ("test", test_rows, 1)):
        if count:
            lines = [json.dumps(row) for row in generate_problems(count, seed)]
            (folder / "main" / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
            card += f"  - split: {split}\n    path: main/{split}.jsonl\n"
    (folder / "README.md").write_text(card + "---\n")
    return folder


@pytest.fixture
def taskset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = gsm8k_folder(tmp_path, 200)
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(folder))
    return folder


def arguments(name: str, *extra: str) -> dict[str, str]:
    result = trinity_arguments(["--config-path", str(FILES), "--config-name", name, *extra])
    assert result is not None
    return dict(argument.lstrip("+").split("=", 1) for argument in result[0])


def test_the_unshrunk_files_resolve_to_trinity_meanings(taskset: Path) -> None:
    explorer, trainer = arguments("explorer"), arguments("trainer")
    assert explorer["mode"] == "'explore'" and trainer["mode"] == "'train'"
    assert explorer["train_env_manager.group_size"] == "8"  # repeat_times
    assert explorer["train_env_manager.env_groups"] == "64"  # tasks per explore step
    assert trainer["rollout_batch_size"] == "512"  # experiences per optimizer step
    steps = int(trainer["actor_train.training_args.per_device_train_batch_size"]) * int(
        trainer["actor_train.training_args.gradient_accumulation_steps"]
    )
    assert steps == 512  # one optimizer step per training step
    assert trainer["actor_train.training_args.learning_rate"] == "1e-06"
    assert trainer["max_grad_norm"] == "1.0"
    assert trainer["sequence_length"] == "2048" and trainer["generation.max_new_tokens"] == "1024"
    # 200 rows, 1 epoch: 3 whole batches of 64 tasks, 8 samples each, 512 a step
    assert trainer["max_steps"] == "3" and explorer["max_steps"] == "3"
    assert trainer["actor_train.use_dynamic_batching_in_train"] == "true"
    assert trainer["actor_train.max_tokens_per_microbatch_in_train"] == "16384"
    assert explorer["env"] == "math_workflow"
    assert "subset_name: 'main'" in explorer["env.kwargs.taskset"]
    assert explorer["synchronizer.sync_interval"] == "10"
    assert explorer["max_running_requests"] == "64"  # 16 runners x 4 engines
    assert arguments("explorer_new")["explorer.name"] == "'explorer_new'"
    # Trinity's GRPO defaults, not ours
    assert trainer["drop_zero_variance_groups"] == "false"
    assert trainer["kl_loss_coef"] == "0.001" and trainer["use_kl_loss"] == "true"


def test_the_explorer_file_in_serve_mode_serves_on_trinitys_port(taskset: Path) -> None:
    served = arguments(
        "explorer", "mode=serve", "explorer.proxy_port=8010", "explorer.listen_address=0.0.0.0",
        "explorer.max_timeout=90",
    )  # fmt: skip
    assert served["mode"] == "'serve'" and served["train_env_manager.env_groups"] == "64"
    assert (served["agent.port"], served["agent.host"], served["agent.timeout"]) == (
        "8010", "'0.0.0.0'", "90",
    )  # fmt: skip


def test_fitting_lists_each_change_for_a_cpu_machine(taskset: Path) -> None:
    translation = from_trinity(load_trinity(FILES / "trainer.yaml"), machine=CPU)
    fitted = {change.key: change.fitted for change in translation.changes}
    assert fitted["num_gpus_per_node"] == 0
    assert fitted["buffer.storage_type"] == "sql"  # no Ray cluster named
    assert "queue" in translation.table()


def test_on_a_gpu_machine_the_job_trains_and_generates_on_the_gpus(taskset: Path) -> None:
    gpu = Machine(cuda=True, megatron=True, flash_attn=True)
    translation = from_trinity(load_trinity(FILES / "trainer.yaml"), machine=gpu)
    fitted = {change.key: change.fitted for change in translation.changes}
    assert fitted["model.device"] == "cuda"  # the default, cpu, would leave them idle
    assert "num_gpus_per_node" not in fitted  # the file's placement stays
    cpu = {c.key for c in from_trinity(load_trinity(FILES / "trainer.yaml"), machine=CPU).changes}
    assert "model.device" not in cpu


def test_keys_without_meaning_here_are_named(taskset: Path) -> None:
    raw = load_trinity(FILES / "trainer.yaml")
    raw["trainer"]["grad_clp"] = 1.0
    with pytest.raises(ConfigError, match=r"trainer.grad_clp.*Did you mean 'grad_clip'"):
        from_trinity(raw, machine=CPU)
    raw = load_trinity(FILES / "trainer.yaml", ["algorithm.algorithm_type=dpo"])
    with pytest.raises(ConfigError, match="DPO"):
        from_trinity(raw, machine=CPU)
    raw = load_trinity(FILES / "trainer.yaml", ["trainer.ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match="Ulysses"):
        from_trinity(raw, machine=CPU)
    raw = load_trinity(
        FILES / "trainer.yaml", ["buffer.explorer_input.taskset.format.prompt_key=problem"]
    )
    with pytest.raises(ConfigError, match="question"):  # the columns that exist
        from_trinity(raw, machine=CPU)


SHRINK = ["buffer.batch_size=2", "buffer.train_batch_size=4", "algorithm.repeat_times=2"]
"""Only the batch sizes, shrunk for a CPU (the model and task-set paths come from the
files' own ${oc.env:...})."""


def test_the_three_files_run_as_a_decoupled_job(tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = gsm8k_folder(tmp_path, 8)  # 1 epoch: 4 explore steps, 4 training steps
    env = dict(os.environ) | {
        "TRINITY_MODEL_PATH": str(tiny_model_dir),
        "TRINITY_TASKSET_PATH": str(folder),
        "TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path / "checkpoints"),
    }
    processes = {}
    # the second explorer on the HF engine: one vLLM start, not two (vLLM's weight reload
    # stays covered by the first)
    engines = {"trainer": [], "explorer": [], "explorer_new": ["generation=hf"]}
    for name, engine in engines.items():  # started together, from one folder, no output_dir
        command = [
            "-m", "agentgym.train", "--config-path", str(FILES), "--config-name", name,
            *SHRINK, *engine,
        ]  # fmt: skip
        log = tmp_path / f"{name}.log"
        processes[name] = start_python(command, cwd=tmp_path, env=env, output=log)
    try:
        for name, process in processes.items():
            assert process.wait(300) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    trainer_log = (tmp_path / "trainer.log").read_text()
    assert "Trinity config: 4 steps" in trainer_log and "machine fitting" in trainer_log
    buffer = ExperienceBuffer(tmp_path / "gsm8k.db")  # sqlite:///gsm8k.db, in the cwd
    consumed = buffer.consumed_by_step()
    assert sorted(consumed) == [1, 2, 3, 4]
    keys = [key for step in consumed.values() for key in step]
    assert len(keys) == len(set(keys)) == 8
    written = {record.name: record.written for record in buffer.explorers()}
    assert sorted(written) == ["explorer", "explorer_new"] and sum(written.values()) >= 8
    # each process its own run folder by default (the time, then -train or
    # -explore-<name>), each with its whole console log and metrics
    folders = {f.name.split("-", 5)[-1]: f for f in tmp_path.glob("outputs/train/*/*")}
    assert sorted(folders) == ["explore-explorer", "explore-explorer_new", "train"], folders
    for name, folder in folders.items():
        rows = (folder / "logs" / "metrics.jsonl").read_text()
        assert (folder / "train.log").read_text()
        assert ("actor/loss" in rows) == (name == "train")  # the trainer's rows only there
        # an explorer logs the groups it wrote; the one that started later (vLLM's
        # start) may find the other has played every group, and then has none to log
        wrote = name != "train" and written[name.removeprefix("explore-")] > 0
        assert ("explore/groups_written" in rows) == wrote


def test_agentgym_run_takes_the_file_itself() -> None:
    from agentgym.launch import arguments as run_arguments

    assert run_arguments([f"--config={FILES / 'trainer.yaml'}", "buffer.batch_size=8"]) == [
        "--config-path", str(FILES.resolve()), "--config-name", "trainer", "buffer.batch_size=8",
    ]  # fmt: skip
    with pytest.raises(SystemExit):
        run_arguments(["--config", "nowhere.yaml"])


def test_opmd_from_a_trinity_file_trains_two_steps(tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = gsm8k_folder(tmp_path, 8)  # 2 steps of 4 tasks; groups of one: OPMD's baseline 0
    env = dict(os.environ) | {
        "TRINITY_MODEL_PATH": str(tiny_model_dir),
        "TRINITY_TASKSET_PATH": str(folder),
        "TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path / "checkpoints"),
    }
    output = tmp_path / "run"
    command = [
        "-m", "agentgym.train", "--config-path", str(FILES),
        "--config-name", "opmd", "generation=hf", f"output_dir={output}",
    ]  # fmt: skip
    result = run_python(command, cwd=tmp_path, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = [json.loads(line) for line in (output / "logs" / "metrics.jsonl").open()]
    updates = [row for row in rows if "actor/grad_norm" in row]
    assert [row["step"] for row in updates] == [1, 2]
    assert all(row["actor/grad_norm"] > 0 and "actor/kl" in row for row in updates)
    assert "pg_variant: opmd" in (output / "train_config.yaml").read_text()
    assert "adv_estimator: opmd" in (output / "train_config.yaml").read_text()


def test_trinitys_quick_start_file_validates_on_its_eval_tasksets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(gsm8k_folder(tmp_path, 200, test_rows=30)))
    quick = arguments("gsm8k")  # examples/grpo_gsm8k/gsm8k.yaml, verbatim
    assert quick["val_env_manager.tags"] == "['gsm8k-eval']"
    assert quick["val_env_manager.n_groups"] == "[30]"  # every test row, once
    assert quick["val_batch_size"] == quick["val_env_manager.env_groups"] == "30"
    assert quick["val_env_manager.group_size"] == "1"
    configs = quick["val_env_manager.env_configs"]
    assert configs.startswith("{gsm8k-eval: {name: 'math_workflow'") and "split: 'test'" in configs
    assert "split: 'train'" in quick["env.kwargs.taskset"]  # the explorer's own task set
    assert quick["eval_steps"] == "50" and quick["validation.on_startup"] == "true"
    assert quick["validation.temperature"] == "1.0"  # Trinity's default rollout_args
    engine = quick["actor_infer.strategy_args.strategy_config"]
    assert (
        engine == "{enable_prefix_caching: false, gpu_memory_utilization: 0.7, enforce_eager: true}"
    )
    assert quick["actor_infer.model_args.dtype"] == "'bfloat16'" and quick["seed"] == "42"
    assert quick["save_steps"] == "100" and quick["max_grad_norm"] == "1.0"
    # explorer_input's default_workflow_type plays both task sets
    assert quick["env"] == "math_workflow"


def test_eval_tasksets_follow_trinitys_rules(taskset: Path) -> None:
    def translated(*extra: str, evals: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        raw = load_trinity(FILES / "opmd.yaml", list(extra))
        if evals is not None:
            raw["buffer"]["explorer_input"]["eval_tasksets"] = evals
        translation = from_trinity(raw, machine=CPU)
        values = dict(a.lstrip("+").split("=", 1) for a in translation.overrides)
        return {"values": values, "notes": translation.notes}

    columns = {"prompt_key": "question", "response_key": "answer"}
    plain = {"path": str(taskset), "subset_name": "main", "split": "train", "format": columns}
    assert translated(evals=[])["values"]["eval_steps"] == "0"  # nothing to evaluate
    out = translated(
        "explorer.eval_interval=5", "synchronizer.sync_interval=2",
        "explorer.eval_on_startup=false",
        evals=[{"name": "a", **plain, "repeat_times": 2}, {"storage_type": "file"}, plain],
    )  # fmt: skip
    values = out["values"]
    # the pathless one is skipped; the unnamed third is named by its place
    assert values["val_env_manager.tags"] == "['a', 'eval_taskset_2']"
    assert values["val_env_manager.n_groups"] == "[400, 200]"  # 200 rows, twice and once
    assert values["val_batch_size"] == "600"
    assert values["eval_steps"] == "4"  # rounded down to a multiple of sync_interval
    assert values["validation.on_startup"] == "false"
    assert any("eval_tasksets[1] has no path: skipped" in note for note in out["notes"])
    hot = {**plain, "rollout_args": {"temperature": 0.5}}
    with pytest.raises(ConfigError, match="temperature differ"):
        translated(evals=[{"name": "a", **plain}, {"name": "b", **hot}])
    with pytest.raises(ConfigError, match="names two eval task sets"):
        translated(evals=[{"name": "a", **plain}, {"name": "a", **plain}])
    with pytest.raises(ConfigError, match=r"eval_tasksets\[0\].shuffle.*has no counterpart"):
        translated(evals=[{"name": "a", **plain, "shuffle": True}])
    with pytest.raises(ConfigError, match=r"eval_tasksets\[0\]: .*split"):
        translated(evals=[{**plain, "split": "validation"}])
    with pytest.raises(ConfigError, match="trainer_type='megatron'"):
        translated("trainer.trainer_type=megatron")
    for name in ("math:500", "1", "null", "True", "aime 2024", "gsm8k/test"):  # not tag names
        with pytest.raises(ConfigError, match=r"eval_tasksets\[0\].name="):
            translated(evals=[{"name": name, **plain}])
    unset = {**plain, "rollout_args": {"temperature": None}}  # Trinity's default, 1.0
    assert translated(evals=[unset])["values"]["validation.temperature"] == "1.0"
    default = translated()["values"]  # no save_interval: a checkpoint at the end only
    assert default["save_steps"] == default["max_steps"] == "50"


def test_validation_covers_each_eval_row_once_every_time(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from agentgym.builders.rollouts import env_manager
    from agentgym.command_line import register_env_configs
    from agentgym.schema import validate

    folder = gsm8k_folder(tmp_path, 8, test_rows=5)
    raw = load_trinity(
        FILES / "opmd.yaml",
        [f"buffer.explorer_input.taskset.path={folder}", f"model.model_path={tiny_model_dir}"],
    )
    columns = {"prompt_key": "question", "response_key": "answer"}
    test = {"path": str(folder), "subset_name": "main", "split": "test", "format": columns}
    raw["buffer"]["explorer_input"]["eval_tasksets"] = [
        {"name": "once", **test},
        {"name": "twice", **test, "repeat_times": 2},
    ]
    register_env_configs()
    with initialize_config_module("agentgym.configs", version_base=None):
        cfg = compose("config", overrides=from_trinity(raw, machine=CPU).overrides)
    config = validate(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    manager = env_manager(config.val_env_manager, config, fixed_seeds=True)
    try:
        for _ in range(2):  # the same rows at every validation
            played: dict[str, list[int]] = {"once": [], "twice": []}
            for group in manager.assignments():
                for assignment in group:
                    assert assignment.task_index is not None  # math_workflow asks for one
                    played[assignment.slot.tag].append(assignment.task_index % 5)
            assert sorted(played["once"]) == [0, 1, 2, 3, 4]
            assert sorted(played["twice"]) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    finally:
        manager.close()


def test_the_quick_start_file_trains_and_validates_on_its_eval_tasksets(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # Trinity's quick start as written but for the model, the batch and the
    # generation budget; validation every step, not at the start
    folder = gsm8k_folder(tmp_path, 8, test_rows=3)
    env = dict(os.environ) | {
        "TRINITY_TASKSET_PATH": str(folder),
        "TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path / "checkpoints"),
    }
    output = tmp_path / "run"
    command = [
        "-m", "agentgym.train", "--config-path", str(FILES),
        "--config-name", "gsm8k", f"model.model_path={tiny_model_dir}", *SHRINK,
        "buffer.total_epochs=1", "explorer.eval_interval=1", "explorer.eval_on_startup=false",
        "model.max_response_tokens=8", "model.max_model_len=512", "generation=hf",
        f"output_dir={output}",
    ]  # fmt: skip
    result = run_python(command, cwd=tmp_path, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows = [json.loads(line) for line in (output / "logs" / "metrics.jsonl").open()]
    validated = {row["step"]: row for row in rows if "val/gsm8k-eval/trajectories" in row}
    assert sorted(validated) == [1, 2, 3, 4]  # 8 rows, 2 a step; none at step 0
    assert all(row["val/gsm8k-eval/trajectories"] == 3 for row in validated.values())
    assert all(row["val/gsm8k-eval/failed"] == 0 for row in validated.values())
