"""What a person reads on the console during a run: our lines, and nobody else's.

Our lines: :func:`format_line` turns one logged step into a line with the
figures that matter (``step 12/60 | success 41.2% | score 3.20 | ... | ETA 4m10s``)
or a validation line per env tag; :class:`StepTimer` gives the ETA.

Everyone else's lines (what the engine and the libraries log) go to a file for the
duration of a run: :mod:`agentgym.library_logging`.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tqdm import tqdm  # type: ignore[import-untyped]


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
    """The console line of one logged record: :func:`format_validation`'s for a
    validation record, else the training step's.

    Args:
        metrics: Flat scalar metrics of the record.
        step: The training step.
        total_steps: The run's last step, for ``12/60``; None leaves it out.
        seconds_left: The ETA (a step line's); None leaves it out.

    Returns:
        A step line like ``step 12/60 | success 41.0% | score 3.20 | loss -0.012 |
        grad 0.5 | 2.8 s/step | ETA 2m14s``: the :data:`STEP_FIGURES` that are
        present, then time.
    """
    if is_validation(metrics):
        return format_validation(metrics, step, total_steps)
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


_ANNOUNCED: list[str] = []
"""This process's :func:`announce` lines, in order (one process is one run)."""


def announce(text: str) -> None:
    """Print ``text``, a line about what this run is (a ROLL or Trinity file's
    translation notes, the table of what was fitted to this machine, the planner's
    choice), and keep it for the run folder, which does not exist yet when the config
    is checked: :func:`~agentgym.builders.run_folder.open_run_folder` writes the kept
    lines into ``train.log`` and ``meta.json``."""
    _ANNOUNCED.append(text)
    echo(text)


def announced() -> list[str]:
    """The lines :func:`announce` printed so far in this process."""
    return list(_ANNOUNCED)
