"""agentgym's side of ``limit_bench.py``: its training runs on each engine and in each
mode, each step's ``time/*`` and the last step's trajectories, and the engine's own
generation time measured inside the engine.

- ``both``: one process (the trainer plays its own batches, ``mode: both``).
- ``decoupled``: Trinity-RFT's job, an explorer (``mode: explore``) in a spawned
  process and the trainer (``mode: train``) here, one job folder (SQLite buffer,
  weights by checkpoint), ``synchronizer.sync_offset=1`` (one step off-policy). Its
  step is the trainer's; the explorer's batches, its engine's generation and its
  weight loads are read from the files the explorer process writes. The two processes
  split the cores: torch runs on half of them in each (with all of them in both, the
  trainer's update in the main thread took 5-10 times as long on the loaded 2-core
  machine: OpenMP's threads waiting for each other, as test_decoupled_benchmark.py saw).

The engine's generation: for the HF engine the time of its batches
(``HFBackend._generate_batch``), for vLLM the time during which any request is in flight
(``VLLMBackend.generate``: vLLM batches the requests itself, in its engine process).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from agentgym.trajectory import Trajectory

OVERRIDES = [
    "env=sokoban", "train_env_manager.env_groups=8",
    "train_env_manager.group_size=8", "rollout_batch_size=64", "eval_steps=0",
    "actor_train.training_args.per_device_train_batch_size=16",
    "actor_train.training_args.gradient_accumulation_steps=2", "save_steps=1000",
]  # fmt: skip
"""The step measured (``generation=<engine>`` and ``max_steps`` are added)."""
DRY = [
    "train_env_manager.env_groups=2", "train_env_manager.group_size=2", "rollout_batch_size=4",
    "actor_train.training_args.per_device_train_batch_size=2",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "actor_infer.generating_args.max_new_tokens=16",
]  # fmt: skip
"""``--dry-run``: 4 episodes a step, short responses (what is timed works, not how fast)."""
DECOUPLED = ["project=limit", "name=limit", "synchronizer.sync_offset=1"]
EXPLORER_SECONDS = 300.0
"""How long the explorer may take to end after the trainer's last version."""


@dataclass
class EngineClock:
    """Seconds of the engine's own generation, by step (or explorer batch)."""

    step: int = 0
    seconds: dict[int, float] = field(default_factory=dict)
    active: int = 0
    since: float = 0.0

    def add(self, seconds: float) -> None:
        self.seconds[self.step] = self.seconds.get(self.step, 0.0) + seconds


@contextmanager
def timing_engine(engine: str, clock: EngineClock) -> Iterator[None]:
    """Time the ``engine``'s own generation into ``clock`` while the block runs."""
    if engine == "hf":
        from agentgym.rollout.backends.hf import HFBackend

        batch = HFBackend._generate_batch

        def timed(backend: HFBackend, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return batch(backend, *args, **kwargs)
            finally:
                clock.add(time.perf_counter() - started)

        HFBackend._generate_batch = timed  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            HFBackend._generate_batch = batch  # type: ignore[method-assign]
        return
    from agentgym.rollout.backends.vllm import VLLMBackend

    generate = VLLMBackend.generate

    async def in_flight(backend: VLLMBackend, *args: Any, **kwargs: Any) -> Any:
        if clock.active == 0:
            clock.since = time.perf_counter()
        clock.active += 1
        try:
            return await generate(backend, *args, **kwargs)
        finally:
            clock.active -= 1
            if clock.active == 0:
                clock.add(time.perf_counter() - clock.since)

    VLLMBackend.generate = in_flight  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        VLLMBackend.generate = generate  # type: ignore[method-assign]


@dataclass
class Run:
    """One engine × mode: its checked config, each step's logged metrics (``time/engine``
    added), the last step's trajectories and, decoupled, the explorer's figures."""

    engine: str
    mode: str
    config: Any
    rows: list[dict[str, float]]
    kept: list[Trajectory]
    trained: list[tuple[list[int], list[float]]]
    """The last update's samples, as it trained them: (token ids, loss mask) a row."""
    explorer: dict[str, float] = field(default_factory=dict)


def checked(overrides: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """The checked config and its plain data, composed as ``agentgym.train`` does."""
    from agentgym.schema import validate

    with initialize_config_module("agentgym.configs", version_base=None):
        raw: Any = OmegaConf.to_container(
            compose("config", overrides=list(overrides)), resolve=True
        )
    return validate(raw), raw


def logged(logs: Path, key: str) -> list[dict[str, float]]:
    """The rows of ``logs/metrics.jsonl`` that hold ``key``."""
    rows = [json.loads(line) for line in (logs / "metrics.jsonl").open()]
    return [row for row in rows if key in row]


@dataclass
class Kept:
    """The last step's trajectories, and the samples its update trained."""

    trajectories: list[Trajectory] = field(default_factory=list)
    trained: list[tuple[list[int], list[float]]] = field(default_factory=list)


@contextmanager
def keeping(source: type, kept: Kept, clock: EngineClock) -> Iterator[None]:
    """Keep the last batch ``source.next_batch`` hands the trainer and the samples of
    the last update (the batch after the zero-variance groups are dropped); the step
    the batch is for goes to ``clock`` (the engine's time counts toward the step asking)."""
    import agentgym.trainers.grpo as recipe

    original: Callable[..., Any] = source.next_batch  # type: ignore[attr-defined]
    update = recipe.update_policy

    def updating(config: Any, strategy: Any, batch: Any, step: int) -> Any:
        lengths = batch.attention_mask.sum(1).tolist()  # [B]
        kept.trained[:] = [
            (ids[:n], mask[:n])
            for ids, mask, n in zip(
                batch.input_ids.tolist(), batch.loss_mask.float().tolist(), lengths, strict=True
            )
        ]
        return update(config, strategy, batch, step)

    async def next_batch(self: Any, step: int) -> Any:
        clock.step = step
        rollout = await original(self, step)
        kept.trajectories[:] = rollout.trajectories
        kept.trained.clear()  # a step without an update trains nothing
        return rollout

    source.next_batch = next_batch  # type: ignore[attr-defined]
    recipe.update_policy = updating
    try:
        yield
    finally:
        source.next_batch = original  # type: ignore[attr-defined]
        recipe.update_policy = update


def run_both(engine: str, steps: int, output: Path, extra: Sequence[str] = ()) -> Run:
    """``mode: both`` in this process on ``engine``."""
    from agentgym.builders.train import build_train
    from agentgym.rollout.source import SyncSource
    from agentgym.trainers.grpo import train

    config, raw = checked(
        [*OVERRIDES, *extra, f"generation={engine}", f"max_steps={steps}", f"output_dir={output}"]
    )
    grpo, parts = build_train(config, raw)
    kept = Kept()
    clock = EngineClock()
    with keeping(SyncSource, kept, clock), timing_engine(engine, clock):
        train(grpo, parts)
    rows = logged(output / "logs", "time/step")
    for row in rows:  # the engine's own generation time in each step's rollout
        row["time/engine"] = clock.seconds.get(int(row["step"]), 0.0)
    return Run(engine, "both", config, rows, kept.trajectories, kept.trained)


def explore_timed(engine: str, overrides: list[str], figures: str, threads: int) -> None:
    """The explorer's process: ``mode: explore`` with torch on ``threads`` threads, its
    engine's generation timed per batch and its weight loads timed; both written to
    ``figures`` (JSON) at the end."""
    import torch

    from agentgym.builders.explore import build_explorer
    from agentgym.job.explorer import ExplorerSession, explore

    torch.set_num_threads(threads)
    config, raw = checked(overrides)
    parts = build_explorer(config, raw)
    clock = EngineClock()
    loads: list[float] = []
    play, load = ExplorerSession.play_batch, ExplorerSession.load

    def counted(session: ExplorerSession, *args: Any) -> Any:
        clock.step += 1
        return play(session, *args)

    def timed(session: ExplorerSession, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return load(session, *args)
        finally:
            loads.append(time.perf_counter() - started)

    ExplorerSession.play_batch = counted  # type: ignore[method-assign,assignment]
    ExplorerSession.load = timed  # type: ignore[method-assign,assignment]
    with timing_engine(engine, clock):
        explore(parts)
    Path(figures).write_text(json.dumps({"engine": clock.seconds, "loads": loads}))


def run_decoupled(engine: str, steps: int, root: Path, extra: Sequence[str] = ()) -> Run:
    """An explorer (``mode: explore``) in a spawned process, the trainer (``mode:
    train``) here, on ``engine``."""
    from agentgym.builders.train import build_train
    from agentgym.job.buffer_source import BufferSource
    from agentgym.trainers.grpo import train

    job = [
        *OVERRIDES, *extra, *DECOUPLED, f"generation={engine}", f"max_steps={steps}",
        f"checkpoint_root_dir={root / 'jobs'}",
    ]  # fmt: skip
    import torch

    figures = root / "explorer.json"
    threads = max(1, (os.cpu_count() or 1) // 2)
    explorer = multiprocessing.get_context("spawn").Process(
        target=explore_timed,
        args=(
            engine, [*job, "mode=explore", f"output_dir={root / 'explorer'}"], str(figures),
            threads,
        ),
        name="explorer",
    )  # fmt: skip
    explorer.start()
    kept = Kept()
    everywhere = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        config, raw = checked([*job, "mode=train", f"output_dir={root / 'trainer'}"])
        grpo, parts = build_train(config, raw)
        with keeping(BufferSource, kept, EngineClock()):
            train(grpo, parts)  # its source's close marks the last version: the explorer ends
        explorer.join(EXPLORER_SECONDS)
        if explorer.exitcode != 0:
            raise RuntimeError(f"the explorer ended with {explorer.exitcode}")
    finally:
        torch.set_num_threads(everywhere)
        if explorer.is_alive():
            explorer.kill()
            explorer.join()
    rows = logged(root / "trainer" / "logs", "time/step")
    played = json.loads(figures.read_text())
    batches = logged(root / "explorer" / "logs", "time/explore_batch")
    later = batches[1:] or batches  # the explorer's first batch warms up, as the trainer's
    engine_seconds = {int(k): v for k, v in played["engine"].items()}
    loads = played["loads"][1:] or played["loads"] or [0.0]  # the first: the start's
    explorer_figures = {
        "explore_batch": median(b["time/explore_batch"] for b in later),
        "engine": median(engine_seconds.get(int(b["step"]), 0.0) for b in later),
        "weight_load": median(loads),
        "threads": float(threads),
    }
    return Run(engine, "decoupled", config, rows, kept.trajectories, kept.trained, explorer_figures)


def median(values: Iterator[float] | Sequence[float]) -> float:
    return statistics.median(list(values))
