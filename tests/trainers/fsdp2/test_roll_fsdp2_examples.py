"""ROLL's FSDP2 example files (unchanged copies, each with its source path, commit and
license line on top, in ROLL's layout so that ``../config/traj_envs`` resolves): the
WebShop AMD one (tests/data/roll_examples, which tests/test_roll_examples.py trains for
two steps) reaches ``fsdp2_train`` with its own keys and steps it; the Qwen3-30B-A3B
Sokoban one (tests/data/roll_fsdp2) stops before any model work, naming what is not
built here (Ulysses, ROLL's MoE patches)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from agentgym.errors import ConfigError
from agentgym.formats.fit import Machine, fit_to_machine
from agentgym.formats.roll import from_roll
from agentgym.schema import validate
from agentgym.trainers.strategies import build_strategy
from agentgym.trainers.strategies.optim import OptimizerConfig
from agentgym.trainers.updates import update_policy
from tests.trainers.megatron.ranks import grpo_config
from tests.trainers.test_update_path import ragged_batch

DATA = Path(__file__).parents[2] / "data"
CPU = Machine(cuda=False, megatron=False, flash_attn=False)
SOKOBAN_30A3 = "roll_fsdp2/qwen3-30BA3B-agentic_fsdp2/agentic_val_sokoban_30a3"
WEBSHOP_AMD = "roll_examples/qwen2.5-7B-agentic_megatron/agentic_val_webshop_amd"


def fitted(name: str, *overrides: str) -> dict[str, Any]:
    """The file composed by Hydra, translated and fitted to one CPU process."""
    folder, file = name.rsplit("/", 1)
    with initialize_config_dir(str(DATA / folder), version_base=None):
        raw = OmegaConf.to_container(compose(file, overrides=list(overrides)), resolve=True)
    return fit_to_machine(from_roll(raw).config, CPU).config  # type: ignore[arg-type]


def test_the_30b_a3b_sokoban_file_names_what_it_lacks_before_model_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        validate(fitted(SOKOBAN_30A3, "pretrain=null"))
    assert "unknown key 'actor_train.model_args.ulysses_size'" in str(error.value)
    # past the schema (ulysses and ROLL's profiler keys dropped), the strategy's own keys
    # stop it before a model is read: the model folder does not even exist
    config = validate(
        fitted(
            SOKOBAN_30A3,
            "pretrain=null",
            "~actor_train.model_args.ulysses_size",
            "~reference.model_args.ulysses_size",
            "~actor_train.use_remove_padding",
            "~profiler_memory",
        )
    )
    strategy = config.actor_train.strategy_args
    assert strategy.strategy_name == "fsdp2_train"
    with pytest.raises(ConfigError) as error:
        build_strategy("fsdp2_train", tmp_path / "no-model", strategy.strategy_config)
    for key in ("apply_expert_patch", "apply_tiled_mlp", "tiled_num_shards", "moe_experts"):
        assert key in str(error.value)


def test_the_webshop_amd_file_trains_with_its_fsdp2_keys(tiny_model_dir: Path) -> None:
    """The keys as the file writes them, one update in bf16 (tests/test_roll_examples.py
    runs the whole file for two steps)."""
    config = validate(fitted(WEBSHOP_AMD, f"pretrain={tiny_model_dir}"))
    strategy = config.actor_train.strategy_args
    assert strategy.strategy_name == "fsdp2_train"
    assert strategy.strategy_config == {
        "fsdp_size": 8,
        "param_dtype": "bf16",
        "reduce_dtype": "float32",
        "reshard_after_forward": False,
        "offload_policy": False,
    }
    assert config.actor_train.model_args.dtype == "bfloat16"
    policy: Any = build_strategy(
        "fsdp2_train",
        tiny_model_dir,
        strategy.strategy_config,
        dtype=config.actor_train.model_args.dtype,
        optimizer=OptimizerConfig(learning_rate=1e-3),
    )
    try:
        before = {name: tensor.clone() for name, tensor in policy.export_weights()}
        metrics = update_policy(grpo_config(), policy, ragged_batch(0), 1)
        assert torch.isfinite(torch.tensor(metrics["actor/grad_norm"]))
        after = dict(policy.export_weights())
        assert all(tensor.dtype == torch.bfloat16 for tensor in after.values())
        assert any(not torch.equal(after[name], before[name]) for name in before)
    finally:
        dist.destroy_process_group()
