"""Megatron training against the torch strategy in one process: two GRPO updates
(6 micro-batches each) give the same metrics and weights (1e-5) at DP=2, TP=2 and
PP=2 over gloo; every loss_agg_mode gives the torch strategy's loss and step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from agentgym.trainers.strategies.torch_strategy import TorchStrategy
from agentgym.trainers.updates import update_policy
from tests.trainers.megatron.launch import model_dir, spawn
from tests.trainers.megatron.ranks import (
    LAYOUTS,
    LOSS_AGG_MODES,
    PROMPT,
    SETTINGS,
    UNCLIPPED,
    grpo_config,
    train_every_layout,
    two_steps,
)
from tests.trainers.test_update_path import WIDTH, ragged_batch


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_dir(tmp_path_factory.mktemp("megatron-train"))


@pytest.fixture(scope="module")
def torch_run(qwen_dir: Path) -> Any:
    return two_steps(TorchStrategy(qwen_dir, **SETTINGS))


def assert_same_run(first: Any, second: Any) -> None:
    for one, two in zip(first[0], second[0], strict=True):
        assert one.keys() == two.keys()
        for key in one:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    assert first[1].keys() == second[1].keys()
    for name, tensor in first[1].items():
        torch.testing.assert_close(second[1][name], tensor, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def megatron_runs(qwen_dir: Path) -> dict:
    return spawn(2, train_every_layout, qwen_dir)  # one pair of processes for all layouts


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_two_updates_equal_the_torch_strategy(
    qwen_dir: Path, torch_run: Any, megatron_runs: dict, layout: str
) -> None:
    run = megatron_runs["runs"][layout]
    assert_same_run(torch_run, run)
    # the updates moved the weights: the comparison is not between untouched models
    initial = dict(TorchStrategy(qwen_dir, **SETTINGS).export_weights())
    assert any(not torch.equal(run[1][name], initial[name]) for name in initial)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_head_runs_from_the_first_scored_token_and_trains_as_the_torch_strategy(
    qwen_dir: Path, megatron_runs: dict, layout: str
) -> None:
    run, positions = megatron_runs["prompted"][layout]
    # every training pass's head skipped the prompt (positions T - first + 1, first >= 5)
    assert positions and all(p <= WIDTH - PROMPT + 1 for p in positions), positions
    # ... and the step is the torch strategy's (which cuts its head there too)
    assert_same_run(two_steps(TorchStrategy(qwen_dir, **SETTINGS), prompt=True), run)


def test_an_unclipped_step_reports_the_gradient_norm_as_the_torch_strategy(
    qwen_dir: Path, megatron_runs: dict
) -> None:
    run = megatron_runs["unclipped"]  # DP=2
    assert all(metrics["actor/grad_norm"] > 0 for metrics in run[0])
    assert_same_run(
        two_steps(TorchStrategy(qwen_dir, **(SETTINGS | {"optimizer": UNCLIPPED}))), run
    )


def test_every_loss_agg_mode_equals_the_torch_strategy(qwen_dir: Path, megatron_runs: dict) -> None:
    reference = TorchStrategy(qwen_dir, **SETTINGS)
    expected = [
        update_policy(grpo_config(mode), reference, ragged_batch(index), index + 1)
        for index, mode in enumerate(LOSS_AGG_MODES)
    ]
    got = megatron_runs["loss_agg_modes"]  # DP=2
    for mode, one, two in zip(LOSS_AGG_MODES, expected, got, strict=True):
        assert one.keys() == two.keys()
        assert any("loss" in key for key in one)
        for key in one:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), (mode, key)
