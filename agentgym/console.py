"""What a person reads on the console during a run: our lines, and nobody else's.

Our lines: :func:`format_line` turns one logged step into a line with the
figures that matter (``step 12/60 | success 41.2% | score 3.20 | ... | ETA 4m10s``)
or a validation line per env tag; :class:`StepTimer` gives the ETA.

Everyone else's: :func:`library_logs` sends what the engine and the libraries
log (vLLM's INFO lines, torch and transformers warnings, ``warnings.warn`` from
installed packages) to a log file for the duration of a run, and
:class:`LibraryLogSummary` reads that file back as a few lines: counts by
level and the messages that repeat.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import sys
import sysconfig
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO

from tqdm import tqdm  # type: ignore[import-untyped]

from agentgym.log_summary import LibraryLogSummary

# --------------------------------------------------------------------- our lines


@dataclass(frozen=True)
class Figure:
    """One figure of the step line: its label, the metric keys that may hold it
    (the first present wins) and how its value is written."""

    label: str
    keys: tuple[str, ...]
    template: str


STEP_FIGURES: tuple[Figure, ...] = (
    Figure("success", ("train/all/success", "train/success"), "{:.1%}"),
    Figure("score", ("train/all/score", "train/score"), "{:.2f}"),
    Figure("loss", ("actor/pg_loss", "actor/loss"), "{:.3g}"),
    Figure("kl", ("actor/kl", "actor/token_level_kl"), "{:.3g}"),
    Figure("entropy", ("actor/entropy",), "{:.3g}"),
    Figure("grad", ("actor/grad_norm",), "{:.3g}"),
    Figure("failed", ("train/failed",), "{:.0f}"),
)
"""The figures of a step line, in order; those whose keys are absent are left out."""

STEP_TIME = "time/step"
"""The metric with the seconds a step took."""

_VAL = re.compile(r"^val/(?:(?P<tag>[^/]+)/)?(?P<name>success|score|trajectories)$")


def format_duration(seconds: float) -> str:
    """``42s``, ``5m09s`` or ``2h05m``: a duration at the precision a person needs."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _step_label(kind: str, step: int, total_steps: int | None) -> str:
    if total_steps is None:
        return f"{kind:<4} {step}"
    return f"{kind:<4} {step:>{len(str(total_steps))}}/{total_steps}"


def format_step(
    metrics: Mapping[str, float],
    step: int,
    total_steps: int | None = None,
    seconds_left: float | None = None,
) -> str:
    """The line of a training step.

    Args:
        metrics: Flat scalar metrics of the step.
        step: The training step.
        total_steps: The run's last step, for ``12/60``; None leaves it out.
        seconds_left: The ETA; None leaves it out.

    Returns:
        A line like ``step 12/60 | success 41.0% | score 3.20 | loss -0.012 | grad 0.5 |
        2.8 s/step | ETA 2m14s``: the :data:`STEP_FIGURES` that are present, then time.
    """
    parts = [_step_label("step", step, total_steps)]
    for figure in STEP_FIGURES:
        key = next((key for key in figure.keys if key in metrics), None)
        if key is not None:
            parts.append(f"{figure.label} {figure.template.format(metrics[key])}")
    if STEP_TIME in metrics:
        parts.append(f"{metrics[STEP_TIME]:.3g} s/step")
    if seconds_left is not None:
        parts.append(f"ETA {format_duration(seconds_left)}")
    return " | ".join(parts)


def format_validation(
    metrics: Mapping[str, float], step: int, total_steps: int | None = None
) -> str:
    """The line of a validation: success and score per env tag.

    Keys are ``val/<tag>/<name>`` (``val/<name>`` counts as tag ``all``). With
    one tag, ``all`` repeats it and is left out.

    Returns:
        A line like ``val  15/60 | sokoban success 41.2% score 3.20 | 512 episodes``.
    """
    by_tag: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        match = _VAL.match(key)
        if match:
            by_tag.setdefault(match["tag"] or "all", {})[match["name"]] = value
    overall = by_tag.pop("all", {})
    if not by_tag or (len(by_tag) > 1 and overall):
        by_tag["all"] = overall  # the overall figures close the line
    parts = [_step_label("val", step, total_steps)]
    for tag, values in by_tag.items():
        figures = [tag]
        if "success" in values:
            figures.append(f"success {values['success']:.1%}")
        if "score" in values:
            figures.append(f"score {values['score']:.2f}")
        if len(figures) > 1:
            parts.append(" ".join(figures))
    if "trajectories" in overall:
        parts.append(f"{overall['trajectories']:.0f} episodes")
    return " | ".join(parts)


def is_validation(metrics: Mapping[str, float]) -> bool:
    """Whether ``metrics`` is a validation record: every key is a ``val/`` one."""
    return bool(metrics) and all(key.startswith("val/") for key in metrics)


def format_line(
    metrics: Mapping[str, float],
    step: int,
    total_steps: int | None = None,
    seconds_left: float | None = None,
) -> str:
    """The console line of one logged record: :func:`format_validation` for a
    validation record, else :func:`format_step`."""
    if is_validation(metrics):
        return format_validation(metrics, step, total_steps)
    return format_step(metrics, step, total_steps, seconds_left)


class StepTimer:
    """The ETA from the mean wall time per step since the first logged step.

    Wall time, not the steps' own ``time/step``: what runs between steps
    (validation, checkpoints) takes time too, and the ETA should include it.
    The first step's own duration counts as measured, since no earlier log
    marks its start.

    Args:
        clock: Seconds, monotonic (``time.monotonic``; a fake one in tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first: tuple[float, int, float | None] | None = None

    def seconds_left(
        self, step: int, total_steps: int, step_seconds: float | None = None
    ) -> float | None:
        """Record that ``step`` just ended and estimate the seconds to ``total_steps``.

        Args:
            step: The step that ended.
            total_steps: The run's last step.
            step_seconds: The step's own duration, if measured.

        Returns:
            Mean seconds per step × steps left, or None before any step was timed.
        """
        now = self._clock()
        if self._first is None:
            self._first = (now, step, step_seconds)
        started, first_step, first_seconds = self._first
        elapsed, steps = now - started, step - first_step
        if first_seconds is not None:
            elapsed, steps = elapsed + first_seconds, steps + 1
        if steps <= 0:
            return None
        return elapsed / steps * max(total_steps - step, 0)


def echo(text: str, log_file: str | Path | None = None, stream: IO[str] | None = None) -> None:
    """Print ``text`` at once and append it to ``log_file``: a console line that
    the run's ``train.log`` keeps too.

    Args:
        text: One line or several.
        log_file: A text file to append to (opened per call: Hydra's handler
            writes the same ``train.log``); None: the console only.
        stream: Where to print (default: ``sys.stdout``).
    """
    stream = stream or sys.stdout
    tqdm.write(text, file=stream)  # keeps progress bars intact below the text
    stream.flush()  # shown at once in a pipe (``| tee``) too
    if log_file is not None:
        with Path(log_file).open("a", encoding="utf-8") as file:
            file.write(text + "\n")


# -------------------------------------------------------------------- their logs

CONSOLE_LOGGERS = ("agentgym", "__main__")
"""Loggers whose records (and their children's) stay on the console."""

LIBRARY_LOG_FILE = "libraries.log"
"""The name of :func:`library_logs`' file in a run's output folder."""

LOG_FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
"""One record of the library log; :class:`~agentgym.log_summary.LibraryLogSummary`
parses it back."""


class _Names:
    """Whether a logger name is one of ``names`` or a child of one."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)

    def __call__(self, name: str) -> bool:
        return any(name == n or name.startswith(n + ".") for n in self.names)


class _ConsoleOnly(logging.Filter):
    """Passes our records, and the libraries' from ``level`` up (errors stay visible)."""

    def __init__(self, ours: _Names, level: int) -> None:
        super().__init__()
        self.ours, self.level = ours, level

    def filter(self, record: logging.LogRecord) -> bool:
        return self.ours(record.name) or record.levelno >= self.level


class _LibrariesOnly(logging.Filter):
    def __init__(self, ours: _Names) -> None:
        super().__init__()
        self.ours = ours

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.ours(record.name)


@contextmanager
def library_logs(
    log_file: str | Path,
    *,
    console_loggers: Sequence[str] = CONSOLE_LOGGERS,
    console_level: int = logging.ERROR,
) -> Iterator[LibraryLogSummary]:
    """Send the libraries' logs to ``log_file`` instead of the console, for a run.

    While the block runs:

    - records of every logger but ``console_loggers`` go to ``log_file``, not to
      the root logger's handlers (Hydra's console and ``train.log``); those
      from ``console_level`` up go to both;
    - libraries' own console handlers (torch's, huggingface_hub's, vLLM's when
      imported before) are taken off and their records routed the same way;
      transformers, which installs its handler on first use, is set to
      propagate now, and its progress bars are off;
    - vLLM, imported later, logs to ``log_file`` through its own switch
      (``VLLM_LOGGING_CONFIG_PATH``), which its spawned engine process reads
      too; a user's ``VLLM_LOGGING_CONFIG_PATH`` or ``VLLM_CONFIGURE_LOGGING=0``
      is left alone;
    - ``warnings.warn`` from installed packages (``site-packages``) and the
      standard library is written to ``log_file`` under the package's name;
      other warnings (ours, a script's) are shown as usual.

    Everything is put back on exit. On an exception, :meth:`LibraryLogSummary.summary`
    is printed to stderr, since the cause may be in the file.

    Args:
        log_file: The log file (appended to; its folder is created).
        console_loggers: Logger names that stay on the console.
        console_level: Library records from this level up are also shown.

    Yields:
        A :class:`LibraryLogSummary` of the records this block adds to ``log_file``.
    """
    path = Path(log_file).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = LibraryLogSummary(path, path.stat().st_size if path.exists() else 0)
    ours = _Names(console_loggers)
    with ExitStack() as undo:
        _quiet_transformers(undo)
        _route_vllm(path, console_level, undo)
        handler = _route_root(path, ours, console_level, undo)
        _take_console_handlers(ours, undo)
        _route_warnings(handler, ours, undo)
        try:
            yield summary
        except BaseException:
            undo.close()
            print(summary.summary(), file=sys.stderr)
            raise


def _quiet_transformers(undo: ExitStack) -> None:
    """transformers adds its stderr handler on first use, which may come after
    the scan of :func:`_take_console_handlers`: its own switches instead."""
    if importlib.util.find_spec("transformers") is None:
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_default_handler()
    undo.callback(hf_logging.enable_default_handler)
    library = logging.getLogger("transformers")
    if not library.propagate:
        library.propagate = True
        undo.callback(setattr, library, "propagate", False)
    if hf_logging.is_progress_bar_enabled():
        hf_logging.disable_progress_bar()
        undo.callback(hf_logging.enable_progress_bar)


def _route_vllm(path: Path, console_level: int, undo: ExitStack) -> None:
    """Point vLLM's logging switch at ``path`` (read when vLLM is imported, in
    this process and in its engine's)."""
    if importlib.util.find_spec("vllm") is None:
        return
    if "VLLM_LOGGING_CONFIG_PATH" in os.environ or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        return  # the user's choice; with vLLM's logging off its records reach the root
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        # the console's format is not LOG_FORMAT: where the engine's stderr is the
        # log file (redirect_output), its errors are not counted twice
        "formatters": {
            "agentgym": {"format": LOG_FORMAT},
            "console": {"format": "%(levelname)s %(name)s: %(message)s"},
        },
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": str(path),
                "encoding": "utf-8",
                "formatter": "agentgym",
            },
            "console": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "level": logging.getLevelName(console_level),
                "formatter": "console",
            },
        },
        "loggers": {
            "vllm": {
                "handlers": ["file", "console"],
                "level": os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper(),
                "propagate": False,
            }
        },
    }
    descriptor, name = tempfile.mkstemp(prefix="agentgym-vllm-logging-", suffix=".json")
    with os.fdopen(descriptor, "w") as file:
        json.dump(config, file)
    undo.callback(os.unlink, name)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = name
    undo.callback(os.environ.pop, "VLLM_LOGGING_CONFIG_PATH", None)
    undo.callback(_close_file_handlers, path)


def _close_file_handlers(path: Path) -> None:
    """Take off and close the handlers that vLLM's config opened on ``path``."""
    for logger in _loggers():
        for handler in list(logger.handlers):
            if isinstance(handler, logging.FileHandler) and handler.baseFilename == str(path):
                logger.removeHandler(handler)
                handler.close()


def _route_root(path: Path, ours: _Names, console_level: int, undo: ExitStack) -> logging.Handler:
    """Filter the root's handlers down to our records and add the file's handler."""
    root = logging.getLogger()
    console = _ConsoleOnly(ours, console_level)
    for existing in root.handlers:
        existing.addFilter(console)
        undo.callback(existing.removeFilter, console)
    if not root.handlers:
        # logging's last resort (warnings and up, to stderr) only acts while the
        # root has no handler: a stand-in keeps our warnings on the console.
        stand_in = logging.StreamHandler(sys.stderr)
        stand_in.setLevel(logging.WARNING)
        stand_in.addFilter(console)
        root.addHandler(stand_in)
        undo.callback(root.removeHandler, stand_in)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(_LibrariesOnly(ours))
    root.addHandler(handler)
    undo.callback(handler.close)
    undo.callback(root.removeHandler, handler)
    return handler


def _loggers() -> list[logging.Logger]:
    items = list(logging.Logger.manager.loggerDict.values())
    return [logger for logger in items if isinstance(logger, logging.Logger)]


def _take_console_handlers(ours: _Names, undo: ExitStack) -> None:
    """Take the stream handlers (not those of files) off the libraries' loggers;
    their records then propagate to the root, where :func:`_route_root` sends
    them to the file.

    Any stream counts as the console, not only ``sys.stderr`` as it is now: a
    library may have kept the stream that was ``sys.stderr`` when it was imported.
    """
    for logger in _loggers():
        if ours(logger.name):
            continue
        taken = [
            handler
            for handler in logger.handlers
            if isinstance(handler, logging.StreamHandler)
            and not isinstance(handler, logging.FileHandler)
            and handler.stream is not None  # torch's trace handler opens a file lazily
        ]
        if taken:
            undo.callback(_put_back, logger, list(logger.handlers))
        for handler in taken:
            logger.removeHandler(handler)
        if taken and not logger.propagate:
            logger.propagate = True
            undo.callback(setattr, logger, "propagate", False)


def _put_back(logger: logging.Logger, handlers: list[logging.Handler]) -> None:
    """Give ``logger`` its ``handlers`` again, in their order, keeping any added since."""
    added = [handler for handler in logger.handlers if handler not in handlers]
    logger.handlers = [*handlers, *added]


def library_of(filename: str) -> str | None:
    """The installed package a source file belongs to (``torch`` for
    ``.../site-packages/torch/nn/modules/module.py``), ``python`` for the
    standard library, None for anything else (our code, a script)."""
    parts = Path(filename).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            index = len(parts) - 1 - parts[::-1].index(marker)
            if index + 1 < len(parts):
                return parts[index + 1].removesuffix(".py")
    if filename.startswith(("<frozen ", sysconfig.get_paths()["stdlib"])):
        return "python"
    return None


def _route_warnings(handler: logging.Handler, ours: _Names, undo: ExitStack) -> None:
    """Write the libraries' ``warnings.warn`` to the file, under the library's name."""
    show = warnings.showwarning

    def route(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        library = library_of(filename)
        if library is None or ours(library):
            show(message, category, filename, lineno, file, line)
            return
        text = f"{category.__name__}: {message}"
        record = logging.LogRecord(library, logging.WARNING, filename, lineno, text, None, None)
        handler.handle(record)

    warnings.showwarning = route
    undo.callback(setattr, warnings, "showwarning", show)


@contextmanager
def redirect_output(log_file: str | Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to
    ``log_file`` while the block runs.

    For starting an engine in a child process: what the child writes itself
    (vLLM's spawned engine core: its torch and C++ warnings, its progress
    bars) goes where its descriptors pointed when it started, so it keeps
    writing to ``log_file`` after the block; the parent's console is back at once.

    Args:
        log_file: The file to append to (such as :func:`library_logs`' one).
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with Path(log_file).open("ab") as file:
            os.dup2(file.fileno(), 1)
            os.dup2(file.fileno(), 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        for descriptor, copy in enumerate(saved, start=1):
            os.dup2(copy, descriptor)
            os.close(copy)
