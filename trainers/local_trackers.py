"""The trackers that write on this machine: the stdout line with ``metrics.jsonl``, and
TensorBoard's event files; with the helpers every tracker uses on its values.

:func:`~agentgym.trainers.tracking.make_tracker` builds them; TensorBoard
(``torch.utils.tensorboard``) is imported only when one is made.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from agentgym.console import STEP_TIME, StepTimer, echo, format_line, is_validation
from agentgym.fileio import write_atomic


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
        values = {key: as_float(key, value) for key, value in metrics.items()}
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
                "track_with=tensorboard needs TensorBoard: pip install 'agentgym[tensorboard]'"
            ) from error
        self.run_id: str | None = None
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step, **writer_kwargs)
        if config and purge_step is None:
            text = json.dumps(plain(config), indent=2, default=str)
            self._writer.add_text("config", "```\n" + text + "\n```")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Add one scalar per metric at ``step`` and flush."""
        for key, value in metrics.items():
            self._writer.add_scalar(key, as_float(key, value), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()


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


def plain(value: Any) -> Any:
    """Mappings and sequences (OmegaConf's included) as dicts and lists, for wandb and JSON."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [plain(item) for item in value]
    return value


def as_float(key: str, value: Any) -> float:
    """``value`` as a float; a metric that is not a number is a :class:`TypeError` naming it."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"Metric {key!r} must be a number (or a one-element tensor), got {value!r}"
        ) from None
