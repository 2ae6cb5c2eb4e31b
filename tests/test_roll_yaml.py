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

from agentgym.envs.sokoban import SokobanEnv
from agentgym.errors import ConfigError
from agentgym.formats.fit import Machine, fit_to_machine
from agentgym.formats.roll import from_roll, is_roll_config
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
    assert config.max_turns == 2  # the entries' max_steps: ROLL's env manager's turn limit
    assert config.actor_train.training_args.lr_scheduler_type == "cosine"  # as ROLL's example
    assert config.validation.temperature == 0.2
    assert config.reward_normalization.grouping == "state"  # traj_group_id
    assert config.actor_train.model_args.attn_implementation in ("sdpa", "flash_attention_2")
    assert config.checkpoint_config is None and config.reward_pretrain is None
    assert config.actor_train.data_args.template is None
    assert config.track_with == ["stdout"]
    assert any(note.startswith("checkpoint_config dropped") for note in translation.notes)
    assert not is_roll_config(translation.config)


def test_an_entrys_turn_limit_is_max_turns_the_largest_when_tags_differ() -> None:
    one = from_roll(roll_config("pretrain=null", "custom_env.SimpleSokoban.max_steps=5"))
    assert one.config["max_turns"] == 5  # train: SimpleSokoban 5; val: FrozenLakeThink 2
    assert "one run has one turn limit, the largest" in " ".join(one.notes)
    # the env's own step limit is its env_config's, as in ROLL
    sokoban = one.config["train_env_manager"]["env_configs"]["SimpleSokoban"]
    assert sokoban["kwargs"]["max_steps"] == 2
    both = from_roll(roll_config("pretrain=null", "max_actions_per_traj=4"))
    assert both.config["max_turns"] == 4
    assert "custom_envs.*.max_steps → max_turns=4" in both.notes


def test_a_grid_vocabulary_renders_the_sokoban_grid() -> None:
    raw = roll_config("pretrain=null", "val_env_manager.tags=[SokobanDifferentGridVocab]",
                      "val_env_manager.num_groups_partition=[2]")  # fmt: skip
    config = validate(from_roll(raw).config)
    env_config = config.val_env_manager.env_configs["SokobanDifferentGridVocab"]
    kwargs = env_config["kwargs"]
    assert kwargs["grid_lookup"] == {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}
    plain, vocab = SokobanEnv(), SokobanEnv(**kwargs)
    grid, _ = plain.reset(seed=3)
    assert grid == "######\n######\n##___#\n#_X__#\n#S___#\n######"
    assert vocab.reset(seed=3)[0] == "WWWWWW\nWWWWWW\nWW...W\nW.B..W\nW@...W\nWWWWWW"  # same room
    assert (
        "Symbols: W wall, . empty, G target, C box on target, B box, A player, "
        "@ player on target.\n" in vocab.instructions
    )
    assert "Symbols: # wall, _ floor, O target, X box, √ box on a target, P you" in (
        plain.instructions
    )
    with pytest.raises(ValueError, match=r"got codes \[0, 1\]"):
        SokobanEnv(grid_lookup={0: "W", 1: "."})


CPU = Machine(cuda=False, megatron=True, flash_attn=False)
GPUS = (
    "pretrain=null", "num_gpus_per_node=8", "actor_train.device_mapping='list(range(0,8))'",
    "actor_infer.device_mapping='list(range(0,8))'",
    "reference.device_mapping='list(range(0,8))'",
    "actor_train.strategy_args.strategy_name=megatron_train",
    "+actor_train.strategy_args.strategy_config.use_distributed_optimizer=true",
    "+actor_train.strategy_args.strategy_config.tensor_model_parallel_size=2",
    "+actor_train.strategy_args.strategy_config.sequence_parallel=true",
)  # fmt: skip


def test_the_translation_is_the_same_on_every_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    translations = []
    for cuda in (False, True):
        monkeypatch.setattr("torch.cuda.is_available", lambda cuda=cuda: cuda)
        translations.append(from_roll(roll_config(*GPUS)))
    assert translations[0] == translations[1]
    assert translations[0].config["num_gpus_per_node"] == 8


def test_gpu_placement_is_fitted_to_one_cpu_process() -> None:
    fitting = fit_to_machine(from_roll(roll_config(*GPUS)).config, CPU)
    config = validate(fitting.config)
    assert config.num_gpus_per_node == 0 and config.distributed == "local"
    assert (config.actor_train.device_mapping, config.actor_infer.device_mapping) == (None, None)
    assert config.reference.device_mapping is None
    strategy = config.actor_train.strategy_args
    assert strategy.strategy_name == "megatron_train"  # one rank of it
    assert strategy.strategy_config == {
        "use_distributed_optimizer": True,
        "tensor_model_parallel_size": 1,
        "sequence_parallel": False,
    }
    assert [(c.key, c.written, c.fitted) for c in fitting.changes] == [
        ("num_gpus_per_node", 8, 0),
        ("actor_train.device_mapping", "list(range(0,8))", None),
        ("actor_infer.device_mapping", "list(range(0,8))", None),
        ("reference.device_mapping", "list(range(0,8))", None),
        ("actor_train.strategy_args.strategy_config.tensor_model_parallel_size", 2, 1),
        ("actor_train.strategy_args.strategy_config.sequence_parallel", True, False),
        ("actor_train.model_args.attn_implementation", "flash_attention_2", "sdpa"),
        ("reference.model_args.attn_implementation", "flash_attention_2", "sdpa"),
    ]  # the file asks for fa2 too
    table = fitting.table().splitlines()
    assert table[0] == "machine fitting (fit_to_machine=false refuses these):"
    assert table[2].split()[:3] == ["num_gpus_per_node", "8", "0"]
    assert "torch sees no CUDA device" in table[2]
    no_megatron = Machine(cuda=False, megatron=False, flash_attn=False)
    fallback = fit_to_machine(from_roll(roll_config(*GPUS)).config, no_megatron)
    assert fallback.config["actor_train"]["strategy_args"] == {
        "strategy_name": "torch",
        "strategy_config": {},
    }
    ray = fit_to_machine(from_roll(roll_config(*GPUS, "++distributed=ray")).config, CPU)
    assert (ray.config["num_gpus_per_node"], ray.config["actor_train"]["device_mapping"]) == (
        8,
        "list(range(0,8))",
    )  # Ray places them, on its nodes' GPUs: the roles train and generate there
    assert [(c.key, c.fitted) for c in ray.changes if c.key == "model.device"] == [
        ("model.device", "cuda")
    ]
    gpu = Machine(cuda=True, megatron=True, flash_attn=True)
    on_gpus = fit_to_machine(from_roll(roll_config(*GPUS)).config, gpu)
    assert [(c.key, c.written, c.fitted) for c in on_gpus.changes] == [
        ("model.device", "cpu", "cuda")
    ]  # ROLL's files have no model.device: the default would leave the GPUs idle
    assert on_gpus.config["model"]["device"] == "cuda"
    told = fit_to_machine(from_roll(roll_config(*GPUS, "+model.device=cuda:0")).config, gpu)
    assert told.changes == []  # a device the file's run already names stays
    as_written = from_roll(roll_config(*GPUS, "+fit_to_machine=false")).config
    assert fit_to_machine(as_written, gpu).changes == []  # runnable as written: not refused


def test_a_roll_file_with_strategy_config_auto_is_left_to_the_planner() -> None:
    auto = (*GPUS[:6], "+actor_train.strategy_args.strategy_config=auto")
    fitting = fit_to_machine(from_roll(roll_config(*auto)).config, CPU)
    assert fitting.config["actor_train"]["strategy_args"]["strategy_config"] == "auto"
    assert not any("strategy_config" in c.key for c in fitting.changes)


def test_fit_to_machine_false_turns_each_change_into_an_error() -> None:
    config = from_roll(roll_config(*GPUS, "++fit_to_machine=false")).config
    with pytest.raises(ConfigError, match=r"fit_to_machine=false.*num_gpus_per_node=8 \(torch"):
        fit_to_machine(config, CPU)
    fitted = fit_to_machine(from_roll(roll_config("pretrain=null")).config, CPU)
    assert validate(fitted.config).fit_to_machine  # the default: fit


def test_flash_attention_becomes_sdpa_where_it_cannot_run() -> None:
    translation = from_roll(roll_config())  # the file asks for fa2
    assert translation.config["actor_train"]["model_args"]["attn_implementation"] == (
        "flash_attention_2"
    )
    fitting = fit_to_machine(translation.config, CPU)
    assert fitting.config["actor_train"]["model_args"]["attn_implementation"] == "sdpa"
    assert "actor_train.model_args.attn_implementation" in [c.key for c in fitting.changes]


def test_a_megatron_strategy_config_clip_is_the_top_level_clip() -> None:
    clip = "+actor_train.strategy_args.strategy_config.max_grad_norm"
    megatron = (
        "actor_train.strategy_args.strategy_name=megatron_train",
        f"{clip}=${{max_grad_norm}}",
    )
    translation = from_roll(roll_config(*megatron))
    config = translation.config
    assert config["actor_train"]["strategy_args"]["strategy_config"] == {}
    assert config["max_grad_norm"] == 1.0
    assert (
        "actor_train.strategy_args.strategy_config.max_grad_norm=1.0 → max_grad_norm (one clip)"
        in translation.notes
    )
    with pytest.raises(ConfigError, match=r"strategy_config.max_grad_norm=0.5 differs from "):
        from_roll(
            roll_config(
                *megatron[:1], "+actor_train.strategy_args.strategy_config.max_grad_norm=0.5"
            )
        )


def test_what_has_no_counterpart_is_named() -> None:
    raw = roll_config()

    def fails(change: Any, match: str) -> None:
        broken = copy.deepcopy(raw)
        change(broken)
        with pytest.raises(ConfigError, match=match):
            from_roll(broken)

    fails(
        lambda r: r["custom_envs"]["SimpleSokoban"]["env_config"].update(env_instruction="Go"),
        r"custom_envs.SimpleSokoban.env_config.env_instruction is not supported",
    )
    fails(
        lambda r: r["train_env_manager"].update(tags=["SimpleSokobn"]),
        r"train_env_manager.tags names 'SimpleSokobn', which custom_envs does not define. "
        r"Did you mean 'SimpleSokoban'\?",
    )
    fails(
        lambda r: r["custom_envs"]["SimpleSokoban"].update(env_type="sokobann"),
        r"env_type='sokobann' has no agentgym env; known: \['frozen_lake', 'sokoban', 'sokoban_n",
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
