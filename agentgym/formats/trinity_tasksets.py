"""Trinity-RFT's task sets, read as agentgym envs: the explorer's ``taskset`` as the
training env's task set, its ``eval_tasksets`` as the validation envs (one env tag
each), with Trinity's defaults (``trinity/common/config.py``'s ``_check_buffer`` and
``_check_interval``). :mod:`agentgym.formats.trinity` translates the rest of the file."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

WORKFLOWS = {"math_workflow": "math_workflow"}
"""Trinity's ``default_workflow_type`` → the agentgym env that plays it."""

TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
"""An eval task set's name: it becomes an env tag, a key of the command line's
``val_env_manager.env_configs`` mapping, metric names and render file names."""

EVAL_INTERVAL = 100
"""Trinity's ``explorer.eval_interval`` default."""


def read_taskset(
    taskset: Mapping[str, Any], where: str, default_workflow: str | None
) -> tuple[str, dict[str, Any], int]:
    """The env that plays ``taskset`` (its workflow, else ``default_workflow``, else
    ``math_workflow``), the task set as that env's ``taskset`` argument, and its row
    count (``where``: its place in the file)."""
    from agentgym.tasksets import TaskSetError, load_taskset  # datasets: only for task sets

    workflow = taskset.get("default_workflow_type") or default_workflow or "math_workflow"
    if workflow not in WORKFLOWS:
        raise ConfigError(
            f"{where}.default_workflow_type={workflow!r} has no env "
            f"here; built: {sorted(WORKFLOWS)}.{did_you_mean(workflow, WORKFLOWS)}"
        )
    spec = {
        key: taskset[key]
        for key in ("name", "path", "subset_name", "split", "format")
        if key in taskset
    }
    if taskset.get("storage_type", "file") != "file":
        raise ConfigError(
            f"{where}.storage_type={taskset['storage_type']!r}: only "
            "file (a local file or datasets folder) is built"
        )
    if "path" not in spec:
        raise ConfigError(f"{where} needs a path (a file or datasets folder)")
    try:
        rows = len(load_taskset(spec))
    except TaskSetError as error:
        raise ConfigError(f"{where}: {error}") from None
    return WORKFLOWS[workflow], spec, rows


def taskset_values(
    explorer_input: Mapping[str, Any], values: dict[str, Any], notes: list[str]
) -> tuple[str, int]:
    """The env of the explorer's ``taskset`` (its workflow, its task set as the env's
    ``taskset`` argument, its sampling) and the task set's row count."""
    taskset = explorer_input.get("taskset") or {}
    default = explorer_input.get("default_workflow_type")
    env, spec, rows = read_taskset(taskset, "buffer.explorer_input.taskset", default)
    values["env.kwargs.taskset"] = spec
    values["val_env_manager.env_groups"] = min(rows, 4)
    values["val_batch_size"] = min(rows, 4)
    values["val_env_manager.group_size"] = 1
    temperature = (taskset.get("rollout_args") or {}).get("temperature")
    if temperature is not None:
        values["generation.temperature"] = temperature
    notes.append(f"task set {spec.get('name', spec['path'])}: {rows} rows, played by env {env}")
    return env, rows


def eval_taskset_values(raw: Mapping[str, Any], values: dict[str, Any], notes: list[str]) -> None:
    """Trinity's ``buffer.explorer_input.eval_tasksets`` as the run's validation envs
    (into ``values``), as Trinity's explorer evaluates them: one env tag per task set
    (its ``name``; default ``eval_taskset_<i>``), each of its rows ``repeat_times``
    times (default 1) at every validation, every ``explorer.eval_interval`` steps
    (default 100; outside bench, ``max(eval_interval // sync_interval, 1) ×
    sync_interval`` when it is not a multiple, as Trinity rounds it) and at the
    start (``explorer.eval_on_startup``, default true).
    A task set without a path is skipped, as in Trinity; without any, the run does
    not validate (Trinity's explorer skips evaluation).

    Raises:
        ConfigError: On two task sets of one name, task sets sampled at different
            temperatures (validation has one here), an ``eval_interval`` below 1, or
            a task set that cannot be read.
    """
    explorer = raw.get("explorer") or {}
    explorer_input = (raw.get("buffer") or {}).get("explorer_input") or {}
    listed = explorer_input.get("eval_tasksets") or []
    counts: dict[str, int] = {}
    configs: dict[str, Any] = {}
    temperatures: dict[str, float] = {}
    for index, taskset in enumerate(listed):
        where = f"buffer.explorer_input.eval_tasksets[{index}]"
        if not taskset.get("path"):
            notes.append(f"{where} has no path: skipped, as Trinity skips it")
            continue
        name = str(taskset.get("name") or f"eval_taskset_{index}")
        literal = name.lower() in ("null", "true", "false", "nan", "inf")  # read as values
        if literal or not TAG_NAME.fullmatch(name):  # a tag: a config key, metric, file name
            raise ConfigError(
                f"{where}.name={name!r}: name an eval task set with letters, digits, '_', "
                "'-' and '.', starting with a letter or '_'"
            )
        if name in configs:
            raise ConfigError(f"{where}.name={name!r} names two eval task sets; name each once")
        env, spec, rows = read_taskset(taskset, where, explorer_input.get("default_workflow_type"))
        repeat = int(taskset.get("repeat_times") or 1)
        counts[name] = rows * repeat
        configs[name] = {"name": env, "kwargs": {"taskset": spec}}
        temperature = (taskset.get("rollout_args") or {}).get("temperature")
        temperatures[name] = 1.0 if temperature is None else float(temperature)
        notes.append(
            f"eval task set {name}: {rows} rows × {repeat} at each validation, played by env {env}"
        )
    if not configs:
        values["eval_steps"] = 0
        return
    if len(set(temperatures.values())) > 1:
        raise ConfigError(
            f"eval_tasksets' rollout_args.temperature differ ({temperatures}): validation "
            "samples at one temperature here (validation.temperature); give them one"
        )
    interval = int(explorer.get("eval_interval", EVAL_INTERVAL))
    if interval < 1:
        raise ConfigError(f"explorer.eval_interval={interval} must be at least 1")
    sync = int((raw.get("synchronizer") or {}).get("sync_interval", 1))
    if raw.get("mode", "both") != "bench" and interval % sync:
        rounded = max(interval // sync, 1) * sync
        notes.append(
            f"explorer.eval_interval={interval} → {rounded}: a multiple of "
            f"synchronizer.sync_interval={sync}, as Trinity rounds it"
        )
        interval = rounded
    total = sum(counts.values())
    values |= {
        "val_env_manager.tags": list(configs),
        "val_env_manager.n_groups": list(counts.values()),
        "val_env_manager.env_groups": total,
        "val_env_manager.group_size": 1,
        "val_env_manager.env_configs": configs,
        "val_batch_size": total,
        "validation.temperature": next(iter(temperatures.values())),
        "validation.on_startup": bool(explorer.get("eval_on_startup", True)),
        "eval_steps": interval,
    }
