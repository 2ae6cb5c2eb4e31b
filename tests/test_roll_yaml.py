"""ROLL's agentic YAML files run as they are (tests/data/roll: our own trimmed copy of
the shape of ROLL's examples/qwen2.5-0.5B-agentic/agentic_val_sokoban.yaml)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from agentgym.errors import ConfigError
from agentgym.roll_config import from_roll, is_roll_config
from agentgym.schema import validate
from tests.envs.trainrun import run_python

ROLL_DIR = Path(__file__).parent / "data" / "roll"


def roll_config(*overrides: str) -> dict[str, Any]:
    with initialize_config_dir(str(ROLL_DIR), version_base=None):
        cfg = compose("agentic_sokoban", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def test_rolls_env_keys_become_env_configs() -> None:
    raw = roll_config("pretrain=null")  # the file's model path is a placeholder
    assert is_roll_config(raw)
    translation = from_roll(raw)
    config = validate(translation.config)
    train, val = config.train_env_manager, config.val_env_manager
    assert (train.env_groups, train.group_size, train.n_groups) == (2, 2, [2])
    assert train.env_configs == {
        "SimpleSokoban": {
            "name": "sokoban",
            "kwargs": {
                "max_steps": 2,
                "format_penalty": -0.15,
                "dim_room": [6, 6],
                "num_boxes": 1,
                "response_format": "answer",
            },
        }
    }
    assert val.env_configs["FrozenLakeThink"] == {
        "name": "frozen_lake",
        "kwargs": {
            "max_steps": 2,
            "format_penalty": -0.01,
            "is_slippery": False,
            "response_format": "think_answer",
        },
    }
    assert config.rollout_mode == "trajectory"  # TrajEnvManager
    assert config.step_advantage_weight == 0.0  # grpo: no GiGPO step term
    assert config.actor_infer.generating_args.max_new_tokens == 6  # max_tokens_per_step
    assert config.actor_train.training_args.lr_scheduler_type == "cosine"  # as ROLL's example
    assert config.validation.temperature == 0.2
    assert config.reward_normalization.grouping == "state"  # traj_group_id
    assert config.actor_train.model_args.attn_implementation in ("sdpa", "flash_attention_2")
    assert config.checkpoint_config is None and config.reward_pretrain is None
    assert config.actor_train.data_args.template is None
    assert config.track_with == ["stdout"]
    assert any(note.startswith("checkpoint_config dropped") for note in translation.notes)
    assert not is_roll_config(translation.config)


def test_what_has_no_counterpart_is_named() -> None:
    raw = roll_config()

    def fails(change: Any, match: str) -> None:
        broken = copy.deepcopy(raw)
        change(broken)
        with pytest.raises(ConfigError, match=match):
            from_roll(broken)

    fails(
        lambda r: r["val_env_manager"].update(tags=["SimpleSokoban", "SokobanDifferentGridVocab"]),
        r"custom_envs.SokobanDifferentGridVocab.env_config.grid_lookup is not supported",
    )
    fails(
        lambda r: r["train_env_manager"].update(tags=["SimpleSokobn"]),
        r"train_env_manager.tags names 'SimpleSokobn', which custom_envs does not define. "
        r"Did you mean 'SimpleSokoban'\?",
    )
    fails(
        lambda r: r["custom_envs"]["SimpleSokoban"].update(env_type="sokobann"),
        r"env_type='sokobann' has no agentgym env; known: \['frozen_lake', 'sokoban', 'webshop'\]",
    )
    fails(
        lambda r: r["custom_envs"]["SimpleSokoban"].update(env_manager_cls="x.VLTrajEnvManager"),
        r"env_manager_cls='x.VLTrajEnvManager' has no rollout mode here",
    )
    fails(
        lambda r: r["actor_train"]["model_args"].update(model_type="qwen2"),
        r"actor_train.model_args.model_type='qwen2'",
    )


def test_a_roll_yaml_trains_two_steps(tmp_path: Path, tiny_model_dir: Path) -> None:
    output = tmp_path / "run"
    result = run_python(
        [
            "-m", "agentgym.train", "--config-path", str(ROLL_DIR),
            "--config-name", "agentic_sokoban", f"pretrain={tiny_model_dir}",
            f"output_dir={output}", f"logging_dir={output}/logs",
        ],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ROLL config: env_manager_cls → rollout_mode=trajectory" in result.stdout
    lines = [json.loads(line) for line in (output / "logs" / "metrics.jsonl").open()]
    steps = {line["step"] for line in lines if "train/all/trajectories" in line}
    assert steps == {1, 2}
    assert all(
        line["train/all/trajectories"] == 4.0 for line in lines if "train/all/trajectories" in line
    )
    assert (output / "checkpoints").is_dir()


def test_extra_prompts_run_through_the_recipe(tmp_path: Path, tiny_model_dir: Path) -> None:
    output = tmp_path / "run"
    result = run_python(
        [
            "-m", "agentgym.train", "--config-path", str(ROLL_DIR),
            "--config-name", "agentic_sokoban", f"pretrain={tiny_model_dir}",
            f"output_dir={output}", f"logging_dir={output}/logs", "eval_steps=0",
            "++is_use_additional_prompts=true", "++max_additional_running_prompts=1",
            "++max_running_requests=2",
        ],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    lines = [json.loads(line) for line in (output / "logs" / "metrics.jsonl").open()]
    train = [line for line in lines if "train/all/trajectories" in line]
    assert [line["step"] for line in train] == [1, 2]
    for line in train:
        assert line["train/all/trajectories"] == 4.0  # 2 groups of 2 kept
        # 3 groups of 2 started: the one left out was cancelled or dropped
        left_out = line["train/scheduling/cancelled_episodes"]
        assert left_out + line["train/scheduling/dropped_episodes"] == 2.0
