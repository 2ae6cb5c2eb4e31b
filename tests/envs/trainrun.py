"""Run ``python -m agentgym.train`` for two fast steps of the tiny model (for env e2e tests)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests import forkserver

# 2 groups × 2 envs, 2 turns of at most 6 tokens, one update a step, random weights.
TWO_STEPS = [
    "max_steps=2",
    "save_steps=2",
    "eval_steps=2",
    "max_turns=2",
    "sequence_length=512",
    "generation.max_new_tokens=6",
    "train_env_manager.env_groups=2",
    "train_env_manager.group_size=2",
    "rollout_batch_size=4",
    "val_batch_size=2",
    "val_env_manager.env_groups=2",
    "rollout_mode=trajectory",
    "step_advantage_weight=0",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "model.warm_start=null",
]


def run_python(
    args: list[str], *, cwd: Path, pythonpath: Path | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """``python <args>`` with ``pythonpath`` in front of ``PYTHONPATH`` (a ``-m`` command
    forked from the preloaded server: :mod:`tests.forkserver`)."""
    environment = dict(os.environ)
    if pythonpath is not None:
        environment["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(pythonpath), environment.get("PYTHONPATH")) if p
        )
    return forkserver.run_python(args, cwd=cwd, env=environment, input=stdin)


def train_two_steps(
    overrides: list[str], *, output: Path, model_cache: Path, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m agentgym.train <overrides>`` plus :data:`TWO_STEPS`; asserts it succeeds."""
    args = ["-m", "agentgym.train", *overrides, *TWO_STEPS]
    args += [f"model.cache_dir={model_cache}", f"output_dir={output}"]
    result = run_python(args, cwd=output.parent, pythonpath=pythonpath)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def logged_steps(output: Path) -> dict[int, dict[str, float]]:
    """metrics.jsonl by step, train and validation lines merged."""
    rows: dict[int, dict[str, float]] = {}
    for line in (output / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        rows.setdefault(int(record["step"]), {}).update(record)
    return rows
