"""A run's state on disk: a checkpoint of the whole run (model, optimizer, scheduler,
RNG, step, the train envs' seed cursor, the tracker's run id, the critic, the KL
coefficient, the running reward statistics), finding one, and restoring it.
Checkpoints are atomic (:mod:`~agentgym.trainers.checkpoint`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from agentgym.fileio import write_json_atomic
from agentgym.trainers.checkpoint import (
    latest_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)

if TYPE_CHECKING:
    from agentgym.trainers.grpo import TrainParts

RUN_CONFIG = "train_config.yaml"
"""The resolved config a run saves in its output folder and in each checkpoint."""

CRITIC_DIR = "critic"
"""The folder of a checkpoint that holds the critic (GAE's value model and optimizer)."""


def checkpoint(parts: TrainParts, step: int) -> Path:
    """Save model, optimizer, scheduler, RNG, step, seed cursor and tracker run id, atomically;
    with them the critic (under ``critic/``), the KL coefficient and the running reward
    statistics when the run has them.

    The seed cursor is the rollout source's ``state_dict`` (ahead of training, the
    cursor of the first batch not yet trained, so the episodes in flight are
    regenerated on resume; empty for a source that keeps its own state).
    """
    manager_state = parts.source.state_dict(step)

    def write(directory: Path) -> None:
        parts.strategy.save(directory)
        if parts.critic is not None:
            parts.critic.save(directory / CRITIC_DIR)
        torch.save(rng_state(), directory / "rng.pt")
        (directory / RUN_CONFIG).write_text(yaml.safe_dump(parts.meta["config"], sort_keys=False))
        state: dict[str, Any] = {
            "step": step,
            "train_env_manager": manager_state,
            "tracker_run_id": parts.tracker.run_id,
        }
        if parts.kl_controller is not None:
            state["kl_controller"] = parts.kl_controller.state_dict()
        if parts.reward_moments is not None:
            state["reward_moments"] = parts.reward_moments.state_dict()
        write_json_atomic(directory / "trainer_state.json", state)

    return save_checkpoint(parts.checkpoint_dir, step, write)


def find_checkpoint(checkpoint_dir: Path, resume: bool | str) -> tuple[Path, dict[str, Any]]:
    """The checkpoint a resume loads (the latest in ``checkpoint_dir``, or the one
    ``resume`` names) and its trainer state.

    Raises:
        FileNotFoundError: If there is no complete checkpoint there, naming where
            it looked and what to pass instead.
    """
    path = Path(resume) if isinstance(resume, str) else latest_checkpoint(checkpoint_dir)
    if path is None or not (path / "trainer_state.json").is_file():
        raise FileNotFoundError(
            f"resume_from_checkpoint={resume!r}: no complete checkpoint in "
            f"{path or checkpoint_dir}. To continue a run, pass its own folder: "
            "output_dir=<the run's output_dir> resume_from_checkpoint=true (the default "
            "output_dir is a new timestamped folder), or resume_from_checkpoint=<a "
            "checkpoint-N folder>; resume_from_checkpoint=false starts afresh"
        )
    state: dict[str, Any] = json.loads((path / "trainer_state.json").read_text())
    return path, state


def restore(parts: TrainParts, resume: bool | str) -> int:
    """Load the latest checkpoint (or the one ``resume`` names) and return its step.

    Raises:
        FileNotFoundError: If there is no complete checkpoint to resume from.
    """
    path, state = find_checkpoint(parts.checkpoint_dir, resume)
    parts.strategy.load(path)
    if parts.critic is not None:
        if not (path / CRITIC_DIR).is_dir():
            raise FileNotFoundError(
                f"{path} holds no critic/ (saved by a run without adv_estimator=gae); resume "
                "it with the adv_estimator it was trained with"
            )
        parts.critic.load(path / CRITIC_DIR)
    if parts.kl_controller is not None and "kl_controller" in state:
        parts.kl_controller.load_state_dict(state["kl_controller"])
    if parts.reward_moments is not None and "reward_moments" in state:
        parts.reward_moments.load_state_dict(state["reward_moments"])
    parts.source.load_state_dict(state["train_env_manager"])
    set_rng_state(torch.load(path / "rng.pt", weights_only=True))
    step = int(state["step"])
    print(f"resumed from {path} at step {step}", flush=True)
    return step
