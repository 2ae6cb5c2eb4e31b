"""Everyone else's lines: what the engine and the libraries log, kept off the console.

:func:`library_logs` sends what the engine and the libraries log (vLLM's INFO lines,
torch and transformers warnings, ``warnings.warn`` from installed packages) to a log
file for the duration of a run, and
:class:`~agentgym.log_summary.LibraryLogSummary` reads that file back as a few lines:
counts by level and the messages that repeat. :func:`redirect_output` sends a child
engine's own output to the same file. Our lines: :mod:`agentgym.console`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import sysconfig
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TextIO

from agentgym.errors import ConfigError
from agentgym.log_summary import LibraryLogSummary

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

    Everything is put back on exit. On an exception (a config error apart),
    :meth:`LibraryLogSummary.summary` is printed to stderr, since the cause may be in
    the file.

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
        except ConfigError:  # the key and what to do: the library records are not its cause
            raise
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
