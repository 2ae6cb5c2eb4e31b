"""A golden run in torchtune's manner: a fixed tiny config (seeded HF generation)
trains 2 steps and its ``train/*`` and ``actor/*`` metrics equal pinned values.

It fails when the rollout, the advantages, the loss, the KL or entropy terms,
their normalizers or their logging change. When a change is meant to alter
these numbers, re-pin them from a run and say why in the commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainers.test_train_e2e import metrics, train

GOLDEN = (
    "generation=hf",
    "max_steps=2",
    "eval_steps=0",
    "save_steps=2",
    "use_kl_loss=true",
    "kl_penalty=low_var_kl",
    "kl_loss_coef=0.1",
    "entropy_loss_coef=0.01",
    "loss_agg_mode=seq-mean-token-sum-norm",
    "actor_infer.generating_args.temperature=0.7",
    "ppo_epochs=2",
    "clip_ratio_low=0.001",
    "clip_ratio_high=0.001",
)

# Pinned from a run of GOLDEN at the commit that added this test.
PINNED = {
    1: {
        "actor/approx_kl": 0.21541453152894974,
        "actor/clipfrac": 0.4479166716337204,
        "actor/clipfrac_high": 0.0,
        "actor/clipfrac_low": 0.4479166716337204,
        "actor/entropy": 1.1587474048137665,
        "actor/grad_norm": 0.16798895969986916,
        "actor/kl": 0.018843183293938637,
        "actor/loss": 0.06574715673923492,
        "actor/lr": 0.001,
        "actor/pg_loss": 0.07545031048357487,
        "actor/ratio_max": 1.3393186330795288,
        "actor/ratio_mean": 0.8433014452457428,
        "actor/ratio_min": 0.23720470070838928,
        "actor/updates": 2.0,
        "train/all/failed": 0.0,
        "train/all/invalid_action_rate": 1.0,
        "train/all/effective_action_rate": 0.0,
        "train/all/max_length_rate": 0.0,
        "train/all/prefix_drift": 0.0,
        "train/all/response_length_clip_rate": 1.0,
        "train/all/response_tokens": 6.0,
        "train/all/score": -0.39999999999999997,
        "train/all/success": 0.0,
        "train/all/trajectories": 8.0,
        "train/all/truncation_rate": 1.0,
        "train/all/turns": 2.0,
        "train/all/unreported_info_rate": 0.0,
        "train/failed": 0.0,
        "train/sokoban/failed": 0.0,
        "train/sokoban/invalid_action_rate": 1.0,
        "train/sokoban/effective_action_rate": 0.0,
        "train/sokoban/max_length_rate": 0.0,
        "train/sokoban/prefix_drift": 0.0,
        "train/sokoban/response_length_clip_rate": 1.0,
        "train/sokoban/response_tokens": 6.0,
        "train/sokoban/score": -0.39999999999999997,
        "train/sokoban/success": 0.0,
        "train/sokoban/trajectories": 8.0,
        "train/sokoban/truncation_rate": 1.0,
        "train/sokoban/turns": 2.0,
        "train/sokoban/unreported_info_rate": 0.0,
    },
    2: {
        "actor/approx_kl": 0.13659159839153334,
        "actor/clipfrac": 0.484375,
        "actor/clipfrac_high": 0.0,
        "actor/clipfrac_low": 0.484375,
        "actor/entropy": 1.1573479771614075,
        "actor/grad_norm": 0.11273558624088764,
        "actor/kl": 0.01483217440545559,
        "actor/loss": 0.06493644043803215,
        "actor/lr": 0.001,
        "actor/pg_loss": 0.07502670213580132,
        "actor/ratio_max": 1.0888713598251343,
        "actor/ratio_mean": 0.8853587061166763,
        "actor/ratio_min": 0.5168169140815735,
        "actor/updates": 2.0,
        "train/all/failed": 0.0,
        "train/all/invalid_action_rate": 1.0,
        "train/all/effective_action_rate": 0.0,
        "train/all/max_length_rate": 0.0,
        "train/all/prefix_drift": 0.0,
        "train/all/response_length_clip_rate": 1.0,
        "train/all/response_tokens": 6.0,
        "train/all/score": -0.39999999999999997,
        "train/all/success": 0.0,
        "train/all/trajectories": 8.0,
        "train/all/truncation_rate": 1.0,
        "train/all/turns": 2.0,
        "train/all/unreported_info_rate": 0.0,
        "train/failed": 0.0,
        "train/sokoban/failed": 0.0,
        "train/sokoban/invalid_action_rate": 1.0,
        "train/sokoban/effective_action_rate": 0.0,
        "train/sokoban/max_length_rate": 0.0,
        "train/sokoban/prefix_drift": 0.0,
        "train/sokoban/response_length_clip_rate": 1.0,
        "train/sokoban/response_tokens": 6.0,
        "train/sokoban/score": -0.39999999999999997,
        "train/sokoban/success": 0.0,
        "train/sokoban/trajectories": 8.0,
        "train/sokoban/truncation_rate": 1.0,
        "train/sokoban/turns": 2.0,
        "train/sokoban/unreported_info_rate": 0.0,
    },
}


def test_golden_two_step_run(tmp_path: Path) -> None:
    output = tmp_path / "run"
    train(output, tmp_path / "cache", *GOLDEN)
    got = metrics(output)
    assert got.keys() == PINNED.keys()
    for step, expected in PINNED.items():
        assert got[step].keys() == expected.keys(), step
        for key, value in expected.items():
            assert got[step][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, key)
