"""Kill and resume: fresh ranks that load megatron-core's distributed checkpoint (model
and optimizer, DP=2) take bit for bit the same next step as the ranks that wrote it and
kept going; the checkpoint's Hugging Face folder loads in transformers.

The same holds with ``use_distributed_optimizer: true`` and bf16 parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.trainers.megatron.launch import model_dir, spawn
from tests.trainers.megatron.ranks import load_step, only_step, save_step, step_save_step

CONFIG: dict = {}  # plain megatron-core optimizer


def test_distributed_optimizer_in_bf16_resumes_bit_for_bit(tmp_path: Path) -> None:
    """bf16 parameters (ROLL's usual ``dtype``) with fp32 main copies in the
    distributed optimizer: the half-precision optimizer's checkpoint too."""
    config = {"use_distributed_optimizer": True, "dtype": "bfloat16"}
    source = model_dir(tmp_path / "model")
    checkpoint = tmp_path / "checkpoint"
    kept_going = spawn(2, step_save_step, source, config, checkpoint)
    resumed = spawn(2, load_step, source, config, checkpoint)  # fresh processes

    assert kept_going[0] == resumed[0]
    assert {tensor.dtype for tensor in kept_going[1].values()} == {torch.bfloat16}
    for name, tensor in kept_going[1].items():
        assert torch.equal(resumed[1][name], tensor), name


def test_resumed_ranks_take_the_uninterrupted_step(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    source = model_dir(tmp_path / "model")
    checkpoint = tmp_path / "checkpoint"
    kept_going = spawn(2, step_save_step, source, CONFIG, checkpoint)
    resumed = spawn(2, load_step, source, CONFIG, checkpoint)  # fresh processes

    assert kept_going[0] == resumed[0]  # metrics of step 2, bit for bit
    for name, tensor in kept_going[1].items():
        assert torch.equal(resumed[1][name], tensor), name
    saved = AutoModelForCausalLM.from_pretrained(checkpoint / "model")
    untouched = AutoModelForCausalLM.from_pretrained(source)
    moved = [
        not torch.equal(saved.state_dict()[name], tensor)
        for name, tensor in untouched.state_dict().items()
    ]
    assert any(moved)  # the folder holds step 1's weights, not the source's


def test_a_checkpoint_before_the_first_step_resumes_with_a_fresh_optimizer(
    tmp_path: Path,
) -> None:
    """Saving needs optimizer tensors; taking them (a zero step) must not count as
    Adam's first step, neither in the saving process nor in the one that resumes."""
    config = {"use_distributed_optimizer": True, "dtype": "bfloat16"}
    source = model_dir(tmp_path / "model")
    checkpoint = tmp_path / "checkpoint"
    never_saved = spawn(1, only_step, source, config)
    saved = spawn(1, save_step, source, config, checkpoint)
    resumed = spawn(1, load_step, source, config, checkpoint)
    for run in (saved, resumed):
        assert run[0] == never_saved[0]
        for name, tensor in never_saved[1].items():
            assert torch.equal(run[1][name], tensor), name
