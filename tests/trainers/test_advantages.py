"""Reward normalization and advantage estimators, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from agentgym.choices import GROUPINGS, NORMALIZATIONS
from agentgym.trainers.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    last_token_rewards,
    register_estimator,
)
from agentgym.trainers.normalization import normalize_rewards

EPS = 1e-6

# One batch on which the three groupings disagree:
#   state groups (group_ids): {1, 3}, {2, 6}, {4, 4}
#   inductive groups (tags):  a = {1, 3, 2}, b = {6, 4, 4}
#   batch:                    {1, 3, 2, 6, 4, 4}, mean 20/6 = 10/3
SCORES = torch.tensor([1.0, 3.0, 2.0, 6.0, 4.0, 4.0])
GROUP_IDS = [0, 0, 1, 1, 2, 2]
TAGS = ["a", "a", "a", "b", "b", "b"]

SQRT2 = math.sqrt(2.0)
# batch: deviations -7/3, -1/3, -4/3, 8/3, 2/3, 2/3; squares sum to 138/9; /5 -> var 46/15
BATCH_STD = math.sqrt(46 / 15)
# tag b: mean 14/3, deviations 4/3, -2/3, -2/3; squares sum to 24/9; /2 -> var 4/3
TAG_B_STD = math.sqrt(4 / 3)

EXPECTED: dict[tuple[str, str], list[float]] = {
    ("state", "mean"): [-1, 1, -2, 2, 0, 0],
    # std {1, 3} = sqrt(2), std {2, 6} = 2 sqrt(2); {4, 4} has zero variance -> 0
    ("state", "mean_std"): [
        -1 / (SQRT2 + EPS),
        1 / (SQRT2 + EPS),
        -2 / (2 * SQRT2 + EPS),
        2 / (2 * SQRT2 + EPS),
        0,
        0,
    ],
    ("batch", "mean"): [-7 / 3, -1 / 3, -4 / 3, 8 / 3, 2 / 3, 2 / 3],
    ("batch", "mean_std"): [
        d / (BATCH_STD + EPS) for d in (-7 / 3, -1 / 3, -4 / 3, 8 / 3, 2 / 3, 2 / 3)
    ],
    # tag a: mean 2, std 1; tag b: mean 14/3, std sqrt(4/3)
    ("inductive", "mean"): [-1, 1, 0, 4 / 3, -2 / 3, -2 / 3],
    ("inductive", "mean_std"): [
        -1 / (1 + EPS),
        1 / (1 + EPS),
        0,
        (4 / 3) / (TAG_B_STD + EPS),
        (-2 / 3) / (TAG_B_STD + EPS),
        (-2 / 3) / (TAG_B_STD + EPS),
    ],
}
for _grouping in GROUPINGS:
    EXPECTED[(_grouping, "identity")] = SCORES.tolist()
    EXPECTED[(_grouping, "asym_clip")] = list(EXPECTED[(_grouping, "mean_std")])
# asym_clip clamps to [-1, 3]: only the batch grouping's first value leaves that range,
# (-7/3) / sqrt(46/15) = -1.332 -> -1 (state's and tag a's -1/(1 + 1e-6) stay just inside).
EXPECTED[("batch", "asym_clip")][0] = -1.0


@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("method", NORMALIZATIONS)
def test_every_grouping_and_method_by_hand(grouping: str, method: str) -> None:
    out = normalize_rewards(
        SCORES, grouping=grouping, method=method, group_ids=GROUP_IDS, tags=TAGS
    )
    assert_close(out, torch.tensor(EXPECTED[(grouping, method)], dtype=torch.float32))


def test_groupings_give_different_answers_on_the_same_batch() -> None:
    results = {
        g: normalize_rewards(SCORES, grouping=g, method="mean_std", group_ids=GROUP_IDS, tags=TAGS)
        for g in GROUPINGS
    }
    assert not torch.allclose(results["state"], results["batch"])
    assert not torch.allclose(results["state"], results["inductive"])
    assert not torch.allclose(results["batch"], results["inductive"])


@pytest.mark.parametrize("method", ["mean", "mean_std", "asym_clip"])
def test_singleton_and_zero_variance_groups_give_exactly_zero(method: str) -> None:
    # groups: {7} (singleton), {5, 5} (zero variance), {0.1, 0.1, 0.1} (float mean is
    # not exactly 0.1, yet the group is constant), {0, 2} (regular: -1/+1 scaled)
    scores = torch.tensor([7.0, 5.0, 5.0, 0.1, 0.1, 0.1, 0.0, 2.0])
    ids = torch.tensor([9, 4, 4, 1, 1, 1, 3, 3])
    out = normalize_rewards(scores, grouping="state", method=method, group_ids=ids)
    assert out[:6].tolist() == [0.0] * 6
    scale = 1.0 if method == "mean" else 1 / (SQRT2 + EPS)  # std {0, 2} = sqrt(2)
    assert_close(out[6:], torch.tensor([-scale, scale]))


def test_identity_keeps_singletons_and_constant_groups() -> None:
    scores = torch.tensor([7.0, 5.0, 5.0])
    out = normalize_rewards(scores, grouping="state", method="identity", group_ids=[0, 1, 1])
    assert out.tolist() == [7.0, 5.0, 5.0]


def test_asym_clip_clamps_at_minus_one_and_three() -> None:
    # A group of 16 with one 1 and fifteen 0s: the outlier's z is (n - 1)/sqrt(n) = 15/4 = 3.75
    # and the zeros' is -(1/16)/(1/4) = -0.25. A group {0, 3, 3}: mean 2, std sqrt(3),
    # z = -2/sqrt(3) = -1.1547 for the 0 and +1/sqrt(3) = 0.57735 for the 3s.
    high = torch.tensor([1.0] + [0.0] * 15)
    low = torch.tensor([0.0, 3.0, 3.0])
    scores = torch.cat([high, low])
    ids = [0] * 16 + [1] * 3
    mean_std = normalize_rewards(scores, grouping="state", method="mean_std", group_ids=ids)
    clipped = normalize_rewards(scores, grouping="state", method="asym_clip", group_ids=ids)
    assert_close(mean_std[0], torch.tensor(3.75 / (1 + 4 * EPS)))  # std 1/4: 0.9375/(0.25+1e-6)
    assert clipped[0].item() == 3.0
    assert_close(clipped[1:16], torch.full((15,), -0.0625 / (0.25 + EPS)))
    assert_close(mean_std[16], torch.tensor(-2 / (math.sqrt(3) + EPS)))
    assert clipped[16].item() == -1.0
    assert_close(clipped[17:], torch.full((2,), 1 / (math.sqrt(3) + EPS)))


def test_reward_clip_clamps_after_normalization() -> None:
    scores = torch.tensor([-5.0, 1.0, 5.0])
    out = normalize_rewards(scores, grouping="batch", method="identity", reward_clip=2.0)
    assert out.tolist() == [-2.0, 1.0, 2.0]
    # state mean on {1, 3} gives -1/+1; reward_clip 0.5 -> -0.5/+0.5
    out = normalize_rewards(
        torch.tensor([1.0, 3.0]), grouping="state", method="mean", group_ids=[0, 0], reward_clip=0.5
    )
    assert out.tolist() == [-0.5, 0.5]


def test_roll_alias_traj_group_id() -> None:
    by_alias = normalize_rewards(
        SCORES, grouping="state", method="mean_std", traj_group_id=GROUP_IDS
    )
    by_name = normalize_rewards(SCORES, grouping="state", method="mean_std", group_ids=GROUP_IDS)
    assert_close(by_alias, by_name)
    with pytest.raises(ValueError, match="not both"):
        normalize_rewards(
            SCORES, grouping="state", method="mean", group_ids=GROUP_IDS, traj_group_id=GROUP_IDS
        )


def test_group_ids_as_tensor_list_and_integer_scores() -> None:
    ints = torch.tensor([1, 3, 2, 6, 4, 4])
    out = normalize_rewards(
        ints, grouping="state", method="mean", group_ids=torch.tensor(GROUP_IDS)
    )
    assert out.dtype == torch.float32
    assert out.tolist() == EXPECTED[("state", "mean")]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"grouping": "states", "method": "mean"},
            r"grouping='states' is not valid\. Did you mean 'state'\?"
            r".*\['state', 'batch', 'inductive'\]",
        ),
        (
            {"grouping": "batch", "method": "meanstd"},
            r"method='meanstd' is not valid\. Did you mean 'mean_std'",
        ),
        ({"grouping": "batch", "method": "zscore"}, r"Valid options: \['identity', 'mean', "),
        ({"grouping": "state", "method": "mean"}, r"grouping='state' needs group_ids"),
        ({"grouping": "inductive", "method": "mean"}, r"grouping='inductive' needs tags"),
        (
            {"grouping": "batch", "method": "mean", "reward_clip": 0.0},
            r"reward_clip must be positive",
        ),
        (
            {"grouping": "state", "method": "mean", "group_ids": [0, 1]},
            r"group_ids must have shape",
        ),
        ({"grouping": "inductive", "method": "mean", "tags": ["a"]}, r"one tag per sample"),
    ],
)
def test_bad_arguments_raise_with_the_key_value_and_options(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        normalize_rewards(torch.tensor([1.0, 2.0, 3.0]), **kwargs)


def test_scores_must_be_one_dimensional() -> None:
    with pytest.raises(ValueError, match=r"1-D \[B\]"):
        normalize_rewards(torch.zeros(2, 3), grouping="batch", method="mean")


# Property tests ---------------------------------------------------------------------

batches = st.integers(min_value=1, max_value=24).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(-5, 5), min_size=n, max_size=n),
        st.lists(st.integers(0, 3), min_size=n, max_size=n),
    )
)


@settings(max_examples=60, deadline=None)
@given(batches)
def test_mean_std_groups_have_zero_mean_and_unit_std(batch: tuple[list[int], list[int]]) -> None:
    scores, ids = torch.tensor(batch[0], dtype=torch.float64), torch.tensor(batch[1])
    out = normalize_rewards(scores, grouping="state", method="mean_std", group_ids=ids)
    for gid in ids.unique():
        members = out[ids == gid]
        raw = scores[ids == gid]
        if len(members) < 2 or bool((raw == raw[0]).all()):
            assert (members == 0).all()
            continue
        assert abs(members.mean().item()) < 1e-9
        # integer scores: std >= sqrt(1/2), so the 1e-6 shifts the std by < 2e-6
        assert abs(members.std().item() - 1.0) < 1e-5


@settings(max_examples=40, deadline=None)
@given(batches, st.sampled_from(GROUPINGS))
def test_identity_is_identity(batch: tuple[list[int], list[int]], grouping: str) -> None:
    scores = torch.tensor(batch[0], dtype=torch.float32) / 3
    tags = [str(i) for i in batch[1]]
    out = normalize_rewards(
        scores, grouping=grouping, method="identity", group_ids=batch[1], tags=tags
    )
    assert torch.equal(out, scores)


@settings(max_examples=40, deadline=None)
@given(batches, st.sampled_from(NORMALIZATIONS), st.randoms(use_true_random=False))
def test_groupings_agree_where_they_should_and_permutations_commute(
    batch: tuple[list[int], list[int]], method: str, rng: object
) -> None:
    scores, ids = torch.tensor(batch[0], dtype=torch.float64), torch.tensor(batch[1])
    tags = [f"env-{i}" for i in batch[1]]
    state = normalize_rewards(scores, grouping="state", method=method, group_ids=ids)
    inductive = normalize_rewards(scores, grouping="inductive", method=method, tags=tags)
    assert_close(state, inductive)
    one_group = normalize_rewards(
        scores, grouping="state", method=method, group_ids=torch.zeros_like(ids)
    )
    assert_close(one_group, normalize_rewards(scores, grouping="batch", method=method))
    perm = torch.randperm(len(scores), generator=torch.Generator().manual_seed(len(scores)))
    permuted = normalize_rewards(scores[perm], grouping="state", method=method, group_ids=ids[perm])
    assert_close(permuted, state[perm])


# Estimators -------------------------------------------------------------------------

# Row 0: two turns. Generated tokens at 1, 2 (turn 1, reward 1 on its last token)
# and at 5, 6 (turn 2, reward 2); positions 3, 4 are an observation.
# Row 1: one turn at 0..2 with reward -1; a stray reward 5 at position 4 is off the mask.
MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0, 0]])
REWARDS = torch.tensor([[0, 0, 1, 0, 0, 0, 2], [0, 0, -1, 0, 5, 0, 0]], dtype=torch.float32)
NO_SCORES = torch.zeros(2)


def test_grpo_puts_the_normalized_score_on_every_generated_token() -> None:
    out = ADVANTAGE_ESTIMATORS["grpo"](torch.tensor([0.5, -1.0]), REWARDS, MASK)
    assert_close(out, torch.tensor([[0, 0.5, 0.5, 0, 0, 0.5, 0.5], [-1, -1, -1, 0, 0, 0, 0.0]]))


def test_reinforce_undiscounted_return_to_go() -> None:
    # row 0: tokens of turn 1 see 1 + 2 = 3, tokens of turn 2 see 2; row 1: -1 (the 5 is ignored)
    out = ADVANTAGE_ESTIMATORS["reinforce"](NO_SCORES, REWARDS, MASK, gamma=1.0)
    assert_close(out, torch.tensor([[0, 3, 3, 0, 0, 2, 2], [-1, -1, -1, 0, 0, 0, 0.0]]))


def test_reinforce_discounts_per_generated_token() -> None:
    # gamma 0.5 over the generated steps only (positions 1, 2, 5, 6 have rewards 0, 1, 0, 2):
    #   G(6) = 2, G(5) = 0 + 0.5 * 2 = 1, G(2) = 1 + 0.5 * 1 = 1.5, G(1) = 0 + 0.5 * 1.5 = 0.75
    # the observation at 3, 4 does not discount. Row 1: -0.25, -0.5, -1.
    out = ADVANTAGE_ESTIMATORS["reinforce"](NO_SCORES, REWARDS, MASK, gamma=0.5)
    expected = torch.tensor([[0, 0.75, 1.5, 0, 0, 1, 2], [-0.25, -0.5, -1, 0, 0, 0, 0]])
    assert_close(out, expected)


def test_reinforce_baseline_subtracts_the_batch_mean_return() -> None:
    # returns on the 7 generated tokens: 0.75, 1.5, 1, 2, -0.25, -0.5, -1 -> sum 3.5, mean 0.5
    out = ADVANTAGE_ESTIMATORS["reinforce"](NO_SCORES, REWARDS, MASK, gamma=0.5, baseline=True)
    expected = torch.tensor([[0, 0.25, 1.0, 0, 0, 0.5, 1.5], [-0.75, -1.0, -1.5, 0, 0, 0, 0]])
    assert_close(out, expected)


def test_reinforce_gamma_loop_matches_the_cumsum_path_at_gamma_one() -> None:
    rewards = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    mask = (torch.rand(5, 40, generator=torch.Generator().manual_seed(1)) > 0.3).long()
    fast = ADVANTAGE_ESTIMATORS["reinforce"](torch.zeros(5), rewards, mask, gamma=1.0)
    slow = ADVANTAGE_ESTIMATORS["reinforce"](torch.zeros(5), rewards, mask, gamma=1.0 - 1e-12)
    assert_close(fast, slow)


def test_reinforce_rejects_gamma_outside_zero_one() -> None:
    with pytest.raises(ValueError, match="gamma must be in"):
        compute_advantages(
            "reinforce",
            normalized_scores=NO_SCORES,
            token_rewards=REWARDS,
            loss_mask=MASK,
            gamma=1.5,
        )


def test_whitening_over_generated_tokens() -> None:
    # grpo with scores 1 and 3 on two tokens each: values 1, 1, 3, 3 -> mean 2,
    # unbiased var 4/3 -> +-1/sqrt(4/3) = +-0.8660254
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    out = compute_advantages(
        "grpo",
        normalized_scores=torch.tensor([1.0, 3.0]),
        token_rewards=torch.zeros(2, 3),
        loss_mask=mask,
        whiten=True,
    )
    w = 1 / math.sqrt(4 / 3 + 1e-8)
    assert_close(out, torch.tensor([[-w, -w, 0], [0, w, w]]))


def test_advantage_clip_after_whitening() -> None:
    out = compute_advantages(
        "grpo",
        normalized_scores=torch.tensor([2.5, -0.3]),
        token_rewards=torch.zeros(2, 2),
        loss_mask=torch.tensor([[1, 0], [1, 1]]),
        clip=1.0,
    )
    assert_close(out, torch.tensor([[1.0, 0.0], [-0.3, -0.3]]))
    # whitening first: values 1, 1, 1, -3 -> mean 0, var 12/3 = 4, std 2 -> 0.5, 0.5, 0.5, -1.5;
    # then clip 1 -> -1
    out = compute_advantages(
        "grpo",
        normalized_scores=torch.tensor([1.0, 1.0, -3.0]),
        token_rewards=torch.zeros(3, 2),
        loss_mask=torch.tensor([[1, 1], [1, 0], [1, 0]]),
        whiten=True,
        clip=1.0,
    )
    assert_close(out, torch.tensor([[0.5, 0.5], [0.5, 0.0], [-1.0, 0.0]]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["grpo", "reinforce"])
@pytest.mark.parametrize("whiten", [False, True])
def test_advantages_are_zero_off_the_mask(name: str, whiten: bool) -> None:
    out = compute_advantages(
        name,
        normalized_scores=torch.tensor([0.7, -0.2]),
        token_rewards=REWARDS,
        loss_mask=MASK,
        baseline=True,
        whiten=whiten,
    )
    assert (out[MASK == 0] == 0).all()
    assert (out[MASK == 1] != 0).any()


def test_whitening_a_tiny_mask_stays_finite() -> None:
    for mask in (torch.zeros(2, 3), torch.tensor([[0, 1, 0], [0, 0, 0]])):
        out = compute_advantages(
            "grpo",
            normalized_scores=torch.tensor([1.0, 2.0]),
            token_rewards=torch.zeros(2, 3),
            loss_mask=mask,
            whiten=True,
        )
        assert torch.isfinite(out).all()


def test_unknown_estimator_names_close_matches_and_options() -> None:
    with pytest.raises(
        ValueError, match=r"estimator='gpro' is not valid\. Did you mean 'grpo'\?.*'reinforce'"
    ):
        compute_advantages(
            "gpro", normalized_scores=NO_SCORES, token_rewards=REWARDS, loss_mask=MASK
        )


def test_bad_shapes_and_clip_raise() -> None:
    with pytest.raises(ValueError, match=r"normalized_scores must be \[B\]"):
        compute_advantages(
            "grpo", normalized_scores=torch.zeros(3), token_rewards=REWARDS, loss_mask=MASK
        )
    with pytest.raises(ValueError, match="must both be"):
        compute_advantages(
            "grpo", normalized_scores=NO_SCORES, token_rewards=REWARDS[:, :3], loss_mask=MASK
        )
    with pytest.raises(ValueError, match="advantage clip must be positive"):
        compute_advantages(
            "grpo", normalized_scores=NO_SCORES, token_rewards=REWARDS, loss_mask=MASK, clip=-1.0
        )


def test_register_estimator_adds_one_and_refuses_a_clash() -> None:
    def constant(normalized_scores, token_rewards, loss_mask, *, gamma=1.0, baseline=False):
        return torch.full_like(token_rewards, 7.0)

    try:
        register_estimator("test-constant")(constant)
        out = compute_advantages(
            "test-constant", normalized_scores=NO_SCORES, token_rewards=REWARDS, loss_mask=MASK
        )
        assert_close(out, 7.0 * MASK.float())
        register_estimator("test-constant")(constant)  # the same function again is fine
        with pytest.raises(ValueError, match="already registered"):
            register_estimator("test-constant")(lambda *a, **k: a[1])
    finally:
        ADVANTAGE_ESTIMATORS.pop("test-constant", None)


def test_last_token_rewards_places_scores_on_the_last_generated_token() -> None:
    mask = torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    out = last_token_rewards(torch.tensor([2.0, -1.0, 5.0]), mask)
    assert_close(out, torch.tensor([[0, 0, 2.0, 0], [-1.0, 0, 0, 0], [0, 0, 0, 0.0]]))
