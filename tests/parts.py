"""Helpers for tests that build a run's parts with the build floor and then swap a
piece for one the test controls."""

from __future__ import annotations

from typing import Any

from agentgym.trainers.grpo import TrainParts


def use_backend(parts: TrainParts, backend: Any) -> None:
    """Generate with ``backend`` in the train and the validation episodes (the rollout
    source plays ``parts.train``, so it sees the swap)."""
    for rollout in (parts.train, parts.val):
        if rollout is not None:
            rollout.backend = backend
