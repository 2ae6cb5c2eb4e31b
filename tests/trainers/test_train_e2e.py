"""End-to-end runs of ``python -m agentgym.train``: HF and vLLM generation,
kill-and-resume equality (tests/test_config.py checks the start-up config errors)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.forkserver import run_python

# A few fast steps with the tiny model: 2 groups × 4 envs, 2 turns, short answers.
# identity normalization without dropping groups gives every step a nonzero
# gradient even when all scores are equal, so the weights really move.
SMALL = [
    "env=sokoban",
    "max_steps=4",
    "save_steps=1",
    "eval_steps=2",
    "max_turns=2",
    "sequence_length=512",
    "generation.max_new_tokens=6",
    "train_env_manager.env_groups=2",
    "train_env_manager.group_size=4",
    "rollout_mode=trajectory",
    "step_advantage_weight=0",  # GiGPO's step term needs step mode
    "rollout_batch_size=8",
    "val_batch_size=2",
    "val_env_manager.env_groups=2",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=2",
    "actor_train.training_args.learning_rate=1e-3",
    "reward_normalization.method=identity",
    "drop_zero_variance_groups=false",
    "model.cache_dir={cache}",
    "model.warm_start=null",  # random weights: fast, and independent of the warm start
]


def command(output: Path, cache: Path, *overrides: str) -> list[str]:
    small = [item.format(cache=cache) for item in SMALL]
    return [
        sys.executable, "-m", "agentgym.train", *small, f"output_dir={output}", *overrides
    ]  # fmt: skip


def train(output: Path, cache: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    result = run_python(command(output, cache, *overrides)[1:], cwd=output.parent)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def metrics(output: Path) -> dict[int, dict[str, Any]]:
    """Train metrics by step (validation lines and timings left out)."""
    rows: dict[int, dict[str, Any]] = {}
    for line in (output / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        values = {k: v for k, v in record.items() if k.startswith(("train/", "actor/"))}
        if values:
            rows[record["step"]] = values
    return rows


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def test_train_with_hf_writes_metrics_checkpoints_and_renders(tmp_path: Path, cache: Path) -> None:
    output = tmp_path / "run"
    result = train(output, cache, "generation=hf")
    assert "generation backend: hf" in result.stdout
    steps = metrics(output)
    assert sorted(steps) == [1, 2, 3, 4]
    assert all(row["actor/updates"] == 1.0 for row in steps.values())  # 8 samples, 4 × 2 a step
    # the run names its ruleset: each env's full id and generator version
    sokoban = {"id": "agentgym/Sokoban-v0", "generator_version": 1, "plugin": None}
    first = json.loads((output / "logs" / "metrics.jsonl").read_text().splitlines()[0])
    assert first == {"step": 0, "run": {"envs": {"sokoban": sokoban}}}
    meta = json.loads((output / "meta.json").read_text())
    assert meta["envs"] == {"sokoban": sokoban}
    # what ran, in meta.json and train.log: the backend and its engine, the config
    assert (meta["mode"], meta["backend"], meta["strategy"]) == ("both", "hf", "torch")
    assert meta["engine"].startswith("transformers ") and meta["config"]["max_steps"] == 4
    log = (output / "train.log").read_text()
    assert "backend: hf" in log and f"engine: {meta['engine']}" in log
    assert "== resolved config ==" in log and "max_steps: 4" in log
    assert all(row["actor/grad_norm"] > 0 for row in steps.values())
    assert (output / "checkpoints" / "latest").read_text().strip() == "checkpoint-4"
    assert (output / "checkpoints" / "checkpoint-4" / "model" / "config.json").is_file()
    renders = output / "renders"
    assert (renders / "index.html").is_file()
    assert len(list(renders.glob("step0_*.gif"))) == 2
    assert len(list(renders.glob("step4_*.html"))) == 2
    # the end-of-run report: validation at start and end, the plot, where things are
    assert "validation success: " in result.stdout and " points)" in result.stdout
    plot = output / "validation.png"
    assert f"plot: {plot}" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"renders: {renders / 'index.html'}" in result.stdout


def validation(output: Path) -> dict[int, dict[str, Any]]:
    """Validation results by step (``val/policy_version`` aside: it counts the steps)."""
    rows: dict[int, dict[str, Any]] = {}
    for line in (output / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        values = {
            k: v for k, v in record.items() if k.startswith("val/") and k != "val/policy_version"
        }
        if values:
            rows[record["step"]] = values
    return rows


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_learning_rate_zero_is_a_control_with_identical_validation(
    tmp_path: Path, cache: Path
) -> None:
    # The control run of docs/benchmarks.md: with lr 0 the weights never change although the
    # gradients are not 0, so the seeded validation on fixed seeds repeats exactly.
    common = ("generation=hf", "eval_steps=2", "save_steps=4")
    control, trained = tmp_path / "control", tmp_path / "trained"
    train(control, cache, *common, "actor_train.training_args.learning_rate=0")
    train(trained, cache, *common, "actor_train.training_args.learning_rate=1e-2")
    frozen, moved = validation(control), validation(trained)
    assert sorted(frozen) == sorted(moved) == [0, 2, 4]
    assert frozen[0] == moved[0]  # same start: same model, seeds and sampling
    assert frozen[2] == frozen[0] and frozen[4] == frozen[0]
    assert any(row["actor/grad_norm"] > 0 for row in metrics(control).values())
    (start,) = cache.glob("tiny-*")  # the model both runs started from
    initial = weights(start)
    after_control = weights(control / "checkpoints" / "checkpoint-4" / "model")
    after_training = weights(trained / "checkpoints" / "checkpoint-4" / "model")
    assert after_control.keys() == initial.keys() == after_training.keys()
    assert all(torch.equal(after_control[name], initial[name]) for name in initial)
    assert not all(torch.equal(after_training[name], initial[name]) for name in initial)


def process_state(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a live process, from /proc; None once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else (fields[0], int(fields[1]))


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    pids = (int(path.name) for path in Path("/proc").iterdir() if path.name.isdigit())
    return [child for child in pids if (state := process_state(child)) and state[1] == pid]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_sigterm_ends_the_run_and_its_vllm_engine(tmp_path: Path, cache: Path) -> None:
    # A run stopped with SIGTERM (kill, a scheduler) must not leave vLLM's
    # engine process behind, spinning on the CPU.
    if os.environ.get("AGENTGYM_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm")
    output = tmp_path / "run"
    process = subprocess.Popen(
        command(output, cache, "generation=vllm", "max_steps=1000", "eval_steps=0"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip
    marker = output / "checkpoints" / "checkpoint-1" / "COMPLETE"
    deadline = time.monotonic() + 300
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), "the run never finished a step"
    engines = children(process.pid)
    assert engines, "vLLM's engine runs in a child process"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) != 0
    deadline = time.monotonic() + 30
    while any(process_state(pid) for pid in engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in engines if process_state(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "the engine outlived the run"


def kill_after_checkpoint(output: Path, cache: Path, *overrides: str) -> int:
    """Start a run, SIGKILL it once checkpoint-2 is complete; return the steps it logged."""
    output.mkdir()
    process = subprocess.Popen(
        command(output, cache, *overrides),
        cwd=output.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    marker = output / "checkpoints" / "checkpoint-2" / "COMPLETE"
    deadline = time.monotonic() + 300
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    engines = children(process.pid)  # vLLM's engine process, which the kill would orphan
    process.send_signal(signal.SIGKILL)
    process.wait()
    for engine in engines:
        os.kill(engine, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(process_state(pid) for pid in engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in engines if process_state(pid)], "an engine outlived the test"
    assert marker.exists()
    killed_at = len(metrics(output))
    assert killed_at < 4  # killed before the end
    return killed_at


def test_kill_and_resume_reproduces_the_uninterrupted_run(tmp_path: Path, cache: Path) -> None:
    reference = tmp_path / "reference"
    train(reference, cache, "generation=hf", "eval_steps=0")
    resumed = tmp_path / "resumed"
    kill_after_checkpoint(resumed, cache, "generation=hf", "eval_steps=0")
    result = train(resumed, cache, "generation=hf", "eval_steps=0", "resume_from_checkpoint=true")
    assert f"resumed from {resumed / 'checkpoints' / 'checkpoint-2'} at step 2" in result.stdout
    expected, got = metrics(reference), metrics(resumed)
    assert sorted(got) == [1, 2, 3, 4]
    for step in range(1, 5):
        assert got[step].keys() == expected[step].keys()
        for key, value in expected[step].items():
            assert got[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)


# GAE with its critic, the adaptive KL coefficient and running reward statistics:
# all of it must come back from a checkpoint for the resumed run to repeat the
# uninterrupted one.
GAE = (
    "adv_estimator=gae", "critic_warmup=1", "value_clip=0.2",
    "critic.training_args.per_device_train_batch_size=4",
    "critic.training_args.gradient_accumulation_steps=1",
    "add_token_level_kl=true", "target_kl=0.01", "reward_norm=running", "whiten_rewards=true",
)  # fmt: skip


def all_metrics(output: Path) -> dict[int, dict[str, Any]]:
    """Every logged metric but the timings, by step (train, actor and critic)."""
    rows: dict[int, dict[str, Any]] = {}
    for line in (output / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        values = {k: v for k, v in record.items() if k.startswith(("train/", "actor/", "critic/"))}
        if values:
            rows[record["step"]] = values
    return rows


def test_kill_and_resume_with_a_critic_reproduces_the_uninterrupted_run(
    tmp_path: Path, cache: Path
) -> None:
    reference = tmp_path / "reference"
    train(reference, cache, "generation=hf", "eval_steps=0", *GAE)
    resumed = tmp_path / "resumed"
    kill_after_checkpoint(resumed, cache, "generation=hf", "eval_steps=0", *GAE)
    train(resumed, cache, "generation=hf", "eval_steps=0", "resume_from_checkpoint=true", *GAE)
    expected, got = all_metrics(reference), all_metrics(resumed)
    assert sorted(got) == [1, 2, 3, 4]
    assert "actor/updates" in expected[1] and "actor/loss" not in expected[1]  # warmup
    for step in range(1, 5):
        assert got[step].keys() == expected[step].keys()
        assert {"critic/vf_loss", "actor/kl_coef"} <= got[step].keys()
        for key, value in expected[step].items():
            # rel 1e-4: the critic's step-4 values came out 1.8e-5 apart once in CI (cause
            # not found yet); the policy's kill-and-resume test holds 1e-5
            assert got[step][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, key)
    assert expected[4]["actor/kl_coef"] != expected[1]["actor/kl_coef"]  # it adapted


def test_kill_and_resume_on_vllm_samples_with_the_checkpoint(tmp_path: Path, cache: Path) -> None:
    # vLLM on CPU ignores per-request seeds, so the resumed run cannot repeat the
    # uninterrupted one; what must hold is that the engine samples from the
    # checkpoint's weights: the trainer's recomputed π_old equals the engine's.
    if os.environ.get("AGENTGYM_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm")
    overrides = ("generation=vllm", "eval_steps=0", "old_logprobs=trainer")
    output = tmp_path / "run"
    kill_after_checkpoint(output, cache, *overrides, "actor_train.training_args.learning_rate=1e-2")
    result = train(
        output, cache, *overrides, "actor_train.training_args.learning_rate=1e-2",
        "resume_from_checkpoint=true",
    )  # fmt: skip
    assert "resumed from" in result.stdout and "generation backend: vllm" in result.stdout
    steps = metrics(output)
    assert sorted(steps) == [1, 2, 3, 4]
    # π_old recomputed by the trainer: the gap to vLLM's logprobs stays at float noise,
    # before the kill and from the first resumed step on
    assert all(row["actor/engine_logprob_abs_diff_mean"] < 1e-3 for row in steps.values())
    assert (output / "checkpoints" / "checkpoint-4").is_dir()


@pytest.mark.parametrize(
    "overrides",
    [
        (
            "use_kl_loss=true", "kl_penalty=full", "entropy_loss_coef=0.01", "tis_cap=2.0",
            "old_logprobs=trainer",
            "dual_clip_ratio_c=3.0", "loss_agg_mode=seq-mean-token-sum-norm", "ppo_epochs=2",
        ),
        (
            "adv_estimator=reinforce", "add_token_level_kl=true", "rollout_mode=step",
            "step_advantage_weight=1.0",
            "reward_normalization.grouping=inductive", "advantage_clip=2.0",
            "tracker=tensorboard",
        ),
        (
            "sft_loss_coef=0.1", "use_topr_loss=true", "rl_loss_coef=0.5",
            "length_loss_weight=true", "dual_clip_loss=true", "use_reward_scaling=true",
            "reward_clip=3.0", "tracker=swanlab",
        ),
    ],
)  # fmt: skip
def test_every_loss_term_runs_through_the_recipe(
    tmp_path: Path, cache: Path, overrides: tuple[str, ...]
) -> None:
    output = tmp_path / "run"
    train(output, cache, "generation=hf", "max_steps=2", "eval_steps=0", *overrides)
    steps = metrics(output)
    assert sorted(steps) == [1, 2]
    for row in steps.values():
        assert all(value == value for value in row.values())  # no NaN
        assert row["actor/grad_norm"] > 0
    if "use_kl_loss=true" in overrides:
        assert "actor/kl" in steps[2] and "actor/entropy" in steps[2]
        assert "actor/is_weight_mean" in steps[2]
        assert steps[2]["actor/updates"] == 2.0  # two PPO epochs of one mini-batch
    elif "use_topr_loss=true" in overrides:
        assert "actor/sft_loss" in steps[2] and "actor/dual_clipfrac" in steps[2]
        assert "train/reward_clip_frac" in steps[2]
        assert list((output / "logs" / "swanlab").glob("run-*"))
    else:
        assert "actor/token_level_kl" in steps[2]
        assert 0 <= steps[2]["train/anchor_state_share"] <= 1  # GiGPO's anchor states
        assert list((output / "logs" / "tensorboard").iterdir())


def test_a_trained_checkpoint_evaluates_as_it_validated(tmp_path: Path, cache: Path) -> None:
    # eval reads the run's saved config: same env, rollout mode, history, turns,
    # sampling and validation seeds; with seeded HF generation the same weights
    # score exactly what the run's last validation said
    output = tmp_path / "run"
    overrides = ("generation=hf", "val_batch_size=6", "val_env_manager.env_groups=6")
    train(output, cache, *overrides, "rollout_mode=step", "step_advantage_weight=1.0")
    last = validation(output)[4]
    result = run_python(
        ["-m", "agentgym.eval", f"model.path={output}", "generation=hf",
         f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "playing as the training run validated: env sokoban, step mode" in result.stdout
    assert "checkpoint-4/model" in result.stdout
    evaluated = json.loads((tmp_path / "eval" / "eval.json").read_text())
    rendered = {
        int(p.name.split("_seed")[1].split("_")[0])
        for p in (output / "renders").glob("step4_*.html")
    }
    assert rendered and rendered <= {episode["seed"] for episode in evaluated["episodes"]}
    report = evaluated["metrics"]
    assert report["all/trajectories"] == 6.0
    for key in ("all/success", "all/score", "all/turns", "all/invalid_action_rate"):
        assert report[key] == pytest.approx(last[f"val/{key}"], abs=1e-9), key


def default_sigint() -> None:
    """In the child: SIGINT's default action, even when the test runner was started in
    the background of a non-interactive shell (which sets it to ignored, inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_ends_with_one_line_saying_how_to_resume(tmp_path: Path, cache: Path) -> None:
    output = tmp_path / "run"
    process = subprocess.Popen(
        command(output, cache, "generation=hf", "max_steps=1000", "eval_steps=0"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        preexec_fn=default_sigint,
    )  # fmt: skip
    marker = output / "checkpoints" / "checkpoint-1" / "COMPLETE"
    deadline = time.monotonic() + 300
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the run never finished a step"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130
    assert "Traceback" not in stderr
    line = next(line for line in stderr.splitlines() if line.startswith("interrupted at step"))
    assert "last checkpoint: " in line and "checkpoint-" in line
    assert f"output_dir={output} resume_from_checkpoint=true" in line
