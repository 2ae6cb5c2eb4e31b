"""Trackers: where training metrics go (stdout + JSONL, TensorBoard, Weights & Biases,
SwanLab).

:func:`make_tracker` builds one :class:`Tracker` that fans each ``log`` call
out to every backend named in ``track_with``. A run has one id: the wandb run
id when wandb is on, else a generated one. A checkpoint stores it, and
passing it back as ``run_id`` continues the same wandb and SwanLab run and
the same TensorBoard folder.

The backends live beside it: :mod:`~agentgym.trainers.local_trackers` (stdout with
``metrics.jsonl``, TensorBoard) and :mod:`~agentgym.trainers.hosted_trackers` (wandb,
SwanLab). TensorBoard, wandb and SwanLab are imported only when asked for, in those
modules and nowhere else.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentgym.errors import did_you_mean
from agentgym.trainers.hosted_trackers import (
    HostedRun,
    SwanLabTracker,
    WandbTracker,
    import_swanlab,
    import_wandb,
)
from agentgym.trainers.local_trackers import StdoutTracker, TensorBoardTracker, plain

logger = logging.getLogger(__name__)

TRACKERS = ("stdout", "tensorboard", "wandb", "swanlab")
"""Tracker names accepted by :func:`make_tracker`."""

METRICS_FILE = "metrics.jsonl"
"""Name of the JSON-lines file (in ``logging_dir``) that the stdout tracker writes."""

CONSOLE_LOG_FILE = "train.log"
"""Name of the file (in the run's output folder) that repeats the console's lines."""


@runtime_checkable
class Tracker(Protocol):
    """Receives a flat dict of scalar metrics once per logged step."""

    run_id: str | None
    """The id to store in checkpoints and pass back to :func:`make_tracker` on resume."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (flat ``"group/name": value``) at training ``step``."""
        ...

    def close(self) -> None:
        """Flush and release files and runs; the tracker is unusable afterwards."""
        ...


class CompositeTracker:
    """Fans each call out to several trackers.

    Args:
        trackers: The backends, called in order.
        run_id: The run's id (see :func:`make_tracker`).
    """

    def __init__(self, trackers: Sequence[Tracker], run_id: str | None) -> None:
        self.trackers = tuple(trackers)
        self.run_id = run_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log to every tracker."""
        for tracker in self.trackers:
            tracker.log(metrics, step)

    def close(self) -> None:
        """Close every tracker, even when one fails; the first error is raised after."""
        first_error: BaseException | None = None
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as error:
                logger.exception("Closing %s failed", type(tracker).__name__)
                first_error = first_error or error
        if first_error is not None:
            raise first_error

    def __enter__(self) -> CompositeTracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def make_tracker(
    kinds: Sequence[str] | str,
    *,
    logging_dir: str | Path,
    exp_name: str,
    config: Mapping[str, Any] | None = None,
    tracker_kwargs: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    resume_step: int | None = None,
    total_steps: int | None = None,
    console_log: str | Path | None = None,
    header: Mapping[str, Any] | None = None,
) -> CompositeTracker:
    """Build the trackers named in ``kinds`` as one.

    ``stdout`` prints :func:`~agentgym.console.format_line` per step (also
    appended to ``console_log``) and writes every metric to
    ``logging_dir/metrics.jsonl``; ``tensorboard`` writes event files to
    ``logging_dir/tensorboard/<run_id>``; ``wandb`` starts a run under
    ``logging_dir/wandb`` (offline without an API key, see :class:`WandbTracker`);
    ``swanlab`` likewise under ``logging_dir/swanlab`` (:class:`SwanLabTracker`).

    ``tracker_kwargs`` is either flat, each key going to the backends whose
    constructor takes it (``wandb.init``: ``project``, ``entity``, ``tags``,
    ``mode``, ``api_key``, ...; ``swanlab.init``: ``workspace``, ``group``, ...;
    ``SummaryWriter``: ``flush_secs``, ``log_dir``
    (the root instead of ``logging_dir/tensorboard``), ...), or nested by
    tracker name: ``{"wandb": {...}, "tensorboard": {...}}``.

    Args:
        kinds: Names from :data:`TRACKERS`: a list, or one string
            (``"wandb"``, ``"stdout,tensorboard"``).
        logging_dir: Where the trackers write (created if missing).
        exp_name: The experiment name (the wandb run name).
        config: The resolved run config (wandb config, TensorBoard text).
        tracker_kwargs: Backend arguments, flat or nested by tracker name.
        run_id: The id of the run to continue (from a checkpoint); ``None``
            starts a new run with a new id.
        resume_step: With ``run_id``: the checkpoint's step. Metrics the
            interrupted run logged after it are dropped from ``metrics.jsonl``
            and hidden in TensorBoard, so resumed logs read like one run
            (wandb cannot rewind a run: there they stay).
        total_steps: The run's last step: the stdout line shows ``step 12/60``
            and an ETA. None: the step alone.
        console_log: A file the stdout lines are appended to, such as the
            run's ``train.log`` (:data:`CONSOLE_LOG_FILE`); None: none.

    Returns:
        A :class:`CompositeTracker`; its ``run_id`` is the wandb run id when
        wandb is on, else ``run_id`` or a new 16-digit hex id.

    Raises:
        ValueError: On an unknown tracker name or an argument no chosen tracker takes.
        ImportError: When TensorBoard, wandb or SwanLab is asked for and not installed.
    """
    names = _parse_kinds(kinds)
    per_kind = _split_kwargs(tracker_kwargs or {}, names)
    logging_dir = Path(logging_dir)
    logging_dir.mkdir(parents=True, exist_ok=True)
    resume = run_id is not None
    run_id = run_id or uuid.uuid4().hex[:16]

    built: dict[str, Tracker] = {}
    try:
        hosted = HostedRun(logging_dir=logging_dir, exp_name=exp_name, config=config, run_id=run_id)
        # wandb first: its run id (possibly set in tracker_kwargs) names the run.
        if "wandb" in names:
            wandb_tracker = WandbTracker(hosted, **per_kind["wandb"])
            run_id = wandb_tracker.run_id or run_id
            built["wandb"] = wandb_tracker
        if "swanlab" in names:
            built["swanlab"] = SwanLabTracker(replace(hosted, run_id=run_id), **per_kind["swanlab"])
        if "tensorboard" in names:
            writer_kwargs = dict(per_kind["tensorboard"])
            tb_root = Path(writer_kwargs.pop("log_dir", logging_dir / "tensorboard"))
            purge_step = resume_step + 1 if resume and resume_step is not None else None
            writer_kwargs.setdefault("purge_step", purge_step)
            built["tensorboard"] = TensorBoardTracker(
                tb_root / run_id, config=config, **writer_kwargs
            )
        if "stdout" in names:
            built["stdout"] = StdoutTracker(
                logging_dir / METRICS_FILE,
                resume=resume,
                resume_step=resume_step,
                total_steps=total_steps,
                console_log=console_log,
                header=header,
            )
    except BaseException:
        for tracker in built.values():
            tracker.close()
        raise
    return CompositeTracker([built[name] for name in names], run_id=run_id)


def _parse_kinds(kinds: Sequence[str] | str) -> list[str]:
    if isinstance(kinds, str):
        kinds = [part for part in kinds.split(",") if part.strip()]
    names: list[str] = []
    for kind in kinds:
        name = str(kind).strip().lower()
        if name not in TRACKERS:
            raise ValueError(
                f"Unknown tracker {kind!r} in track_with; valid options: {list(TRACKERS)}"
                + did_you_mean(name, TRACKERS)
            )
        if name not in names:
            names.append(name)
    return names


def _accepted_kwargs(kind: str) -> set[str]:
    """Keyword arguments a backend constructor takes from ``tracker_kwargs``."""
    if kind == "wandb":
        # `config` comes from make_tracker's own argument.
        parameters = set(inspect.signature(import_wandb().init).parameters)
        return parameters - {"anonymous", "config"} | {"api_key"}
    if kind == "swanlab":
        # `config` comes from make_tracker's own argument.
        parameters = set(inspect.signature(import_swanlab().init).parameters)
        return parameters - {"config", "kwargs", "callbacks", "settings"} | {"api_key"}
    if kind == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return {"log_dir", "purge_step", "max_queue", "flush_secs", "filename_suffix"}
        return set(inspect.signature(SummaryWriter.__init__).parameters) - {"self", "comment"}
    return set()


def _split_kwargs(
    tracker_kwargs: Mapping[str, Any], names: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Route ``tracker_kwargs`` to the chosen backends (see :func:`make_tracker`)."""
    per_kind: dict[str, dict[str, Any]] = {name: {} for name in TRACKERS}
    nested = [key for key in tracker_kwargs if key in TRACKERS]
    if nested:
        flat = [key for key in tracker_kwargs if key not in TRACKERS]
        if flat:
            raise ValueError(
                f"tracker_kwargs mixes per-tracker sections {nested} with flat keys {flat}; "
                f"put every key under a tracker name ({list(TRACKERS)}) or none"
            )
        for kind, section in tracker_kwargs.items():
            if kind not in names:
                continue  # a section for a tracker that is not on: allowed, unused
            if not isinstance(section, Mapping):
                raise ValueError(
                    f"tracker_kwargs.{kind} must be a mapping of arguments, got {section!r}"
                )
            valid = sorted(_accepted_kwargs(kind))
            for key in section:
                if key not in valid:
                    raise ValueError(
                        f"tracker_kwargs.{kind}.{key} is not an argument of the {kind} tracker; "
                        f"valid keys: {valid}" + did_you_mean(key, valid)
                    )
            per_kind[kind] = plain(section)
        return per_kind

    if not tracker_kwargs:
        return per_kind
    accepted = {name: _accepted_kwargs(name) for name in names}
    for key, value in tracker_kwargs.items():
        takers = [name for name in names if key in accepted[name]]
        if not takers:
            valid = sorted(set().union(*accepted.values()))
            raise ValueError(
                f"tracker_kwargs.{key}={value!r} is not an argument of the chosen trackers "
                f"{list(names)}; valid keys: {valid}" + did_you_mean(key, valid)
            )
        for name in takers:
            per_kind[name][key] = plain(value)
    return per_kind
