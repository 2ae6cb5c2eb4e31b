"""``mode: bench`` (Trinity-RFT's): evaluate a finished run's checkpoints.

``python -m agentgym.train mode=bench output_dir=<the run's output_dir>`` plays
the run's validation episodes with its base model (step 0, unless
``validation.on_startup=false``) and with every
complete checkpoint under ``<output_dir>/checkpoints`` (or, with
``explorer.bench_on_latest_checkpoint=true``, only the newest), each exactly as
``python -m agentgym.eval model.path=<that checkpoint>`` would: the same
settings read from the checkpoint's saved ``train_config.yaml``, the same fixed
seeds and sampling (:func:`agentgym.eval.evaluate_policy`). It logs ``bench/<tag>/<metric>``
at each checkpoint's step into the run's metrics, and writes a table
(``bench/bench.md``, ``bench/bench.json``) and a plot (``bench/bench.png``) in
the run's folder. See docs/bench.md.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from agentgym.builders.model import model_path
from agentgym.console import echo
from agentgym.errors import ConfigError
from agentgym.eval import evaluate_policy, print_report, resolve_model
from agentgym.fileio import write_atomic, write_json_atomic
from agentgym.plot import plot_curves
from agentgym.rollout.metrics import failure_report
from agentgym.schema import TrainConfig, validate
from agentgym.trainers.checkpoint import CHECKPOINT_PREFIX, is_complete, latest_checkpoint
from agentgym.trainers.run_state import RUN_CONFIG
from agentgym.trainers.tracking import METRICS_FILE, make_tracker

BENCH_DIR = "bench"
"""The folder of the run's ``output_dir`` where bench writes its table, plot and log."""

COLUMNS = ("success", "score", "turns", "invalid_action_rate", "truncation_rate")
"""The ``all/*`` figures in the table, besides the step, the model and the episodes."""

PASSED_ON = {
    "val_batch_size": "episodes",
    "validation.temperature": "generation.temperature",
    "generation.top_p": "generation.top_p",
    "generation.top_k": "generation.top_k",
    "generation.max_new_tokens": "generation.max_new_tokens",
}
"""Keys of the bench command line that change how it plays, and eval's key for each;
without them bench plays as the run validated."""

BENCH_KEYS = (
    "mode",
    "output_dir",
    "logging_dir",
    "explorer.bench_on_latest_checkpoint",
    "validation.on_startup",
    "generation",
    "generation.backend",
    "generation.max_batch_size",
    "generation.max_model_len",
    "generation.base_url",
    "generation.served_model_name",
    "generation.per_request_seed",
    "model.dtype",
    "model.device",
    "tracker",
    "track_with",
    "tracker_kwargs",
    "system_envs",
    "val_env_manager.env_groups",  # set with val_batch_size, as the config check asks
)
"""Keys bench reads itself (where the run is, the engine, where metrics go)."""

_CHECKPOINT_NAME = re.compile(re.escape(CHECKPOINT_PREFIX) + r"(\d+)")


@dataclass(frozen=True)
class Candidate:
    """One model to bench.

    Attributes:
        step: The checkpoint's training step; 0 for the base model.
        name: ``base`` or the checkpoint folder's name.
        model: The Hugging Face model folder.
        run_config: The run's saved config that it plays by.
    """

    step: int
    name: str
    model: Path
    run_config: dict[str, Any]


@dataclass(frozen=True)
class BenchRow:
    """One row of the bench table.

    Attributes:
        step: The checkpoint's training step; 0 for the base model.
        name: ``base`` or the checkpoint folder's name.
        model: The model folder played.
        metrics: Eval's metrics (``all/success``, ``<tag>/score``, ...).
    """

    step: int
    name: str
    model: str
    metrics: dict[str, float]


def checkpoints(root: Path) -> tuple[list[tuple[int, Path]], list[Path]]:
    """The complete ``checkpoint-N`` folders in ``root`` by step, and the incomplete ones
    (no ``COMPLETE`` marker: a save that never finished). Hidden temporary folders of
    an interrupted save are neither."""
    complete, incomplete = [], []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        match = _CHECKPOINT_NAME.fullmatch(path.name)
        if match and path.is_dir():
            if is_complete(path):
                complete.append((int(match.group(1)), path))
            else:
                incomplete.append(path)
    return sorted(complete), incomplete


def candidates(
    output_dir: Path, *, latest_only: bool, base: bool = True
) -> tuple[list[Candidate], list[Path]]:
    """The models to bench (base first, then the checkpoints by step) and the incomplete
    checkpoint folders skipped.

    Args:
        output_dir: The run's ``output_dir`` (for a decoupled job, the trainer's).
        latest_only: Only the newest complete checkpoint (what ``latest`` names when it
            names a complete one), as ``agentgym.eval model.path=<output_dir>`` plays.
        base: Bench the base model too (``validation.on_startup``, Trinity's
            ``eval_on_startup``), unless ``latest_only``.

    Raises:
        ConfigError: When ``output_dir`` holds no complete checkpoint.
    """
    root = output_dir / "checkpoints"
    complete, incomplete = checkpoints(root)
    if not complete:
        found = f" ({len(incomplete)} incomplete: their saves never finished)" if incomplete else ""
        raise ConfigError(
            f"mode=bench: no complete checkpoint in {root}{found}; pass "
            "output_dir=<a finished run's output_dir> (for a decoupled job the trainer's: "
            "the explorer's holds no checkpoints)"
        )
    if latest_only:
        latest = latest_checkpoint(root)
        complete = [(step, path) for step, path in complete if path == latest]
    chosen = []
    for step, path in complete:
        model, run_config = resolve_model(str(path))
        if run_config is None:
            raise ConfigError(f"mode=bench: {path} has no {RUN_CONFIG}; is it one of our runs?")
        chosen.append(Candidate(step, path.name, model, run_config))
    if base and not latest_only:
        run_file = output_dir / RUN_CONFIG
        run_config = (
            yaml.safe_load(run_file.read_text()) if run_file.is_file() else chosen[0].run_config
        )
        chosen.insert(0, Candidate(0, "base", model_path(validate(run_config)), run_config))
    return chosen, incomplete


def eval_settings(config: TrainConfig, model: Path) -> DictConfig:
    """Eval's config (``configs/eval.yaml``'s keys) for one model: no renders, no dumps,
    the bench command line's engine, and the values that :data:`PASSED_ON` passes on;
    the other keys are eval's "take the run's"."""
    return OmegaConf.create(
        {
            "agent": "model",
            "episodes": config.val_batch_size,
            **dict.fromkeys(
                ("seed", "rollout_mode", "history_length", "max_turns", "sequence_length")
            ),
            "prefix_check": None,
            "render_save_dir": None,
            "renders": 0,
            "rollout_dump_dir": None,
            "model": {
                "path": str(model),
                "dtype": config.model.dtype,
                "device": config.model.device,
            },
            "generation": {
                **config.generation.model_dump(),
                "temperature": config.validation.temperature,
            },
        }
    )


def eval_given(given: Iterable[str]) -> tuple[set[str], list[str]]:
    """The bench command line's keys as eval's given keys, and the keys bench does not use."""
    passed = {PASSED_ON[key] for key in given if key in PASSED_ON}
    unused = sorted(set(given) - set(PASSED_ON) - set(BENCH_KEYS))
    return passed, unused


def write_table(rows: list[BenchRow], folder: Path) -> tuple[Path, Path]:
    """Write ``bench.md`` (one row per model: step, model, episodes, :data:`COLUMNS`)
    and ``bench.json`` (every metric of each row) into ``folder``."""
    header = ["step", "model", "episodes", *COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        figures = [f"{row.metrics.get(f'all/{key}', float('nan')):.4g}" for key in COLUMNS]
        episodes = f"{row.metrics.get('all/trajectories', 0):.0f}"
        lines.append("| " + " | ".join([str(row.step), row.name, episodes, *figures]) + " |")
    table, data = folder / "bench.md", folder / "bench.json"
    write_atomic(table, "\n".join(lines) + "\n")
    write_json_atomic(data, [row.__dict__ for row in rows])
    return table, data


def bench_checkpoints(config: TrainConfig, given: Iterable[str] = ()) -> list[BenchRow]:
    """Bench the run in ``config.output_dir``: play each :func:`candidates` model as
    ``agentgym.eval`` would, log ``bench/*`` by step, write the table and the plot.

    Args:
        config: The bench command's checked config (``mode=bench``).
        given: The keys set on the bench command line.

    Returns:
        One row per model, base first, in order of step.

    Raises:
        ConfigError: When the run has no complete checkpoint.
    """
    output_dir = Path(config.output_dir).expanduser()
    folder = output_dir / BENCH_DIR
    log = folder / "bench.log"
    chosen, incomplete = candidates(
        output_dir,
        latest_only=config.explorer.bench_on_latest_checkpoint,
        base=config.validation.on_startup,
    )
    folder.mkdir(parents=True, exist_ok=True)
    for path in incomplete:
        echo(f"skipping {path}: no COMPLETE marker (its save never finished)", log)
    passed, unused = eval_given(given)
    if unused:
        echo(f"bench plays as the run validated; not used: {', '.join(unused)}", log)
    echo(f"benching {', '.join(c.name for c in chosen)} of {output_dir}", log)
    # the run's tracker id: its metrics file is appended to, never started anew
    newest = latest_checkpoint(output_dir / "checkpoints")
    state_file = newest / "trainer_state.json" if newest else None
    state = json.loads(state_file.read_text()) if state_file and state_file.is_file() else {}
    rows = []
    with make_tracker(
        ["stdout", *(kind for kind in config.track_with if kind != "stdout")],
        logging_dir=config.logging_dir,
        exp_name=config.exp_name,
        tracker_kwargs=config.tracker_kwargs,
        run_id=state.get("tracker_run_id") or uuid.uuid4().hex[:16],
        console_log=log,
    ) as tracker:
        for candidate in chosen:
            echo(f"step {candidate.step}: {candidate.name} ({candidate.model})", log)
            played = evaluate_policy(
                eval_settings(config, candidate.model),
                candidate.model,
                candidate.run_config,
                passed,
            )
            print_report(played.result, played.policy)
            failures = failure_report(played.result.trajectories)
            if failures.failed == len(played.result.trajectories):
                echo(f"{candidate.name}: every episode failed; {failures.messages[0]}", log)
            metrics = played.result.metrics
            tracker.log({f"bench/{key}": value for key, value in metrics.items()}, candidate.step)
            rows.append(BenchRow(candidate.step, candidate.name, str(candidate.model), metrics))
    table, data = write_table(rows, folder)
    curves = {
        title: [(row.step, row.metrics[key]) for row in rows if key in row.metrics]
        for title, key in (("success", "all/success"), ("mean score", "all/score"))
    }
    plot = plot_curves(curves, folder / "bench.png", x_label="checkpoint step")
    echo(table.read_text().rstrip(), log)
    echo(f"table: {table}\ndata: {data}\nplot: {plot}", log)
    return rows


def run_bench(config: TrainConfig, given: Iterable[str], started: float) -> None:
    """``mode: bench`` from ``python -m agentgym.train``: :func:`bench_checkpoints`, and
    where things are."""
    rows = bench_checkpoints(config, given)
    log = Path(config.output_dir).expanduser() / BENCH_DIR / "bench.log"
    echo(f"benched {len(rows)} models in {time.perf_counter() - started:.0f} s", log)
    echo(f"metrics: {Path(config.logging_dir) / METRICS_FILE} (bench/*)", log)
