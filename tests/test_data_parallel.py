"""ROLL's mini-batch with data parallelism: per_device_train_batch_size ×
gradient_accumulation_steps × data-parallel replicas (ranks / TP / PP / CP)."""

from __future__ import annotations

import pytest

from agentgym.builders.recipe import grpo_config
from agentgym.errors import ConfigError
from agentgym.schema import validate
from tests.test_config import composed

TRAJECTORIES = (
    "rollout_mode=trajectory",
    "step_advantage_weight=0",
    "rollout_batch_size=32",
    "train_env_manager.env_groups=4",
    "train_env_manager.group_size=8",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=2",
)


def test_one_process_is_one_replica() -> None:
    config = validate(composed(*TRAJECTORIES))
    assert config.data_parallel["actor_train"] == 1
    assert grpo_config(config).schedule.gradient_accumulation_steps == 2  # mini-batch 4 × 2 = 8


def test_two_torch_ranks_double_the_mini_batch() -> None:
    config = validate(
        composed(*TRAJECTORIES, "distributed=ray", "++actor_train.device_mapping=[0,1]")
    )
    assert config.data_parallel["actor_train"] == 2
    # 4 rows × 2 accumulation steps on each of 2 replicas: 4 micro-batches of 4 per mini-batch
    assert grpo_config(config).schedule.gradient_accumulation_steps == 4


def test_tensor_parallel_ranks_are_one_replica() -> None:
    config = validate(
        composed(
            *TRAJECTORIES,
            "distributed=ray",
            "++actor_train.device_mapping=[0,1,2,3]",
            "strategy=megatron",
            "strategy.strategy_config.tensor_model_parallel_size=2",
        )
    )
    assert config.data_parallel["actor_train"] == 2  # 4 ranks / TP 2
    assert grpo_config(config).schedule.gradient_accumulation_steps == 4


def test_a_mini_batch_that_does_not_divide_the_rollout_names_the_numbers() -> None:
    with pytest.raises(ConfigError, match=r"4 × 2 × 3 = 24"):
        validate(composed(*TRAJECTORIES, "distributed=ray", "++actor_train.device_mapping=[0,1,2]"))


def test_ranks_that_do_not_form_whole_replicas_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"3 ranks .* TP × PP × CP = 2"):
        validate(
            composed(
                *TRAJECTORIES,
                "distributed=ray",
                "++actor_train.device_mapping=[0,1,2]",
                "strategy=megatron",
                "strategy.strategy_config.tensor_model_parallel_size=2",
            )
        )
