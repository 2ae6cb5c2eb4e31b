"""Each mode's run once its config is checked: ``both`` and ``train`` (the recipe),
``explore`` (a decoupled job's explorer), ``bench`` (a finished run's checkpoints):
the parts built (:mod:`agentgym.builders`), the run, its closing summary.

Ctrl-C or SIGTERM, in any phase, ends a run with one line on stderr (where it
stopped, how to go on: :mod:`agentgym.stopping`) and exit code 130 or 143.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from agentgym import stopping
from agentgym.bench import run_bench
from agentgym.builders.cluster import apply_system_envs
from agentgym.builders.explore import build_explorer, build_server
from agentgym.builders.train import build_train
from agentgym.console import echo
from agentgym.errors import ConfigError
from agentgym.eval import given_keys
from agentgym.job.explorer import WeightsTimeoutError, explore
from agentgym.library_logging import LIBRARY_LOG_FILE, library_logs
from agentgym.plot import plot_validation, read_metrics
from agentgym.proxy.serve import serve
from agentgym.schema import TrainConfig
from agentgym.trainers.batch_prep import RolloutFailedError
from agentgym.trainers.checkpoint import latest_checkpoint
from agentgym.trainers.grpo import train
from agentgym.trainers.run_state import find_checkpoint
from agentgym.trainers.tracking import CONSOLE_LOG_FILE, METRICS_FILE


def run_mode(config: TrainConfig, resolved: dict[str, Any], started: float) -> None:
    """Run ``config.mode``; a run that too many failed episodes stopped exits 1 with
    one line naming why."""
    apply_system_envs(config)
    try:
        if config.mode in ("explore", "serve"):
            run_explorer(config, resolved, started)
        elif config.mode == "bench":  # evaluate a finished run's checkpoints (docs/bench.md)
            run_bench(config, given_keys(), started)
        else:
            run_training(config, resolved, started)
    except RolloutFailedError as error:
        print(f"run stopped: {error}", file=sys.stderr)
        sys.exit(1)


def resume_state(config: TrainConfig) -> tuple[bool | str, dict[str, Any] | None]:
    """What a resume loads: ``resume_from_checkpoint`` as :func:`train` takes it
    (``auto`` made ``true`` when there is a checkpoint, ``false`` when not: verl's
    ``resume_mode: auto``, Trinity-RFT's ``continue_from_checkpoint``) and the trainer
    state of the checkpoint it loads (None when not resuming).

    Raises:
        ConfigError: When ``resume_from_checkpoint`` is true or a path and there is no
            complete checkpoint there, saying what to pass.
    """
    resume = config.resume_from_checkpoint
    if resume == "auto":
        latest = latest_checkpoint(config.checkpoint_dir)
        if latest is None or not (latest / "trainer_state.json").is_file():
            echo(f"resume_from_checkpoint=auto: no checkpoint in {config.checkpoint_dir}; "
                 "starting afresh")  # fmt: skip
            return False, None
        resume = True
    if resume is False:
        return False, None
    try:
        return resume, find_checkpoint(config.checkpoint_dir, resume)[1]
    except FileNotFoundError as error:
        raise ConfigError(str(error)) from None


def run_training(config: TrainConfig, resolved: dict[str, Any], started: float) -> None:
    """``mode: both | train``: build the parts, train, and print the end-of-run summary."""
    resume, state = resume_state(config)
    output_dir = Path(config.output_dir)
    stopping.describe(
        stopping.Run(
            output_dir=str(config.output_dir),
            arguments=tuple(sys.argv[1:]),
            start_step=int(state["step"]) if state else 0,
            console_log=output_dir / CONSOLE_LOG_FILE,
        )
    )
    try:
        with library_logs(output_dir / LIBRARY_LOG_FILE) as library:
            grpo, parts = build_train(
                config,
                resolved,
                resume_run_id=state.get("tracker_run_id") if state else None,
                resume_step=int(state["step"]) if state else None,
            )
            train(grpo, parts, resume=resume)
    except KeyboardInterrupt as interrupt:  # TrainingInterruptedError, or before train()
        sys.exit(stopping.report(interrupt))
    log = output_dir / CONSOLE_LOG_FILE
    metrics_file = Path(config.logging_dir) / METRICS_FILE
    success = read_metrics(metrics_file, ["val/all/success"])["val/all/success"]
    if success:
        (first_step, first), (last_step, last) = success[0], success[-1]
        echo(
            f"validation success: {first:.3f} at step {first_step:g} -> "
            f"{last:.3f} at step {last_step:g} ({(last - first) * 100:+.1f} points)",
            log,
        )
    echo(f"finished in {time.perf_counter() - started:.0f} s; output: {output_dir}", log)
    echo(f"metrics: {metrics_file}", log)
    plot = plot_validation(metrics_file, output_dir / "validation.png")
    if plot is not None:
        echo(f"plot: {plot}", log)
    echo(f"checkpoints: {parts.checkpoint_dir}", log)
    if parts.render_dir is not None:
        echo(f"renders: {parts.render_dir / 'index.html'}", log)
    echo(library.summary(), log)


def run_explorer(config: TrainConfig, resolved: dict[str, Any], started: float) -> None:
    """``mode: explore | serve``: build the envs (or the server) and the engines, and
    explore (or serve agents) until the trainer finishes."""
    output_dir = Path(config.output_dir)
    log = output_dir / CONSOLE_LOG_FILE
    stopping.describe(
        stopping.Run(
            output_dir=str(output_dir),
            arguments=tuple(sys.argv[1:]),
            start_step=0,
            console_log=log,
        )
    )
    try:
        with library_logs(output_dir / LIBRARY_LOG_FILE) as library:
            if config.mode == "serve":
                done = f"{serve(build_server(config, resolved))} groups served"
            else:
                done = f"{explore(build_explorer(config, resolved))} batches"
    except KeyboardInterrupt as interrupt:
        sys.exit(stopping.report(interrupt))
    except WeightsTimeoutError as error:  # the trainer is gone: one line, naming it
        echo(f"explorer stopped: {error}", log, sys.stderr)
        sys.exit(1)
    echo(
        f"explorer {config.explorer.name}: {done} in "
        f"{time.perf_counter() - started:.0f} s; output: {output_dir}",
        log,
    )
    echo(f"metrics: {Path(config.logging_dir) / METRICS_FILE}", log)
    echo(library.summary(), log)
