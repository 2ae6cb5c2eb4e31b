"""Separate explorer and trainer processes (``mode: explore`` + ``mode: train``) against
``mode: both`` at the same staleness bound, k = 1: the real recipe and trainer (the tiny
model) against the long-tailed simulated backend of ``test_async_benchmark.py`` (its
``LongTailBackend`` and ``SMALL`` settings, imported).

Three runs of ``STEPS`` steps, in one session:

* ``sync``: ``mode: both``, ``async_generation_ratio=0``; its ``time/rollout`` and
  ``time/train`` give the ideal pipeline bound ``max(rollout, train)`` per step.
* ``both``: ``mode: both``, ``async_generation_ratio=1``, in this process.
* ``decoupled``: the explorer in a spawned process (``build_explorer``, its backend
  replaced by ``LongTailBackend`` before ``explore``), the trainer here (``build_train``
  + ``train``, ``mode=train``), one job folder, SQLite buffer, weights by checkpoint,
  ``synchronizer.sync_offset=1``: the bound is ``sync_interval + sync_offset - 1 = 1``
  (Trinity-RFT's one step off-policy).

Figures: the trainer's mean step time over the steps after the first (the first fills
the pipeline, and in the decoupled run waits for the explorer to start). With separate
processes the trainer's ``time/step`` includes its wait for groups,
``time/trainer_wait``; both are reported.

Torch runs on ``TORCH_THREADS`` (1) thread in every run and process. With its default (one
per core) on a shared, loaded 2-core machine, the update in the main thread (``sync``,
and the decoupled trainer) took 15-20 s a step, the same update in the worker thread
that ``async_generation_ratio`` uses 1 s (most likely OpenMP's main-thread team waiting
at its barriers for descheduled threads), so the comparison measured that instead.

Run: ``python -m pytest benchmarks/test_decoupled_benchmark.py --benchmark-only -s``.
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dry import sized
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from test_async_benchmark import (
    BASE_SECONDS,
    SIGMA,
    SMALL,
    STEPS,
    LongTailBackend,
    use_backend,
)

from agentgym.schema import TrainConfig

BOUND = 1
"""The staleness bound of both asynchronous runs, in versions."""
DECOUPLED = ["project=bench", "name=decoupled", f"synchronizer.sync_offset={BOUND}"]
"""``async_generation_ratio`` unset: the bound is what the sync schedule implies."""
EXPLORER_SECONDS = 300.0
"""How long the explorer may take to end after the trainer's last version."""
TORCH_THREADS = 1
KEYS = (
    "time/step", "time/rollout", "time/train", "time/trainer_wait", "actor/grad_norm",
    "async/staleness_mean", "async/staleness_max",
)  # fmt: skip
RESULTS: dict[str, dict[str, float]] = {}


def checked(overrides: list[str]) -> tuple[TrainConfig, dict[str, Any]]:
    """The checked config and its plain data, composed as ``agentgym.train`` does."""
    from agentgym.schema import validate

    with initialize_config_module("agentgym.configs", version_base=None):
        raw: Any = OmegaConf.to_container(compose("config", overrides=overrides), resolve=True)
    return validate(raw), raw


def long_tail(tokenizer: Any) -> LongTailBackend:
    response = [*tokenizer.encode("<answer>Up</answer>"), tokenizer.eos_token_id]
    return LongTailBackend(response, BASE_SECONDS, SIGMA, seed=0)


def means(logs: Path, keys: tuple[str, ...], key: str = "time/step") -> dict[str, float]:
    """The mean of each of ``keys`` over the logged rows that hold ``key``, after the first."""
    rows = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if key in row and row["step"] > 1]
    return {
        name: statistics.mean(row[name] for row in steps)
        for name in keys
        if all(name in row for row in steps)
    }


def run_both(ratio: int, output: Path, cache: Path) -> dict[str, float]:
    """``mode: both`` in this process at ``async_generation_ratio=ratio``."""
    from agentgym.builders.train import build_train
    from agentgym.trainers.grpo import train

    config, raw = checked(
        [*SMALL, f"model.cache_dir={cache}", f"output_dir={output}",
         f"async_generation_ratio={ratio}"]
    )  # fmt: skip
    grpo, parts = build_train(config, raw)
    assert parts.train is not None
    use_backend(parts, long_tail(parts.train.chat.tokenizer))
    train(grpo, parts)
    return means(output / "logs", KEYS)


def explore_long_tail(overrides: list[str]) -> None:
    """The explorer's process: ``mode: explore`` with its engine replaced by the
    simulated backend."""
    import torch

    from agentgym.builders.explore import build_explorer
    from agentgym.job.explorer import explore

    torch.set_num_threads(TORCH_THREADS)
    config, raw = checked(overrides)
    parts = build_explorer(config, raw)
    use_backend(parts, long_tail(parts.train.chat.tokenizer))
    explore(parts)


def run_decoupled(root: Path, cache: Path) -> dict[str, float]:
    """The explorer in a spawned process, the trainer (``mode: train``) in this one."""
    from agentgym.builders.train import build_train
    from agentgym.trainers.grpo import train

    job = [*SMALL, *DECOUPLED, f"model.cache_dir={cache}", f"checkpoint_root_dir={root / 'jobs'}"]
    explorer = multiprocessing.get_context("spawn").Process(
        target=explore_long_tail,
        args=([*job, "mode=explore", f"output_dir={root / 'explorer'}"],),
        name="explorer",
    )
    explorer.start()
    try:
        config, raw = checked([*job, "mode=train", f"output_dir={root / 'trainer'}"])
        grpo, parts = build_train(config, raw)
        train(grpo, parts)  # its source's close marks the last version: the explorer ends
        explorer.join(EXPLORER_SECONDS)
        assert explorer.exitcode == 0, f"the explorer ended with {explorer.exitcode}"
    finally:
        if explorer.is_alive():
            explorer.kill()
            explorer.join()
    figures = means(root / "trainer" / "logs", KEYS)
    batches = means(root / "explorer" / "logs", ("time/explore_batch",), "time/explore_batch")
    return figures | batches


@pytest.fixture(scope="module", autouse=True)
def torch_threads() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(TORCH_THREADS)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def table(results: dict[str, dict[str, float]]) -> str:
    """The runs side by side, with the bound from the synchronous run."""
    sync = results["sync"]
    bound = max(sync["time/rollout"], sync["time/train"])
    lines = [
        f"pipeline bound max(rollout {sync['time/rollout']:.3f} s, train "
        f"{sync['time/train']:.3f} s) = {bound:.3f} s; mean over steps 2-{STEPS}",
        f"{'run':<10} {'step':>8} {'wait':>8} {'train':>8} {'bound/step':>10} {'vs both':>8} "
        f"{'staleness':>9}",
    ]
    for name, figures in results.items():
        step = figures["time/step"]
        versus = results["both"]["time/step"] / step if "both" in results else float("nan")
        lines.append(
            f"{name:<10} {step:>7.3f}s {figures.get('time/trainer_wait', 0.0):>7.3f}s "
            f"{figures['time/train']:>7.3f}s {bound / step:>10.0%} {versus:>7.2f}x "
            f"{figures.get('async/staleness_mean', 0.0):>9.2f}"
        )
    return "\n".join(lines)


# dry: "both" is test_async_benchmark.py's ratio 1
@pytest.mark.parametrize("run", sized(["sync", "both", "decoupled"], ["sync", "decoupled"]))
def test_decoupled_step_time_against_both_and_the_pipeline_bound(
    benchmark: Any, run: str, tmp_path: Path, cache: Path
) -> None:
    if run == "decoupled":
        figures = benchmark.pedantic(run_decoupled, args=(tmp_path, cache), rounds=1)
    else:
        ratio = 0 if run == "sync" else BOUND
        figures = benchmark.pedantic(run_both, args=(ratio, tmp_path / "run", cache), rounds=1)
    RESULTS[run] = figures
    assert figures["actor/grad_norm"] > 0  # the trainer does real work
    benchmark.extra_info.update({key.replace("/", "_"): value for key, value in figures.items()})
    if "sync" in RESULTS:
        sync = RESULTS["sync"]
        bound = max(sync["time/rollout"], sync["time/train"])
        benchmark.extra_info["pipeline_bound"] = bound
        benchmark.extra_info["bound_fraction"] = bound / figures["time/step"]
    if "both" in RESULTS:
        benchmark.extra_info["both_step_over_step"] = (
            RESULTS["both"]["time/step"] / figures["time/step"]
        )
    print(f"\n{run}: {figures}")
    if "sync" in RESULTS:
        print(table(RESULTS))
