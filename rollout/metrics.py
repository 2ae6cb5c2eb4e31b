"""Rollout metrics, per env tag and over the whole batch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agentgym.trajectory import TRUNCATION_REASONS, Trajectory


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Success, score, turns, invalid- and effective-action, truncation and failure rates.

    Keys are ``"{tag}/{metric}"`` for each tag and ``"all/{metric}"`` for the batch.
    Failed trajectories (env or generation error) count in ``failed`` only.
    """
    metrics: dict[str, float] = {}
    tags = sorted({t.tag for t in trajectories})
    for tag in [*tags, "all"]:
        group = [t for t in trajectories if tag in ("all", t.tag)]
        played = [t for t in group if not t.failed]
        turns = [turn for t in played for turn in t.turns]
        prefix = f"{tag}/"
        metrics[prefix + "trajectories"] = float(len(group))
        metrics[prefix + "failed"] = float(len(group) - len(played))
        if not played:
            continue
        count = len(played)
        metrics[prefix + "success"] = sum(t.success for t in played) / count
        metrics[prefix + "score"] = sum(t.score for t in played) / count
        metrics[prefix + "turns"] = sum(len(t.turns) for t in played) / count
        metrics[prefix + "truncation_rate"] = (
            sum(t.termination_reason in TRUNCATION_REASONS for t in played) / count
        )
        metrics[prefix + "max_length_rate"] = (
            sum(t.termination_reason == "max_length" for t in played) / count
        )
        metrics[prefix + "prefix_drift"] = float(sum(t.prefix_drift is not None for t in played))
        if turns:
            metrics[prefix + "invalid_action_rate"] = sum(
                not turn.action_is_valid for turn in turns
            ) / len(turns)
            said = [
                turn.action_is_effective for turn in turns if turn.action_is_effective is not None
            ]
            if said:  # ROLL's action_is_effective, as a rate over the turns whose env says
                metrics[prefix + "effective_action_rate"] = sum(said) / len(said)
            metrics[prefix + "unreported_info_rate"] = sum(t.unreported_info for t in played) / len(
                turns
            )
            metrics[prefix + "response_tokens"] = sum(
                len(turn.response_ids) for turn in turns
            ) / len(turns)
            metrics[prefix + "response_length_clip_rate"] = sum(
                turn.finish_reason == "length" for turn in turns
            ) / len(turns)
    return metrics


@dataclass(frozen=True)
class FailureReport:
    """The failed episodes of a batch.

    Attributes:
        failed: How many episodes failed (env or generation error).
        messages: One message per kind of failure: its count and the first
            episode's traceback.
    """

    failed: int
    messages: list[str]


def failure_report(trajectories: Sequence[Trajectory]) -> FailureReport:
    """Count failed episodes by kind (termination reason and exception type) and keep
    the first traceback of each kind."""
    kinds: dict[tuple[str, str], list[Trajectory]] = {}
    for trajectory in trajectories:
        if trajectory.failed:
            error = (trajectory.error or "").strip()
            last = error.splitlines()[-1] if error else "unknown error"
            kind = (trajectory.termination_reason or "failed", last.split(":")[0])
            kinds.setdefault(kind, []).append(trajectory)
    messages = []
    for (reason, exception), group in kinds.items():
        first = group[0]
        messages.append(
            f"{len(group)} episode(s) ended with {reason} ({exception}); the first, "
            f"env {first.env_name!r} (tag {first.tag!r}, seed {first.seed}):\n{first.error}"
        )
    return FailureReport(sum(len(group) for group in kinds.values()), messages)


def staleness_metrics(
    trajectories: Sequence[Trajectory], version: int, ratio: float
) -> dict[str, float]:
    """``async/staleness_*``: how many versions each trained trajectory's first turn is
    behind ``version`` (the weights the step updates): mean, max and a count per value;
    per generated token, the mean (``async/token_staleness_mean``: a response continued
    across a sync, ``partial_rollout``, holds tokens of two versions) and the responses
    so continued (``async/continued_turns``)."""
    played = [t for t in trajectories if t.turns]
    lags = [version - t.policy_version for t in played]
    token_lags = [
        version - token_version
        for t in played
        for turn in t.turns
        for token_version in (turn.token_versions or [turn.policy_version] * len(turn.response_ids))
    ]
    continued = sum(
        len(set(turn.token_versions)) > 1 for t in played for turn in t.turns if turn.token_versions
    )
    metrics = {
        "async/staleness_mean": sum(lags) / max(len(lags), 1),
        "async/staleness_max": float(max(lags, default=0)),
        "async/last_turn_staleness_mean": (
            sum(version - t.last_policy_version for t in played) / max(len(played), 1)
        ),
        "async/token_staleness_mean": sum(token_lags) / max(len(token_lags), 1),
        "async/continued_turns": float(continued),
    }
    for lag in range(math.ceil(ratio) + 1):
        metrics[f"async/staleness_{lag}"] = float(lags.count(lag))
    return metrics
