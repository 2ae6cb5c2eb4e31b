"""The second golden run: the default path on a rollout whose groups differ.

``test_golden.py`` pins the loss terms on a rollout where every sample scores
alike; this one pins what the defaults do with scores that differ: step mode,
group mean/std normalization, zero-variance groups dropped, GiGPO's step term
(``step_advantage_weight: 1``) over anchor states, and the trainer's π_old. The
engine is a scripted policy (random moves and an invalid one, seeded per env),
so the rollout is exact on any machine; the first group's four envs share a
seed, so their episodes are equal and the group's score has no variance (its
samples are kept only where the step term gives them a signal).

When a change is meant to alter these numbers, re-pin them from a run and say
why in the commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from agentgym.builders.train import build_train
from agentgym.envs.scripted import format_response
from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.schema import validate
from agentgym.trainers import grpo
from agentgym.trajectory import Trajectory
from tests.parts import use_backend
from tests.test_config import composed

DEFAULT_PATH = (
    "env=sokoban", "max_turns=3", "sequence_length=512", "generation=hf",
    "generation.max_new_tokens=24", "train_env_manager.env_groups=3",
    "train_env_manager.group_size=4", "rollout_batch_size=12", "val_batch_size=2",
    "val_env_manager.env_groups=2", "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=2",
    "actor_train.training_args.learning_rate=1e-3", "model.warm_start=null",
    "max_steps=2", "eval_steps=0", "save_steps=2", "old_logprobs=trainer",
)  # fmt: skip
"""Only sizes, the scripted engine's needs and π_old differ from the defaults."""

INVALID = "Jump"


class SeededMoves:
    """A generation backend that answers like a model would: a random move or an
    invalid one, from a generator seeded per env (the first group's envs share seed 0)."""

    def __init__(self, tokenizer: Any, slots: Sequence[Any], group_size: int) -> None:
        self.tokenizer = tokenizer
        self.rngs = {
            id(slot.env): np.random.default_rng(0 if slot.index < group_size else slot.index)
            for slot in slots
        }

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        rng = self.rngs[id(env)]
        names = [*env.action_names, INVALID]
        text = format_response([names[int(rng.integers(len(names)))]], env.response_format)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        ids = [*ids[: params.max_new_tokens - 1], self.tokenizer.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """A scripted policy has no weights."""

    async def close(self) -> None:
        """Nothing to release."""


PINNED: dict[int, dict[str, float]] = {
    1: {
        "actor/approx_kl": -0.07318114634189343,
        "actor/clipfrac": 0.3853801190853119,
        "actor/clipfrac_high": 0.20950292889028788,
        "actor/clipfrac_low": 0.1758771948516369,
        "actor/engine_kl_k1": 6.389427185058594,
        "actor/engine_kl_k3": 5.391165733337402,
        "actor/engine_logprob_abs_diff_max": 6.814532279968262,
        "actor/engine_logprob_abs_diff_mean": 6.389427185058594,
        "actor/engine_logprob_diff_mean": -6.389427185058594,
        "actor/grad_norm": 6.526836812496185,
        "actor/loss": 0.3463616818189621,
        "actor/lr": 0.001,
        "actor/pg_loss": 0.3463616818189621,
        "actor/ratio_max": 3.8086273670196533,
        "actor/ratio_mean": 1.2517675384879112,
        "actor/ratio_min": 0.37435540556907654,
        "actor/train_infer_diff_geometric_mean": -0.9982647895812988,
        "actor/train_infer_diff_segment_mean": -0.9982647895812988,
        "actor/train_infer_diff_sequence_mean": -4.679348945617676,
        "actor/train_infer_diff_token_mean": -0.9982647895812988,
        "actor/train_infer_ratio_geometric_mean": 0.0016772870440036058,
        "actor/train_infer_ratio_segment_mean": 0.0016772872768342495,
        "actor/train_infer_ratio_sequence_mean": 5.1260606002967446e-12,
        "actor/train_infer_ratio_token_mean": 0.0017352295108139515,
        "actor/updates": 4.0,
        "train/all/failed": 0.0,
        "train/all/invalid_action_rate": 0.3055555555555556,
        "train/all/effective_action_rate": 0.4166666666666667,
        "train/all/max_length_rate": 0.0,
        "train/all/prefix_drift": 0.0,
        "train/all/response_length_clip_rate": 0.0,
        "train/all/response_tokens": 4.611111111111111,
        "train/all/score": -0.39166666666666666,
        "train/all/success": 0.0,
        "train/all/trajectories": 12.0,
        "train/all/truncation_rate": 1.0,
        "train/all/turns": 3.0,
        "train/all/unreported_info_rate": 0.0,
        "train/anchor_state_groups": 8.0,
        "train/anchor_state_share": 0.9722222089767456,
        "train/failed": 0.0,
        "train/kept_samples": 32.0,
        "train/sokoban/failed": 0.0,
        "train/sokoban/invalid_action_rate": 0.3055555555555556,
        "train/sokoban/effective_action_rate": 0.4166666666666667,
        "train/sokoban/max_length_rate": 0.0,
        "train/sokoban/prefix_drift": 0.0,
        "train/sokoban/response_length_clip_rate": 0.0,
        "train/sokoban/response_tokens": 4.611111111111111,
        "train/sokoban/score": -0.39166666666666666,
        "train/sokoban/success": 0.0,
        "train/sokoban/trajectories": 12.0,
        "train/sokoban/truncation_rate": 1.0,
        "train/sokoban/turns": 3.0,
        "train/sokoban/unreported_info_rate": 0.0,
    },
    2: {
        "actor/approx_kl": 0.04600606488027411,
        "actor/clipfrac": 0.12280701970060666,
        "actor/clipfrac_high": 0.008771929889917374,
        "actor/clipfrac_low": 0.11403508981068929,
        "actor/engine_kl_k1": 6.368921279907227,
        "actor/engine_kl_k3": 5.370811462402344,
        "actor/engine_logprob_abs_diff_max": 7.519014835357666,
        "actor/engine_logprob_abs_diff_mean": 6.368921279907227,
        "actor/engine_logprob_diff_mean": -6.368921279907227,
        "actor/grad_norm": 2.32222843170166,
        "actor/loss": 0.1033681477420032,
        "actor/lr": 0.001,
        "actor/pg_loss": 0.1033681477420032,
        "actor/ratio_max": 1.318462610244751,
        "actor/ratio_mean": 0.9631908933321635,
        "actor/ratio_min": 0.7168431878089905,
        "actor/train_infer_diff_geometric_mean": -0.9980338215827942,
        "actor/train_infer_diff_segment_mean": -0.9980338215827942,
        "actor/train_infer_diff_sequence_mean": -4.574673652648926,
        "actor/train_infer_diff_token_mean": -0.9980338215827942,
        "actor/train_infer_ratio_geometric_mean": 0.0018706683767959476,
        "actor/train_infer_ratio_segment_mean": 0.0018706684932112694,
        "actor/train_infer_ratio_sequence_mean": 1.534200370911787e-11,
        "actor/train_infer_ratio_token_mean": 0.001966201001778245,
        "actor/updates": 3.0,
        "train/all/failed": 0.0,
        "train/all/invalid_action_rate": 0.19444444444444445,
        "train/all/effective_action_rate": 0.4722222222222222,
        "train/all/max_length_rate": 0.0,
        "train/all/prefix_drift": 0.0,
        "train/all/response_length_clip_rate": 0.0,
        "train/all/response_tokens": 4.388888888888889,
        "train/all/score": -0.35833333333333334,
        "train/all/success": 0.0,
        "train/all/trajectories": 12.0,
        "train/all/truncation_rate": 1.0,
        "train/all/turns": 3.0,
        "train/all/unreported_info_rate": 0.0,
        "train/anchor_state_groups": 7.0,
        "train/anchor_state_share": 1.0,
        "train/failed": 0.0,
        "train/kept_samples": 24.0,
        "train/sokoban/failed": 0.0,
        "train/sokoban/invalid_action_rate": 0.19444444444444445,
        "train/sokoban/effective_action_rate": 0.4722222222222222,
        "train/sokoban/max_length_rate": 0.0,
        "train/sokoban/prefix_drift": 0.0,
        "train/sokoban/response_length_clip_rate": 0.0,
        "train/sokoban/response_tokens": 4.388888888888889,
        "train/sokoban/score": -0.35833333333333334,
        "train/sokoban/success": 0.0,
        "train/sokoban/trajectories": 12.0,
        "train/sokoban/truncation_rate": 1.0,
        "train/sokoban/turns": 3.0,
        "train/sokoban/unreported_info_rate": 0.0,
    },
}
"""Pinned from a run of DEFAULT_PATH at the commit that added this test."""


def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[int, Any]:
    raw = composed(
        *DEFAULT_PATH, f"model.cache_dir={tmp_path / 'cache'}", f"output_dir={tmp_path / 'run'}"
    )
    config, parts = build_train(validate(raw), raw)
    assert parts.train is not None
    manager = parts.train.manager
    use_backend(parts, SeededMoves(parts.train.chat.tokenizer, manager.slots, manager.group_size))
    seen: dict[int, tuple[list[Trajectory], dict[str, float]]] = {}
    next_batch = parts.source.next_batch

    async def recording(step: int) -> Any:  # the batch and the metrics the step trains with
        rollout = await next_batch(step)
        seen[step] = (list(rollout.trajectories), rollout.metrics)  # metrics fill in later
        return rollout

    monkeypatch.setattr(parts.source, "next_batch", recording)
    grpo.train(config, parts)
    return seen


def test_the_default_path_on_groups_that_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = run(tmp_path, monkeypatch)
    assert seen.keys() == PINNED.keys()
    for step, (trajectories, metrics) in seen.items():
        scores = [t.score for t in trajectories]
        assert len(set(scores[:4])) == 1 and len(set(scores)) > 1, (step, scores)
        got = {k: v for k, v in metrics.items() if k.startswith(("train/", "actor/"))}
        assert got.keys() == PINNED[step].keys(), step
        for key, value in PINNED[step].items():
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, key)
    # step 2: the first group scored alike and its samples carry no step signal
    assert PINNED[2]["train/kept_samples"] == 24
