"""The recipe with async generation (the tiny model, HF generation, in process):
ratio 0 through the pipeline equals the synchronous recipe; ratios 1 and 2 train no
sample more than k versions stale; validation pauses generation; a hung weight sync
fails by name; a resume loses no episode and repeats none."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from agentgym.builders.train import build_train
from agentgym.rollout.async_rollout import WeightSyncTimeoutError
from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.source import AheadSource, StepRollout, SyncSource
from agentgym.schema import validate
from agentgym.trainers.grpo import GRPOConfig, TrainParts, train
from agentgym.trajectory import Trajectory
from tests.parts import use_backend
from tests.test_config import composed

SMALL = [
    "env=sokoban", "max_turns=2", "sequence_length=512", "generation=hf",
    "generation.max_new_tokens=6", "train_env_manager.env_groups=2",
    "train_env_manager.group_size=2", "rollout_mode=trajectory", "step_advantage_weight=0",
    "rollout_batch_size=4", "val_batch_size=2", "val_env_manager.env_groups=2",
    "actor_train.training_args.per_device_train_batch_size=2",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "actor_train.training_args.learning_rate=1e-3", "reward_normalization.method=identity",
    "drop_zero_variance_groups=false", "model.warm_start=null",
]  # fmt: skip


@dataclasses.dataclass
class Record:
    """What the recipe trained on, and every request the engine served."""

    trained: dict[int, list[Trajectory]] = dataclasses.field(default_factory=dict)
    requests: list[str] = dataclasses.field(default_factory=list)  # "train" / "val"
    metrics: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)


def build(tmp: Path, cache: Path, *overrides: str) -> tuple[GRPOConfig, TrainParts]:
    raw = composed(*SMALL, f"model.cache_dir={cache}", f"output_dir={tmp}", *overrides)
    return build_train(validate(raw), raw)


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Record:
    """Records each step's trajectories (as its source hands them to the recipe) and each
    step's metrics."""
    seen = Record()

    def recording(next_batch: Any) -> Any:
        async def recorded(source: Any, step: int) -> StepRollout:
            rollout: StepRollout = await next_batch(source, step)
            seen.trained[step] = list(rollout.trajectories)
            seen.metrics[step] = rollout.metrics  # the recipe adds the step's own
            return rollout

        return recorded

    for kind in (SyncSource, AheadSource):
        monkeypatch.setattr(kind, "next_batch", recording(kind.next_batch))
    return seen


class Labelled:
    """The engine, labelling each request train or val by the env it plays in."""

    def __init__(self, backend: Any, val_envs: set[int], record: Record) -> None:
        self.backend, self.val_envs, self.record = backend, val_envs, record

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        self.record.requests.append("val" if id(env) in self.val_envs else "train")
        return await self.backend.generate(prompt_ids, params, env=env)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


def labelled(parts: TrainParts, record: Record) -> TrainParts:
    assert parts.train is not None and parts.val is not None
    val_envs = {id(slot.env) for slot in parts.val.manager.slots}
    use_backend(parts, Labelled(parts.train.backend, val_envs, record))
    return parts


def final_weights(parts: TrainParts) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in parts.strategy.export_weights()}


def test_ratio_0_through_the_pipeline_equals_the_synchronous_recipe(
    tmp_path: Path, cache: Path, record: Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = []
    for name, pipeline in [("sync", False), ("pipeline", True)]:
        config, parts = build(tmp_path / name, cache, "max_steps=3", "eval_steps=0")
        # the scripted agent's answers do not depend on how requests are batched (the HF
        # engine's logprobs do, in the last bits, even between two synchronous runs)
        assert parts.train is not None and isinstance(parts.source, SyncSource)
        use_backend(parts, ScriptedBackend(parts.train.chat.tokenizer, "random"))
        if pipeline:  # k = 0 by the async machinery: admission, pause/sync/resume, threads
            parts.source = AheadSource(parts.train, ratio=0.0)
        record.trained.clear()
        train(config, parts)
        played = {s: [(t.group_id, t.input_ids) for t in ts] for s, ts in record.trained.items()}
        logged = {
            s: {k: v for k, v in m.items() if k.startswith(("train/", "actor/"))}
            for s, m in record.metrics.items()
        }
        runs.append((played, logged, final_weights(parts)))
    (trajectories, metrics, weights), (trajectories0, metrics0, weights0) = runs
    assert sorted(trajectories) == [1, 2, 3]
    assert trajectories0 == trajectories
    differ = {
        (step, key): (value, metrics0[step].get(key))
        for step, row in metrics.items()
        for key, value in row.items()
        if metrics0[step].get(key) != value
    }
    assert not differ and metrics0.keys() == metrics.keys()
    assert weights0.keys() == weights.keys()
    assert all(torch.equal(weights0[name], weights[name]) for name in weights)


@pytest.mark.parametrize(("ratio", "partial"), [(1, 0), (2, 0), (1, 2)])
def test_no_trained_sample_is_more_than_k_versions_stale(
    tmp_path: Path, cache: Path, record: Record, ratio: int, partial: int
) -> None:
    """With ``partial_rollout``, responses go on across syncs: a sample's first token
    still bounds its staleness, and each token's own version is counted."""
    config, parts = build(
        tmp_path,
        cache,
        "max_steps=5",
        "eval_steps=0",
        f"async_generation_ratio={ratio}",
        f"partial_rollout={partial}",
    )
    slow = parts.strategy.train_step

    def slow_step(*args: Any, **kwargs: Any) -> Any:  # a deliberately slow trainer
        import time

        time.sleep(0.3)
        return slow(*args, **kwargs)

    parts.strategy.train_step = slow_step  # type: ignore[method-assign]
    train(config, parts)
    assert sorted(record.trained) == [1, 2, 3, 4, 5]
    lags = []
    for step, trajectories in record.trained.items():
        assert [t.group_id for t in trajectories] == [2 * step - 2] * 2 + [2 * step - 1] * 2
        for t in trajectories:
            versions = [turn.policy_version for turn in t.turns]
            assert versions == sorted(versions) and versions[0] == t.policy_version
            lags.append(step - 1 - t.policy_version)  # step N updates version N - 1
        assert record.metrics[step]["async/staleness_max"] == max(
            step - 1 - t.policy_version for t in trajectories
        )
    assert max(lags) <= ratio
    assert max(lags) == ratio  # the slow trainer lets the rollout run to the bound
    tokens = [
        version
        for trajectories in record.trained.values()
        for t in trajectories
        for turn in t.turns
        for version in (turn.token_versions or [turn.policy_version] * len(turn.response_ids))
    ]
    assert bool(partial) == any(turn.token_versions for ts in record.trained.values()
                                for t in ts for turn in t.turns)  # fmt: skip
    assert tokens and all("async/token_staleness_mean" in m for m in record.metrics.values())


def test_validation_pauses_generation_and_resumes_it(
    tmp_path: Path, cache: Path, record: Record
) -> None:
    config, parts = build(
        tmp_path, cache, "max_steps=2", "eval_steps=1", "async_generation_ratio=1"
    )
    train(config, labelled(parts, record))
    requests = "".join("v" if kind == "val" else "t" for kind in record.requests)
    # three validations (steps 0, 1, 2): each a run of val requests no train request
    # interrupts; train requests come again after the first two (resumed)
    runs = [run for run in requests.split("t") if run]
    assert len(runs) == 3, requests
    lines = (tmp_path / "logs" / "metrics.jsonl").read_text()
    assert '"val/policy_version": 2.0' in lines


def test_a_hung_weight_sync_stops_the_run_by_name(tmp_path: Path, cache: Path) -> None:
    config, parts = build(
        tmp_path, cache, "max_steps=2", "eval_steps=0", "async_generation_ratio=1",
        "rpc_timeout=0.5",
    )  # fmt: skip

    async def hang(weights: Any) -> None:
        await asyncio.Event().wait()

    assert parts.train is not None
    parts.train.backend.update_weights = hang  # type: ignore[method-assign]
    with pytest.raises(WeightSyncTimeoutError, match=r"rpc_timeout=0\.5 s"):
        train(config, parts)


def test_a_resume_loses_no_episode_and_repeats_none(
    tmp_path: Path, cache: Path, record: Record
) -> None:
    common = ("eval_steps=0", "save_steps=2", "async_generation_ratio=1")
    config, parts = build(tmp_path / "whole", cache, "max_steps=4", *common)
    train(config, parts)
    whole = {step: [(t.group_id, t.seed) for t in ts] for step, ts in record.trained.items()}
    record.trained.clear()
    config, parts = build(tmp_path / "cut", cache, "max_steps=2", *common)
    train(config, parts)  # step 3's episodes were in flight at the checkpoint
    config, parts = build(tmp_path / "cut", cache, "max_steps=4", *common)
    train(config, parts, resume=True)
    cut = {step: [(t.group_id, t.seed) for t in ts] for step, ts in record.trained.items()}
    assert cut == whole
    groups = [group for pairs in cut.values() for group, _ in pairs]
    assert sorted(set(groups)) == list(range(8)) and len(groups) == 16  # 2 × 2 a step
    assert record.trained[3][0].policy_version == 2  # regenerated with the checkpoint's weights


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")
