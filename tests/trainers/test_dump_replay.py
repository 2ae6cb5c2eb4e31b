"""``rollout_mock`` (ROLL's dump and replay): a run dumps each step's batch; runs that
replay it train on the same data, so their step losses agree whatever their batching
or strategy, and a replay by a config that would have played other batches is refused
naming the keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.forkserver import run_python
from tests.trainers.test_train_e2e import command, train

Dumped = tuple[Path, Path, dict[int, tuple[float, float]]]
"""The dump's root folder, its folder, and the dumping run's losses."""

STEPS = ("max_steps=2", "eval_steps=0", "save_steps=2", "generation=hf")


def losses(output: Path) -> dict[int, tuple[float, float]]:
    """Each step's policy loss and gradient norm (the norm tells batches apart)."""
    lines = [json.loads(line) for line in (output / "logs" / "metrics.jsonl").open()]
    return {
        line["step"]: (line["actor/pg_loss"], line["actor/grad_norm"])
        for line in lines
        if "actor/pg_loss" in line
    }


def replayed(output: Path) -> list[Any]:
    lines = [json.loads(line) for line in (output / "logs" / "metrics.jsonl").open()]
    return [line.get("rollout/replayed") for line in lines if "actor/pg_loss" in line]


@pytest.fixture(scope="module")
def dump(
    tmp_path_factory: pytest.TempPathFactory,
) -> Dumped:
    """A 2-step run (torch, micro-batches of 4) that dumps its batches."""
    root = tmp_path_factory.mktemp("dump")
    folder, output = root / "dump", root / "dumped"
    mock = ("rollout_mock.enable=true", "rollout_mock.mode=dump", f"rollout_mock.dump_dir={folder}")
    train(output, root / "cache", *STEPS, *mock)
    assert sorted(p.name for p in folder.glob("step_*.pkl")) == [
        "step_000001.pkl", "step_000002.pkl",
    ]  # fmt: skip
    return root, folder, losses(output)


@pytest.mark.parametrize(
    "how",
    [
        (  # micro-batches of 2, accumulated 4 times
            "actor_train.training_args.per_device_train_batch_size=2",
            "actor_train.training_args.gradient_accumulation_steps=4",
        ),
        (  # ROLL's dynamic batching: micro-batches by a token budget
            "actor_train.use_dynamic_batching_in_train=true",
            "actor_train.max_tokens_per_microbatch_in_train=600",
        ),
    ],
    ids=["micro-batches", "dynamic-batching"],
)
def test_a_replay_trains_on_the_dump_with_the_same_losses(
    dump: Dumped, how: tuple[str, ...]
) -> None:
    root, folder, dumped = dump
    output = root / f"replay-{len(how[0])}"
    mock = ("rollout_mock.enable=true", "rollout_mock.mode=mock", f"rollout_mock.dump_dir={folder}")
    train(output, root / "cache", *STEPS, *mock, *how)
    assert replayed(output) == [1.0, 1.0]
    again = losses(output)
    assert sorted(again) == [1, 2]
    for step, (loss, norm) in dumped.items():
        assert again[step][0] == pytest.approx(loss, abs=1e-5), step
        assert again[step][1] == pytest.approx(norm, rel=1e-5), step


def test_a_replay_by_another_config_is_refused_naming_the_keys(
    dump: Dumped,
) -> None:
    root, folder, _ = dump
    mock = ("rollout_mock.enable=true", "rollout_mock.mode=mock", f"rollout_mock.dump_dir={folder}")
    args = command(root / "other", root / "cache", *STEPS, *mock, "seed=7", "max_turns=3")
    result = run_python(args[1:], cwd=root)
    assert result.returncode == 2
    assert "dumped by another config" in result.stderr
    assert "max_turns: dump 2, now 3" in result.stderr and "seed: dump 42, now 7" in result.stderr


@pytest.mark.ray
def test_a_replay_on_two_fsdp2_ranks_has_the_same_losses(
    dump: Dumped, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a Ray of its own
    root, folder, dumped = dump
    output = root / "replay-fsdp2"
    mock = ("rollout_mock.enable=true", "rollout_mock.mode=mock", f"rollout_mock.dump_dir={folder}")
    train(
        output, root / "cache", *STEPS, *mock, "strategy=fsdp2", "distributed=ray",
        "num_gpus_per_node=0", "++actor_train.device_mapping=[0,1]",
        "actor_train.training_args.per_device_train_batch_size=2",  # 2 × 2 accumulated × 2 ranks
    )  # fmt: skip
    again = losses(output)
    for step, (loss, norm) in dumped.items():
        assert again[step][0] == pytest.approx(loss, abs=1e-5), step
        assert again[step][1] == pytest.approx(norm, rel=1e-4), step
