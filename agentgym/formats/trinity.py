"""Trinity-RFT's config files, read as agentgym runs.

``python -m agentgym.train --config-path DIR --config-name explorer`` (or
``agentgym run --config DIR/explorer.yaml``) with one of Trinity's files: the file
(after ``${oc.env:VAR,default}`` and the command line's ``key=value`` in Trinity's
keys) is translated into agentgym's command line, which then composes and runs as
any other: :func:`from_trinity`. Every key means what it means in Trinity
(``trinity/common/config.py`` and its ``check_and_update``):

* ``project``, ``name``, ``checkpoint_root_dir``, ``mode``: the job (the same keys);
  ``continue_from_checkpoint`` (default true): a trainer (``mode: train``) continues
  from the job's latest checkpoint if there is one, else starts afresh
  (``resume_from_checkpoint=auto``);
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
  ``proxy_port``, ``listen_address`` and ``max_timeout`` (``mode: serve``'s server:
  ``agent.port``, ``agent.host``, ``agent.timeout``),
  ``rollout_model.engine_num`` and ``tensor_parallel_size``, its vLLM arguments
  (``enable_prefix_caching``, ``gpu_memory_utilization``, ``enforce_eager``), ``dtype``
  and ``seed``;
* ``synchronizer.*`` (the same keys);
* ``trainer.grad_clip``, ``save_interval``, ``use_dynamic_bsz`` with
  ``max_token_len_per_gpu`` (token-budget micro-batches),
  ``ulysses_sequence_parallel_size`` (1 only), ``trainer_type`` (``verl`` only).

A key with no meaning here is an error that names it (with the close match for a
misspelling); nothing is ignored silently. Fitting to this machine is a separate,
listed step (:func:`fit_trinity`), as for ROLL's files. The keys read are listed in
:mod:`agentgym.formats.trinity_keys`; the ``algorithm`` section's tables are in
:mod:`agentgym.formats.trinity_algorithm`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError
from agentgym.formats.fit import Change, Fitting, Machine
from agentgym.formats.native import override_value
from agentgym.formats.trinity_algorithm import algorithm_values
from agentgym.formats.trinity_keys import ENGINE_OPTIONS, KEYS, TRAINER_TYPES, check_keys
from agentgym.formats.trinity_tasksets import eval_taskset_values, taskset_values


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
    check_keys(raw, "")
    values: dict[str, Any] = {}
    notes: list[str] = []
    for key in ("project", "name", "mode", "checkpoint_root_dir"):
        if key in raw:
            values[key] = raw[key]
    if raw.get("mode") == "train":  # the job's trainer continues from its latest checkpoint
        continues = raw.get("continue_from_checkpoint", True)  # Trinity's default
        values["resume_from_checkpoint"] = "auto" if continues else False
    algorithm = raw.get("algorithm") or {}
    values |= algorithm_values(algorithm)
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
    explorer_mode = raw.get("mode", "both") in ("explore", "serve")
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
    serving = {"proxy_port": "port", "listen_address": "host", "max_timeout": "timeout"}
    for key, ours in serving.items():  # mode: serve's server, and each session's time
        if key in explorer:
            values[f"agent.{ours}"] = explorer[key]
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


def _override(key: str, value: Any) -> str:
    """``key=value`` in Hydra's override grammar (free-form mappings get ``++``; a
    config group takes its option's bare name)."""
    if key == "env":
        return f"env={value}"
    prefix = "++" if key.startswith(("env.kwargs.", "actor_infer.")) else ""
    return f"{prefix}{key}={override_value(value)}"


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
