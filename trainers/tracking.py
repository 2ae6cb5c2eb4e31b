"""Trackers: where training metrics go (stdout + JSONL, TensorBoard, Weights & Biases,
SwanLab).

:func:`make_tracker` builds one :class:`Tracker` that fans each ``log`` call
out to every backend named in ``track_with``. A run has one id: the wandb run
id when wandb is on, else a generated one. A checkpoint stores it, and
passing it back as ``run_id`` continues the same wandb and SwanLab run and
the same TensorBoard folder.

TensorBoard (``torch.utils.tensorboard``), wandb and SwanLab are imported only
when asked for, here and nowhere else.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

from agentgym.console import STEP_TIME, StepTimer, echo, format_line, is_validation
from agentgym.errors import did_you_mean
from agentgym.fileio import write_atomic

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


class StdoutTracker:
    """One line per logged step on stdout (and in a console log); every metric
    in a JSON-lines file.

    The line (:func:`agentgym.console.format_line`) has the figures that
    matter and, given ``total_steps``, ``12/60`` and an ETA from the mean wall
    time per step so far (:class:`agentgym.console.StepTimer`); a validation
    record gets a validation line. Each line is flushed at once, so that a
    pipe (``| tee``) or a file shows it as soon as it is printed, and appended
    to ``console_log`` as well.

    Each line of the metrics file is ``{"step": N, "<metric>": value, ...}``,
    written and flushed at every :meth:`log`. A fresh run starts the file anew; a
    resumed run appends, after dropping a torn last line and, when
    ``resume_step`` is given, the lines past it (logged after the last
    checkpoint by the run that was interrupted).

    Args:
        metrics_file: The JSON-lines file, or ``None`` for none.
        resume: Append to an existing file instead of starting anew.
        resume_step: The step the run resumes from.
        stream: Where the lines go (default: ``sys.stdout``).
        total_steps: The run's last step (for ``12/60`` and the ETA); None: neither.
        console_log: A text file the lines are appended to (such as the run's
            ``train.log``), or None.
        timer: The ETA's clock (a :class:`~agentgym.console.StepTimer` with a fake
            clock in tests).
        header: Written as the file's first line, ``{"step": 0, "run": header}``
            (e.g. the envs' ids and generator versions, so that a figure names
            its ruleset); not on resume.
    """

    def __init__(
        self,
        metrics_file: str | Path | None = None,
        *,
        resume: bool = False,
        resume_step: int | None = None,
        stream: IO[str] | None = None,
        total_steps: int | None = None,
        console_log: str | Path | None = None,
        timer: StepTimer | None = None,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_id: str | None = None
        self.total_steps = total_steps
        self._stream = stream
        self._timer = timer or StepTimer()
        self._file: IO[str] | None = None
        self._console_log = Path(console_log) if console_log is not None else None
        if metrics_file is not None:
            path = Path(metrics_file)
            path.parent.mkdir(parents=True, exist_ok=True)
            if resume:
                _trim_metrics_file(path, resume_step)
            self._file = path.open("a" if resume else "w", encoding="utf-8")
            if header is not None and not resume:  # what the run is: its first line
                self._file.write(json.dumps({"step": 0, "run": dict(header)}) + "\n")
        if self._console_log is not None:
            self._console_log.parent.mkdir(parents=True, exist_ok=True)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Print the line and append the JSON line."""
        values = {key: _as_float(key, value) for key, value in metrics.items()}
        seconds_left = None
        if self.total_steps is not None and not is_validation(values):
            seconds_left = self._timer.seconds_left(step, self.total_steps, values.get(STEP_TIME))
        line = format_line(values, step, self.total_steps, seconds_left)
        echo(line, self._console_log, self._stream)
        if self._file is not None:
            record = {"step": step, **values}
            record["step"] = step  # the training step wins over a metric named "step"
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the JSON-lines file."""
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardTracker:
    """``add_scalar`` per metric into ``log_dir`` through ``torch.utils.tensorboard``.

    Args:
        log_dir: The event-file folder (one per run).
        config: Written once as a text summary named ``config`` (fresh runs only).
        purge_step: On resume, events at or after this step (logged by the
            interrupted run after its last checkpoint) are hidden.
        **writer_kwargs: Passed to ``SummaryWriter`` (``flush_secs``, ``max_queue``, ...).

    Raises:
        ImportError: When TensorBoard is not installed.
    """

    def __init__(
        self,
        log_dir: str | Path,
        *,
        config: Mapping[str, Any] | None = None,
        purge_step: int | None = None,
        **writer_kwargs: Any,
    ) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ImportError(
                "track_with=tensorboard needs TensorBoard: pip install tensorboard"
            ) from error
        self.run_id: str | None = None
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step, **writer_kwargs)
        if config and purge_step is None:
            text = json.dumps(_plain(config), indent=2, default=str)
            self._writer.add_text("config", "```\n" + text + "\n```")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Add one scalar per metric at ``step`` and flush."""
        for key, value in metrics.items():
            self._writer.add_scalar(key, _as_float(key, value), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


class WandbTracker:
    """A Weights & Biases run; offline unless an API key or a mode says otherwise.

    The run is offline when neither ``mode`` nor ``WANDB_MODE`` is given and
    neither ``api_key`` nor ``WANDB_API_KEY`` is set; upload it later with
    ``wandb sync <dir>/wandb/offline-run-*``.

    Args:
        logging_dir: The run's files go under ``logging_dir/wandb`` (unless ``dir`` is given).
        exp_name: The run name (unless ``name`` is given).
        config: The run config.
        run_id: The run id; an existing run with this id is continued (``resume="allow"``).
        **init_kwargs: Passed to ``wandb.init`` (``project``, ``entity``, ``tags``,
            ``mode``, ...), overriding the above; ``api_key`` goes into its settings.

    Raises:
        ImportError: When wandb is not installed.
    """

    def __init__(
        self,
        *,
        logging_dir: str | Path,
        exp_name: str,
        config: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        **init_kwargs: Any,
    ) -> None:
        wandb = _import_wandb()
        kwargs, api_key = _run_kwargs(
            "WANDB", {"dir": str(logging_dir)}, exp_name, config, run_id, init_kwargs
        )
        if api_key is not None:
            kwargs["settings"] = wandb.Settings(api_key=api_key)
        if kwargs.get("dir"):
            Path(kwargs["dir"]).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(**kwargs)
        self.run_id: str | None = self._run.id
        self.offline = bool(self._run.offline)
        if self.offline:
            logger.info("wandb runs offline; files in %s", Path(self._run.dir).parent)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` to the run at ``step``."""
        self._run.log({key: _as_float(key, value) for key, value in metrics.items()}, step=step)

    def close(self) -> None:
        """Finish the run."""
        run_dir = Path(self._run.dir).parent
        self._run.finish()
        if self.offline:
            logger.info("wandb offline run saved; upload it with: wandb sync %s", run_dir)


class SwanLabTracker:
    """A SwanLab run (ROLL's ``track_with: swanlab``); offline unless a key or a mode says
    otherwise.

    The run is offline when neither ``mode`` nor ``SWANLAB_MODE`` is given and
    neither ``api_key`` nor ``SWANLAB_API_KEY`` is set; upload it later with
    ``swanlab sync <logging_dir>/swanlab/run-*``.

    Args:
        logging_dir: The run's files go under ``logging_dir/swanlab`` (unless ``log_dir``
            is given).
        exp_name: The experiment name (unless ``name`` is given).
        config: The run config.
        run_id: The run id; a run with this id is continued (``resume="allow"``).
        **init_kwargs: Passed to ``swanlab.init`` (``project``, ``workspace``, ``tags``,
            ``mode``, ...), overriding the above; ``api_key`` logs in first.

    Raises:
        ImportError: When SwanLab is not installed.
    """

    def __init__(
        self,
        *,
        logging_dir: str | Path,
        exp_name: str,
        config: Mapping[str, Any] | None = None,
        run_id: str | None = None,
        **init_kwargs: Any,
    ) -> None:
        swanlab = _import_swanlab()
        location = {"log_dir": str(Path(logging_dir) / "swanlab")}
        kwargs, api_key = _run_kwargs("SWANLAB", location, exp_name, config, run_id, init_kwargs)
        if api_key is not None:
            swanlab.login(api_key=api_key)
        Path(kwargs["log_dir"]).mkdir(parents=True, exist_ok=True)
        self._run = swanlab.init(**kwargs)
        self.run_id: str | None = self._run.id
        self.offline = kwargs.get("mode") == "offline"

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` to the run at ``step``."""
        self._run.log({key: _as_float(key, value) for key, value in metrics.items()}, step=step)

    def close(self) -> None:
        """Finish the run."""
        self._run.finish()


def _run_kwargs(
    service: str,
    location: Mapping[str, str],
    exp_name: str,
    config: Mapping[str, Any] | None,
    run_id: str | None,
    init_kwargs: Mapping[str, Any],
) -> tuple[dict[str, Any], str | None]:
    """The keyword arguments of a hosted tracker's ``init`` (wandb, SwanLab) and the
    API key taken out of them.

    The run is named ``exp_name`` in the ``agentgym`` project, written at ``location``,
    continued when ``run_id`` names an existing one (``resume="allow"``); ``init_kwargs``
    override all of it. It is offline unless a ``mode``, ``<service>_MODE``, the key or
    ``<service>_API_KEY`` says otherwise.

    Args:
        service: The environment variables' prefix (``WANDB``, ``SWANLAB``).
        location: Where the run's files go (the ``init`` keyword and the folder).
        exp_name: The run name.
        config: The run config.
        run_id: The run id.
        init_kwargs: The user's ``init`` arguments (``api_key`` among them or not).

    Returns:
        ``(kwargs, api_key)``.
    """
    kwargs: dict[str, Any] = {
        "project": "agentgym",
        "name": exp_name,
        **location,
        "config": _plain(config) if config is not None else None,
        "id": run_id,
        "resume": "allow",
    }
    kwargs.update(init_kwargs)
    api_key = kwargs.pop("api_key", None)
    has_key = api_key is not None or bool(os.environ.get(f"{service}_API_KEY"))
    if kwargs.get("mode") is None and not os.environ.get(f"{service}_MODE") and not has_key:
        kwargs["mode"] = "offline"
    return kwargs, api_key


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
        # wandb first: its run id (possibly set in tracker_kwargs) names the run.
        if "wandb" in names:
            wandb_tracker = WandbTracker(
                logging_dir=logging_dir,
                exp_name=exp_name,
                config=config,
                run_id=run_id,
                **per_kind["wandb"],
            )
            run_id = wandb_tracker.run_id or run_id
            built["wandb"] = wandb_tracker
        if "swanlab" in names:
            built["swanlab"] = SwanLabTracker(
                logging_dir=logging_dir,
                exp_name=exp_name,
                config=config,
                run_id=run_id,
                **per_kind["swanlab"],
            )
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


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as error:
        raise ImportError(
            "track_with=wandb needs Weights & Biases: pip install wandb "
            "(or drop wandb from track_with)"
        ) from error
    return wandb


def _import_swanlab() -> Any:
    try:
        import swanlab  # type: ignore[import-untyped]
    except ImportError as error:
        raise ImportError(
            "track_with=swanlab needs SwanLab: pip install swanlab (in agentgym's dev "
            "extra), or drop swanlab from track_with"
        ) from error
    return swanlab


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
        parameters = set(inspect.signature(_import_wandb().init).parameters)
        return parameters - {"anonymous", "config"} | {"api_key"}
    if kind == "swanlab":
        # `config` comes from make_tracker's own argument.
        parameters = set(inspect.signature(_import_swanlab().init).parameters)
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
            per_kind[kind] = _plain(section)
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
            per_kind[name][key] = _plain(value)
    return per_kind


def _trim_metrics_file(path: Path, resume_step: int | None) -> None:
    """Drop a torn last line and lines past ``resume_step`` before appending."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        if not line.endswith("\n"):
            break  # torn by a kill mid-write
        if resume_step is not None:
            try:
                step = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):
                step = None
            if isinstance(step, int) and step > resume_step:
                continue
        kept.append(line)
    if len(kept) != len(lines):
        write_atomic(path, "".join(kept))


def _plain(value: Any) -> Any:
    """Mappings and sequences (OmegaConf's included) as dicts and lists, for wandb and JSON."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(item) for item in value]
    return value


def _as_float(key: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"Metric {key!r} must be a number (or a one-element tensor), got {value!r}"
        ) from None
