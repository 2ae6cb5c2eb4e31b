"""Evaluation: a policy version plays the validation envs, one function for every mode
(the recipe every ``eval_steps``, an explorer on the versions it loads, ``eval`` and
``bench`` on a checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass

from agentgym.rollout.loop import RolloutResult, collect
from agentgym.rollout.source import Rollout


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` played.

    Attributes:
        result: The episodes (fixed seeds) and their per-tag metrics.
        version: The policy version that played them.
    """

    result: RolloutResult
    version: int

    @property
    def metrics(self) -> dict[str, float]:
        """The metrics as a run logs them: ``val/*`` and ``val/policy_version``."""
        metrics = {f"val/{key}": value for key, value in self.result.metrics.items()}
        metrics["val/policy_version"] = float(self.version)
        return metrics


async def evaluate(val: Rollout, *, version: int = 0) -> Evaluation:
    """Play the next batch of ``val``'s envs (validation seeds) with policy ``version``."""
    result = await collect(
        val.manager, val.backend, val.chat, val.config, policy_version=version, players=val.players
    )
    return Evaluation(result, version)
