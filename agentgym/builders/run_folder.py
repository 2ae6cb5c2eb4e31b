"""What a process writes into its run folder as it starts: the resolved config
(``train_config.yaml``), ``meta.json``, and the tracker that logs there."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml

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


def open_run_folder(
    config: TrainConfig,
    resolved: dict[str, Any],
    *,
    meta: dict[str, Any] | None = None,
    exp_name: str | None = None,
    **tracker_options: Any,
) -> Tracker:
    """Create ``output_dir``, save the resolved config there (and ``meta.json`` with
    ``meta``, the model and agentgym's version, when ``meta`` is given), and start the
    tracker: our own lines always, plus ``track_with``'s.

    Args:
        config: The checked config.
        resolved: The same config as plain data (saved, and given to the trackers).
        meta: What ``meta.json`` records besides the config (None: no ``meta.json``).
        exp_name: The run's name for the trackers (default ``exp_name``).
        **tracker_options: :func:`~agentgym.trainers.tracking.make_tracker`'s other
            arguments (``run_id``, ``resume_step``, ``total_steps``, ``header``).
    """
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(output_dir / RUN_CONFIG, yaml.safe_dump(resolved, sort_keys=False))
    if meta is not None:
        write_json_atomic(
            output_dir / "meta.json",
            {**meta, "agentgym": installed_version("agentgym"), "config": resolved},
        )
    return make_tracker(
        ["stdout", *(kind for kind in config.track_with if kind != "stdout")],
        logging_dir=config.logging_dir,
        exp_name=exp_name or config.exp_name,
        config=resolved,
        tracker_kwargs=config.tracker_kwargs,
        console_log=output_dir / CONSOLE_LOG_FILE,
        **tracker_options,
    )
