"""Activation recomputation on the CPU: recompute_granularity full and selective
re-run the forward inside the backward (where the CPU mode must hold too) and
take the step that keeping the activations takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.trainers.megatron.launch import model_dir, spawn
from tests.trainers.megatron.ranks import train_two_steps


def every_granularity(rank: int, world: int, qwen_dir: Path) -> dict[str, Any]:
    return {
        name: train_two_steps(rank, world, qwen_dir, config)
        for name, config in {
            "none": {},
            "full": {"recompute_granularity": "full"},
            "selective": {"recompute_granularity": "selective"},
        }.items()
    }


def test_recomputation_takes_the_same_steps(tmp_path: Path) -> None:
    runs = spawn(1, every_granularity, model_dir(tmp_path))
    kept = runs["none"]
    for name in ("full", "selective"):
        metrics, weights = runs[name]
        for one, two in zip(kept[0], metrics, strict=True):
            assert two == pytest.approx(one, rel=1e-6, abs=1e-7), name
        for key, tensor in kept[1].items():
            torch.testing.assert_close(weights[key], tensor, rtol=1e-6, atol=1e-6)
