"""The GRPO recipe: the config and one function, :func:`train`, that reads top to bottom.

rollout → advantages → ``ppo_epochs`` of mini-batch updates → weight sync →
metrics → validation every ``eval_steps`` (with renders) → checkpoint every
``save_steps``. The recipe sees only protocols (:class:`Strategy`,
:class:`~agentgym.rollout.source.RolloutSource`, :class:`GenerationBackend`,
:class:`Tracker`); the build floor (:mod:`agentgym.builders`) makes them from the config. The
pieces live in modules named for what they hold: :mod:`~agentgym.trainers.batch_prep`
(trajectories → the batch with advantages), :mod:`~agentgym.trainers.updates` and
:mod:`~agentgym.trainers.objectives` (the policy's and critic's updates and losses),
:mod:`~agentgym.trainers.run_state` (checkpoints), :mod:`~agentgym.trainers.lifecycle`
(closing every part).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.cluster import Cluster
from agentgym.rollout.evaluation import evaluate
from agentgym.rollout.render import dump_trajectories, pick_renders, render_trajectories
from agentgym.rollout.source import Rollout, RolloutSource
from agentgym.trainers.batch_prep import check_failures, prepare_batch
from agentgym.trainers.checkpoint import latest_checkpoint
from agentgym.trainers.kl_control import KLController
from agentgym.trainers.lifecycle import frames_of, phase_of, shut_down
from agentgym.trainers.recipe_config import GRPOConfig
from agentgym.trainers.rewards import RunningMoments
from agentgym.trainers.run_state import checkpoint, restore
from agentgym.trainers.strategies import Critic, Strategy
from agentgym.trainers.tracking import Tracker
from agentgym.trainers.updates import update_critic, update_policy


class TrainingInterruptedError(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped the run; carries where it stopped: the step, the
    phase (:data:`~agentgym.trainers.lifecycle.PHASES`) and the last checkpoint."""

    def __init__(self, step: int, checkpoint: Path | None, phase: str = "training") -> None:
        super().__init__(step, checkpoint, phase)
        self.step = step
        self.checkpoint = checkpoint
        self.phase = phase


@dataclass
class TrainParts:
    """Everything the recipe runs on, built by :func:`agentgym.builders.train.build_train`."""

    strategy: Strategy
    source: RolloutSource
    """Each step's batch: played now, ahead of training, or from a decoupled job's buffer."""
    train: Rollout | None
    """What :attr:`source` plays with (None: ``mode: train``, whose explorers play)."""
    val: Rollout | None
    """The validation episodes (None: this mode evaluates nothing)."""
    tracker: Tracker
    checkpoint_dir: Path
    render_dir: Path | None
    dump_dir: Path | None
    meta: dict[str, Any]
    pad_token_id: int
    cluster: Cluster | None = None
    critic: Critic | None = None
    """GAE's value model (``adv_estimator: gae``)."""
    kl_controller: KLController | None = None
    """The beta of ``add_token_level_kl``."""
    reward_moments: RunningMoments | None = None
    """Running reward statistics (``use_reward_scaling``, ``reward_norm: running``)."""


def train(config: GRPOConfig, parts: TrainParts, *, resume: bool | str = False) -> None:
    """Run GRPO from step 1 (or after the checkpoint ``resume`` names) to ``max_steps``.

    With ``async_generation_ratio`` k > 0 the rollout of the next steps runs while
    a step trains (:class:`~agentgym.rollout.source.AheadSource`, docs/async.md);
    k = 0 plays each step's batch when the step asks for it.

    Raises:
        RolloutFailedError: When too many of a step's episodes fail.
        TrainingInterruptedError: On Ctrl-C (or SIGTERM, :mod:`agentgym.stopping`), with
            the step, the phase and the last checkpoint.
        ShutdownError: When a part did not close at the end of the run.
        WeightSyncTimeoutError: When a weight sync hangs past ``rpc_timeout``.
    """
    schedule = config.schedule
    loop = asyncio.new_event_loop()
    source = parts.source
    step = 0
    try:
        if resume:
            step = restore(parts, resume)
            send_resumed_weights(config, parts, loop)  # the engines sample the checkpoint's
        loop.call_soon(source.start, step)
        if step == 0 and schedule.eval_steps and schedule.eval_on_startup:
            evaluate_step(config, parts, loop, step=0)
        while step < schedule.max_steps:
            step += 1
            started = time.perf_counter()
            parts.strategy.set_training(False)
            rollout = loop.run_until_complete(source.next_batch(step))
            metrics = rollout.metrics
            metrics["train/failed"] = check_failures(config, rollout.trajectories, step)
            metrics["time/rollout"] = time.perf_counter() - started
            if parts.dump_dir is not None:
                dump_trajectories(
                    rollout.trajectories, parts.dump_dir, name=f"step_{step}", meta=parts.meta
                )

            prepare = source.run_work(prepare_batch, config, parts, rollout.trajectories, metrics)
            batch = loop.run_until_complete(prepare)
            trained = time.perf_counter()
            if batch is None:  # no sample carried a signal: same weights, the next version
                source.skip_update()
            else:
                if parts.critic is not None:  # GAE's value model learns from the same batch
                    critic = source.run_work(update_critic, config, parts.critic, batch, step)
                    metrics |= loop.run_until_complete(critic)
                update = source.run_work(update_policy, config, parts.strategy, batch, step)
                metrics |= loop.run_until_complete(update)
                metrics |= push_weights(config, parts, loop, source)
            metrics["time/train"] = time.perf_counter() - trained

            metrics["time/step"] = time.perf_counter() - started
            if step % schedule.logging_steps == 0 or step == schedule.max_steps:
                parts.tracker.log(metrics, step)
            if schedule.eval_steps and (
                step % schedule.eval_steps == 0 or step == schedule.max_steps
            ):
                evaluate_step(config, parts, loop, step=step)
            if step % schedule.save_steps == 0 or step == schedule.max_steps:
                checkpoint(parts, step)
                source.checkpointed(step)
    except KeyboardInterrupt as interrupt:
        phase = phase_of(frames_of(interrupt.__traceback__)) or "training"
        shut_down(parts, loop, source, unwinding=True)
        raise TrainingInterruptedError(
            step, latest_checkpoint(parts.checkpoint_dir), phase
        ) from None
    except BaseException:
        shut_down(parts, loop, source, unwinding=True)
        raise
    shut_down(parts, loop, source)


def push_weights(
    config: GRPOConfig, parts: TrainParts, loop: asyncio.AbstractEventLoop, source: RolloutSource
) -> dict[str, float]:
    """The strategy's weights to the engines through the source (which pauses its
    generation around the transfer), bounded by ``rpc_timeout``; its ``time/weight_sync*``
    metrics."""
    update = source.update_weights(
        parts.strategy.export_weights, timeout=config.schedule.rpc_timeout
    )
    return loop.run_until_complete(update)


def send_resumed_weights(
    config: GRPOConfig, parts: TrainParts, loop: asyncio.AbstractEventLoop
) -> float:
    """The restored checkpoint's weights to the engines before any episode starts,
    bounded by ``rpc_timeout``; the seconds it took.

    Raises:
        WeightSyncTimeoutError: Naming the backend, when it takes longer than ``rpc_timeout``.
    """
    update = parts.source.send_weights(
        parts.strategy.export_weights, timeout=config.schedule.rpc_timeout
    )
    return loop.run_until_complete(update)


def evaluate_step(
    config: GRPOConfig, parts: TrainParts, loop: asyncio.AbstractEventLoop, *, step: int
) -> None:
    """Play the validation episodes (fixed seeds), log ``val/*`` and render some of each tag.

    The training episodes' generation is paused meanwhile (ahead of training, the
    requests in flight finish first) and resumed after, even when validation fails;
    ``val/policy_version`` is the version validated.
    """
    if parts.val is None:
        return
    val, source = parts.val, parts.source
    parts.strategy.set_training(False)
    played = loop.run_until_complete(source.paused(lambda: evaluate(val, version=step)))
    check_failures(config, played.result.trajectories, step)
    metrics = played.metrics
    metrics["val/policy_version"] = float(source.version)
    parts.tracker.log(metrics, step)
    if parts.render_dir is not None and config.schedule.val_renders:
        picked = pick_renders(played.result.trajectories, config.schedule.val_renders)
        render_trajectories(picked, parts.render_dir, step, played=played.result.trajectories)
