"""Trinity-RFT's config files, read as agentgym runs.

``python -m agentgym.train --config-path DIR --config-name explorer`` (or
``agentgym run --config DIR/explorer.yaml``) with one of Trinity's files: the file
(after ``${oc.env:VAR,default}`` and the command line's ``key=value`` in Trinity's
keys) is translated into agentgym's command line, which then composes and runs as
any other: :func:`from_trinity`. Every key means what it means in Trinity
(``trinity/common/config.py`` and its ``check_and_update``):

* ``project``, ``name``, ``checkpoint_root_dir``, ``mode``: the job (the same keys);
* ``algorithm.algorithm_type: grpo`` with Trinity's own defaults for it (PPO's
  clipped loss at 0.2, token-mean, a k2 KL loss at 0.001, zero-variance groups kept);
  ``repeat_times``: the group size; ``optimizer.lr``;
* ``buffer.batch_size``: tasks per explore step (groups a batch plays);
  ``train_batch_size`` (default ``batch_size × repeat_times``): experiences per
  optimizer step, one optimizer step per training step; ``total_epochs`` over the
  task set's rows (whole batches, Trinity's ``drop_last``) gives the step count;
* ``buffer.explorer_input.taskset``: the task set (:mod:`agentgym.tasksets`) of the env
  ``default_workflow_type`` names (``math_workflow``; the taskset's, else
  ``explorer_input``'s); ``rollout_args.temperature``;
* ``buffer.explorer_input.eval_tasksets`` with ``explorer.eval_interval`` and
  ``eval_on_startup``: the validation envs, one tag per task set
  (:mod:`agentgym.formats.trinity_tasksets`);
* ``buffer.trainer_input.experience_buffer``: ``storage_type`` and ``path``
  (``sqlite:///file.db``);
* ``model.model_path``, ``max_model_len`` (the sequence budget),
  ``max_response_tokens``; ``cluster.node_num``, ``gpu_per_node``;
* ``explorer.name``, ``runner_per_model`` (episodes in flight per engine),
  ``rollout_model.engine_num`` and ``tensor_parallel_size``, its vLLM arguments
  (``enable_prefix_caching``, ``gpu_memory_utilization``, ``enforce_eager``), ``dtype``
  and ``seed``;
* ``synchronizer.*`` (the same keys);
* ``trainer.grad_clip``, ``save_interval``, ``use_dynamic_bsz`` with
  ``max_token_len_per_gpu`` (token-budget micro-batches),
  ``ulysses_sequence_parallel_size`` (1 only), ``trainer_type`` (``verl`` only).

A key with no meaning here is an error that names it (with the close match for a
misspelling); nothing is ignored silently. Fitting to this machine is a separate,
listed step (:func:`fit_trinity`), as for ROLL's files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError, did_you_mean
from agentgym.formats.fit import Change, Fitting, Machine
from agentgym.formats.trinity_tasksets import eval_taskset_values, taskset_values

ALGORITHMS = ("grpo", "opmd")
"""Trinity's ``algorithm_type`` values built here."""

UNBUILT_ALGORITHMS = {
    "ppo": "Trinity's ppo (a critic, GAE): use agentgym's adv_estimator=gae",
    "sft": "supervised fine-tuning is not a Trinity algorithm agentgym runs",
    "dpo": "DPO (preference pairs) is not built",
    "mix": "MIX (expert data mixed into RL) is not built",
    "mix_chord": "MIX-CHORD is not built",
    "raft": "RAFT is not built",
    "asymre": "AsymRE is not built",
}
"""Trinity's other algorithm types, each with why it does not run here."""

TRINITY_GRPO = {
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.2,
    "loss_agg_mode": "token-mean",
    "use_kl_loss": True,
    "kl_penalty": "mse",  # k2: 0.5 (log p - log p_ref)^2
    "kl_loss_coef": 0.001,
    "entropy_loss_coef": 0.0,
    "drop_zero_variance_groups": False,
    "reward_normalization.method": "mean_std",
    "reward_normalization.grouping": "state",
    "adv_estimator": "grpo",
    "pg_variant": "ppo",
}
"""Trinity's defaults for ``algorithm_type: grpo`` (its ``GRPOAlgorithm.default_config``:
``policy_loss_fn: ppo`` (clip 0.2, token-mean), ``kl_loss_fn: k2`` (``kl_coef``
0.001), ``entropy_loss_fn: default``, the group advantage, groups of equal reward
kept with advantage 0), in agentgym's keys."""

TRINITY_DEFAULTS: dict[str, dict[str, Any]] = {
    "grpo": TRINITY_GRPO,
    # OPMDAlgorithm.default_config: the opmd advantage (score minus the group's
    # baseline) and loss (no ratio, no clip), a k2 KL loss
    "opmd": TRINITY_GRPO
    | {"adv_estimator": "opmd", "pg_variant": "opmd", "reward_normalization.method": "identity"},
}
"""Each built ``algorithm_type``'s Trinity defaults, in agentgym's keys."""

POLICY_LOSSES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "ppo": (
        {"pg_variant": "ppo"},
        {"clip_range_low": "clip_ratio_low", "clip_range_high": "clip_ratio_high",
         "loss_agg_mode": "loss_agg_mode"},
    ),
    "opmd": ({"pg_variant": "opmd"}, {"tau": "opmd_tau", "loss_agg_mode": "loss_agg_mode"}),
    "topr": (
        {"pg_variant": "topr", "topr_advantage_threshold": 0.0,
         "topr_positive_weight": 1.0, "topr_negative_weight": 1.0},
        {"advantage_threshold": "topr_advantage_threshold", "loss_agg_mode": "loss_agg_mode"},
    ),
    "cispo": (
        {"pg_variant": "cispo", "cispo_epsilon_low": 1.0, "cispo_epsilon_high": 0.28},
        {"clip_range_low": "cispo_epsilon_low", "clip_range_high": "cispo_epsilon_high",
         "enable_mask_clip": "cispo_use_unified_mask", "loss_agg_mode": "loss_agg_mode"},
    ),
}  # fmt: skip
"""Trinity's ``policy_loss_fn`` → (agentgym's keys with Trinity's defaults for it, its
``policy_loss_fn_args`` → agentgym's keys; ``clip_range`` sets both clip bounds)."""

ADVANTAGE_ARGS = {"opmd_baseline": "opmd_baseline", "tau": "opmd_baseline_tau"}
"""OPMD's ``advantage_fn_args`` → agentgym's keys."""

KL_LOSSES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl", "low_var_kl": "low_var_kl", "abs": "abs"}
"""Trinity's ``kl_loss_fn`` → ``kl_penalty`` (``none``: no KL loss). Trinity's k3 is not
clamped; ``low_var_kl`` clamps at ±10 (verl's)."""

TASKSET_KEYS = (
    "name", "storage_type", "path", "subset_name", "split", "format", "rollout_args",
    "default_workflow_type",
)  # fmt: skip
"""A task set's keys (Trinity's ``StorageConfig``) read here."""

ENGINE_OPTIONS = ("enable_prefix_caching", "gpu_memory_utilization", "enforce_eager")
"""``explorer.rollout_model``'s vLLM engine arguments, passed on as ROLL's
``actor_infer.strategy_args.strategy_config`` (the engine's vLLM arguments)."""

TRAINER_TYPES = ("verl",)
"""Trinity's ``trainer.trainer_type`` values: verl's FSDP trainer, whose role the
strategy (``actor_train.strategy_args``) plays here."""

KEYS: dict[str, tuple[str, ...]] = {
    "": (
        "project", "name", "mode", "checkpoint_root_dir", "algorithm", "model",
        "cluster", "buffer", "explorer", "synchronizer", "trainer",
    ),
    "algorithm": (
        "algorithm_type", "repeat_times", "optimizer", "policy_loss_fn", "policy_loss_fn_args",
        "advantage_fn_args", "kl_loss_fn", "kl_loss_fn_args",
    ),
    "algorithm.kl_loss_fn_args": ("kl_coef",),
    "algorithm.optimizer": ("lr",),
    "model": ("model_path", "max_model_len", "max_response_tokens", "max_prompt_tokens"),
    "cluster": ("node_num", "gpu_per_node"),
    "buffer": ("total_epochs", "batch_size", "train_batch_size", "explorer_input", "trainer_input"),
    "buffer.explorer_input": ("taskset", "eval_tasksets", "default_workflow_type"),
    "buffer.explorer_input.taskset": TASKSET_KEYS,
    "buffer.explorer_input.taskset.rollout_args": ("temperature",),
    "buffer.explorer_input.eval_tasksets": (*TASKSET_KEYS, "repeat_times"),
    "buffer.explorer_input.eval_tasksets.rollout_args": ("temperature",),
    "buffer.trainer_input": ("experience_buffer",),
    "buffer.trainer_input.experience_buffer": ("name", "storage_type", "path"),
    "explorer": (
        "name", "runner_per_model", "rollout_model", "bench_on_latest_checkpoint",
        "eval_interval", "eval_on_startup",
    ),
    "explorer.rollout_model": (
        "engine_num", "tensor_parallel_size", *ENGINE_OPTIONS, "dtype", "seed",
    ),
    "synchronizer": ("sync_method", "sync_interval", "sync_offset", "sync_style", "sync_timeout"),
    "trainer": (
        "grad_clip", "use_dynamic_bsz", "max_token_len_per_gpu", "ulysses_sequence_parallel_size",
        "save_interval", "trainer_type",
    ),
}  # fmt: skip
"""Every Trinity key read here, by section; any other is an error naming it."""


def is_trinity_config(raw: Mapping[str, Any]) -> bool:
    """Whether ``raw`` is one of Trinity-RFT's config files (its sections)."""
    buffer = raw.get("buffer")
    model = raw.get("model")
    return (
        "algorithm" in raw
        or "cluster" in raw
        or (isinstance(buffer, Mapping) and bool({"explorer_input", "trainer_input"} & set(buffer)))
        or (isinstance(model, Mapping) and "model_path" in model)
    )


def load_trinity(path: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Trinity's file at ``path`` with ``overrides`` (``key=value`` in Trinity's keys)
    merged in and ``${oc.env:...}`` resolved.

    Raises:
        ConfigError: When it does not resolve (an unset variable without a default).
    """
    from omegaconf import OmegaConf

    config = OmegaConf.load(path)
    if overrides:
        config = OmegaConf.merge(config, OmegaConf.from_dotlist(list(overrides)))
    try:
        data: dict[str, Any] = OmegaConf.to_container(config, resolve=True)  # type: ignore[assignment]
    except Exception as error:
        raise ConfigError(f"{path} does not resolve: {error}") from None
    return data


@dataclass(frozen=True)
class Translation:
    """A Trinity file as agentgym's command line.

    Attributes:
        overrides: ``key=value`` arguments of ``python -m agentgym.train``.
        notes: What was derived, one line each (printed at the start).
        changes: What the machine fitting changed (:func:`fit_trinity`).
    """

    overrides: list[str]
    notes: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    def table(self) -> str:
        """The fitting's changes as a table (empty: none)."""
        return Fitting({}, self.changes).table()


def from_trinity(
    raw: Mapping[str, Any], *, machine: Machine | None = None, fit: bool = True
) -> Translation:
    """Translate a resolved Trinity config into agentgym's ``key=value`` arguments.

    Raises:
        ConfigError: On a key with no meaning here (naming it, with the close match),
            an algorithm type or workflow not built, a batch that does not divide
            into groups, or a task set that cannot be read.
    """
    _check_keys(raw, "")
    values: dict[str, Any] = {}
    notes: list[str] = []
    for key in ("project", "name", "mode", "checkpoint_root_dir"):
        if key in raw:
            values[key] = raw[key]
    algorithm = raw.get("algorithm") or {}
    kind = algorithm.get("algorithm_type", "grpo")
    if kind in UNBUILT_ALGORITHMS:
        raise ConfigError(f"algorithm.algorithm_type={kind!r}: {UNBUILT_ALGORITHMS[kind]}")
    if kind not in ALGORITHMS:
        raise ConfigError(
            f"algorithm.algorithm_type={kind!r} is not one of {[*ALGORITHMS, *UNBUILT_ALGORITHMS]}"
        )
    values |= TRINITY_DEFAULTS[kind]
    _algorithm_args(algorithm, values)
    repeat = int(algorithm.get("repeat_times", 2))  # Trinity's GRPO and OPMD default
    if "lr" in (algorithm.get("optimizer") or {}):
        values["actor_train.training_args.learning_rate"] = algorithm["optimizer"]["lr"]

    model = raw.get("model") or {}
    if "model_path" in model:
        values["model.path"] = model["model_path"]
    if "max_model_len" in model:
        values["sequence_length"] = model["max_model_len"]
    if "max_response_tokens" in model:
        values["generation.max_new_tokens"] = model["max_response_tokens"]
    if "max_prompt_tokens" in model:
        values["prompt_length"] = model["max_prompt_tokens"]

    cluster = raw.get("cluster") or {}
    if "node_num" in cluster:
        values["num_nodes"] = cluster["node_num"]
    if "gpu_per_node" in cluster:
        values["num_gpus_per_node"] = cluster["gpu_per_node"]

    buffer = raw.get("buffer") or {}
    explorer_input = buffer.get("explorer_input") or {}
    batch = int(buffer.get("batch_size", 1))
    train_batch = int(buffer.get("train_batch_size") or batch * repeat)
    if train_batch % repeat:
        raise ConfigError(
            f"buffer.train_batch_size={train_batch} is not a whole number of groups of "
            f"algorithm.repeat_times={repeat}"
        )
    trainer_groups = train_batch // repeat
    explorer_mode = raw.get("mode", "both") == "explore"
    groups = batch if explorer_mode else trainer_groups
    samples = groups * repeat
    micro = max(d for d in range(1, min(samples, 8) + 1) if samples % d == 0)
    values |= {
        "train_env_manager.env_groups": groups,
        "train_env_manager.group_size": repeat,
        "rollout_batch_size": samples,
        # one optimizer step per training step: its train_batch_size experiences
        "actor_train.training_args.per_device_train_batch_size": micro,
        "actor_train.training_args.gradient_accumulation_steps": samples // micro,
    }
    if raw.get("mode") == "both" and batch != trainer_groups:
        raise ConfigError(
            f"mode=both plays and trains one batch per step: buffer.batch_size={batch} tasks "
            f"must be buffer.train_batch_size / repeat_times = {trainer_groups} groups"
        )
    env, rows = taskset_values(explorer_input, values, notes)
    eval_taskset_values(raw, values, notes)
    epochs = float(buffer.get("total_epochs", 1))
    explore_steps = math.floor(rows * epochs / batch)
    steps = max(1, explore_steps * batch * repeat // train_batch)
    values["max_steps"] = steps
    notes.append(
        f"{steps} steps: total_epochs={epochs:g} × {rows} tasks, {batch} tasks per explore "
        f"step (whole batches), {train_batch} experiences per training step"
    )
    values["env"] = env
    experience = (buffer.get("trainer_input") or {}).get("experience_buffer") or {}
    if "storage_type" in experience:
        values["buffer.storage_type"] = experience["storage_type"]
    if experience.get("path"):
        values["buffer.path"] = str(experience["path"]).removeprefix("sqlite:///")

    explorer = raw.get("explorer") or {}
    for key in ("name", "bench_on_latest_checkpoint"):
        if key in explorer:
            values[f"explorer.{key}"] = explorer[key]
    rollout_model = explorer.get("rollout_model") or {}
    engines = int(rollout_model.get("engine_num", 1))
    tp = int(rollout_model.get("tensor_parallel_size", 1))
    if "engine_num" in rollout_model or "tensor_parallel_size" in rollout_model:
        values["actor_infer.device_mapping"] = list(range(engines * tp))
        values["actor_infer.num_gpus_per_worker"] = tp
    engine = {key: rollout_model[key] for key in ENGINE_OPTIONS if key in rollout_model}
    if engine:
        values["actor_infer.strategy_args.strategy_config"] = engine
    if "dtype" in rollout_model:
        values["actor_infer.model_args.dtype"] = rollout_model["dtype"]
    if "seed" in rollout_model:  # the engines' seed; here the run's (envs' seeds too)
        values["seed"] = rollout_model["seed"]
    if "runner_per_model" in explorer:
        values["max_running_requests"] = int(explorer["runner_per_model"]) * engines

    for key, value in (raw.get("synchronizer") or {}).items():
        values[f"synchronizer.{key}"] = value

    trainer = raw.get("trainer") or {}
    trainer_type = trainer.get("trainer_type", "verl")
    if trainer_type not in TRAINER_TYPES:
        raise ConfigError(
            f"trainer.trainer_type={trainer_type!r} is not one of Trinity's {list(TRAINER_TYPES)}"
        )
    if "grad_clip" in trainer:
        values["max_grad_norm"] = trainer["grad_clip"]
    # Trinity's default 0: a checkpoint at the end only
    values["save_steps"] = int(trainer.get("save_interval") or 0) or steps
    if trainer.get("use_dynamic_bsz"):
        values["actor_train.use_dynamic_batching_in_train"] = True
        if "max_token_len_per_gpu" in trainer:
            values["actor_train.max_tokens_per_microbatch_in_train"] = trainer[
                "max_token_len_per_gpu"
            ]
    if int(trainer.get("ulysses_sequence_parallel_size", 1)) != 1:
        raise ConfigError(
            "trainer.ulysses_sequence_parallel_size="
            f"{trainer['ulysses_sequence_parallel_size']}: Ulysses sequence parallelism is "
            "not built; set it to 1 (Megatron's context parallelism is "
            "actor_train.strategy_args.strategy_config.context_parallel_size)"
        )
    changes = fit_trinity(values, machine or Machine.detect()) if fit else []
    return Translation([_override(key, value) for key, value in values.items()], notes, changes)


def _algorithm_args(algorithm: Mapping[str, Any], values: dict[str, Any]) -> None:
    """``policy_loss_fn`` and its args, OPMD's ``advantage_fn_args``, ``kl_loss_fn`` and
    its ``kl_coef``, as agentgym's keys (into ``values``)."""
    loss = algorithm.get("policy_loss_fn")
    if loss is not None:
        if loss not in POLICY_LOSSES:
            raise ConfigError(
                f"algorithm.policy_loss_fn={loss!r} is not built; built: {sorted(POLICY_LOSSES)}."
                f"{did_you_mean(loss, POLICY_LOSSES)}"
            )
        values |= POLICY_LOSSES[loss][0]
    names = POLICY_LOSSES[loss or values["pg_variant"]][1]
    for key, value in (algorithm.get("policy_loss_fn_args") or {}).items():
        if key == "clip_range" and values["pg_variant"] == "ppo":
            values["clip_ratio_low"] = values["clip_ratio_high"] = value
        elif key in ("mask_clip_range_low", "mask_clip_range_high") and loss == "cispo":
            bound = "cispo_epsilon_low" if key.endswith("low") else "cispo_epsilon_high"
            if value != values.get(bound):
                raise ConfigError(
                    f"algorithm.policy_loss_fn_args.{key}={value}: CISPO's mask uses the "
                    f"clip range here ({bound}={values.get(bound)}); give them equal"
                )
        elif key in names:
            values[names[key]] = value
        else:
            raise ConfigError(
                f"algorithm.policy_loss_fn_args.{key} is not read for policy_loss_fn="
                f"{loss or values['pg_variant']}; read: {sorted(names)}.{did_you_mean(key, names)}"
            )
    for key, value in (algorithm.get("advantage_fn_args") or {}).items():
        if values["adv_estimator"] != "opmd" or key not in ADVANTAGE_ARGS:
            raise ConfigError(
                f"algorithm.advantage_fn_args.{key} is not read here (read: OPMD's "
                f"{sorted(ADVANTAGE_ARGS)})"
            )
        values[ADVANTAGE_ARGS[key]] = value
    kl = algorithm.get("kl_loss_fn")
    if kl == "none":
        values["use_kl_loss"] = False
    elif kl is not None:
        if kl not in KL_LOSSES:
            raise ConfigError(f"algorithm.kl_loss_fn={kl!r} is not one of {sorted(KL_LOSSES)}")
        values["kl_penalty"] = KL_LOSSES[kl]
    if "kl_coef" in (algorithm.get("kl_loss_fn_args") or {}):
        values["kl_loss_coef"] = algorithm["kl_loss_fn_args"]["kl_coef"]


def fit_trinity(values: dict[str, Any], machine: Machine) -> list[Change]:
    """Fit the translated ``values`` to ``machine``: on a CPU machine one process (no
    GPU placement); without a Ray cluster to share (``RAY_ADDRESS``), the queue buffer
    becomes the same SQLite file opened by each process, memory sync becomes
    checkpoint folders; NCCL sync (GPUs) becomes checkpoint folders. Each change is
    returned (printed as a table). On a GPU machine the job's models go to the GPUs
    (``model.device`` cuda)."""
    import os

    changes: list[Change] = []

    def change(key: str, fitted: Any, why: str) -> None:
        changes.append(Change(key, values.get(key), fitted, why))
        if fitted is None:
            values.pop(key, None)
        else:
            values[key] = fitted

    if not machine.cuda:
        why = "torch sees no CUDA device: the run is one CPU process"
        if values.get("num_gpus_per_node"):
            change("num_gpus_per_node", 0, why)
        for key in ("actor_infer.device_mapping", "actor_infer.num_gpus_per_worker"):
            if key in values:
                change(key, None, why)
        if values.get("synchronizer.sync_method") in ("nccl", "online"):
            change("synchronizer.sync_method", "checkpoint", "NCCL needs GPUs")
    elif values.get("model.device", "cpu") == "cpu":
        change("model.device", "cuda", "a GPU machine: the job trains and generates on its GPUs")
    shared_ray = bool(os.environ.get("RAY_ADDRESS"))
    if not shared_ray:
        why = "no Ray cluster to share (RAY_ADDRESS unset): the job's processes meet in files"
        if values.get("buffer.storage_type") == "queue":
            change("buffer.storage_type", "sql", why)
        if values.get("synchronizer.sync_method") == "memory":
            change("synchronizer.sync_method", "checkpoint", why)
    return changes


def _check_keys(raw: Mapping[str, Any], section: str, shown: str | None = None) -> None:
    """Every key of ``raw`` (the file's ``section``, written ``shown`` in errors) is
    one of :data:`KEYS`; a task set's ``format`` is checked when the task set is read."""
    known = KEYS[section]
    shown = section if shown is None else shown
    for key, value in raw.items():
        path = f"{section}.{key}" if section else key
        where = f"{shown}.{key}" if shown else key
        if key not in known:
            raise ConfigError(
                f"Trinity key {where!r} has no counterpart here.{did_you_mean(key, known)} "
                f"(read: {', '.join(known)})"
            )
        if path in KEYS and isinstance(value, Mapping):
            _check_keys(value, path, where)
        elif path in KEYS and isinstance(value, list):  # eval_tasksets: a list of task sets
            for index, item in enumerate(value):
                if not isinstance(item, Mapping):
                    raise ConfigError(f"Trinity's {where}[{index}] must be a mapping, got {item!r}")
                _check_keys(item, path, f"{where}[{index}]")


def _override(key: str, value: Any) -> str:
    """``key=value`` in Hydra's override grammar (free-form mappings get ``++``; a
    config group takes its option's bare name)."""
    if key == "env":
        return f"env={value}"
    prefix = "++" if key.startswith(("env.kwargs.", "actor_infer.")) else ""
    return f"{prefix}{key}={_value(value)}"


def trinity_arguments(arguments: Sequence[str]) -> tuple[list[str], Translation] | None:
    """When ``--config-path``/``--config-name`` name one of Trinity's files: agentgym's
    arguments for it and the translation; None for any other config. The other
    arguments under Trinity's sections (``buffer.batch_size=8``) change the file;
    the rest (``generation=hf``) are agentgym's keys, applied after.

    Raises:
        ConfigError: As :func:`from_trinity` does.
    """
    options: dict[str, str] = {}
    rest: list[str] = []
    items = list(arguments)
    while items:
        item = items.pop(0)
        flag, equals, value = item.partition("=")
        if flag in ("--config-path", "-cp", "--config-name", "-cn"):
            name = "path" if flag in ("--config-path", "-cp") else "name"
            options[name] = value if equals else (items.pop(0) if items else "")
        else:
            rest.append(item)
    if "name" not in options:
        return None
    folder = Path(options.get("path", "."))
    file = folder / options["name"]
    if not file.suffix:
        file = file.with_suffix(".yaml")
    if not file.is_file():
        return None
    from omegaconf import OmegaConf

    if not is_trinity_config(OmegaConf.to_container(OmegaConf.load(file)) or {}):  # type: ignore[arg-type]
        return None
    trinity_keys = [a for a in rest if a.partition("=")[0].split(".")[0] in KEYS[""]]
    ours = [a for a in rest if a not in trinity_keys]  # agentgym's own keys, as given
    translation = from_trinity(load_trinity(file, trinity_keys))
    return [*translation.overrides, *ours], translation


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"
