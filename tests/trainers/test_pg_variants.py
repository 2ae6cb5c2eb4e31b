"""ROLL's agentic pg_variant losses: hand-computed cases, each variant's defining property,
the ratio-1 identities, masking and exact accumulation."""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from agentgym.choices import LOSS_AGG_MODES
from agentgym.trainers.losses import policy_loss
from agentgym.trainers.pg_variants import PG_VARIANT_KNOBS, PG_VARIANTS, VariantArgs

LN2 = math.log(2.0)
NAN = float("nan")

# One row, three tokens with ratios r = 2, 0.5, 1 and advantages 1, -1, 2 (token-mean over 3).
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5]])
OLD = LOGPROBS - torch.tensor([[LN2, -LN2, 0.0]])
ADVANTAGES = torch.tensor([[1.0, -1.0, 2.0]])
MASK = torch.ones(1, 3)

KNOBS: dict[str, dict[str, Any]] = {
    "vanilla": {},
    "ppo": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "dual_clip_ratio_c": None},
    "tis": {"tis_lower_bound": 0.0, "tis_upper_bound": 1.0},
    "topr": {
        "topr_positive_weight": 1.0,
        "topr_negative_weight": 1.0,
        "topr_advantage_threshold": None,
    },
    "cispo": {"cispo_epsilon_low": 0.1, "cispo_epsilon_high": 0.1, "cispo_use_unified_mask": False},
    "kimi15": {"kimi15_tau": 0.5},
    "opmd": {"opmd_tau": 1.0},
}  # ROLL's defaults, but kimi15's tau (0.1 there), larger to show in the hand values


def run(
    variant: str,
    logprobs: Tensor = LOGPROBS,
    old: Tensor = OLD,
    advantages: Tensor = ADVANTAGES,
    mask: Tensor = MASK,
    *,
    scores: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """(loss, d loss / d logprobs, metrics) of one variant, with KNOBS[variant] unless given."""
    logprobs = logprobs.clone().requires_grad_(True)
    knobs = {**KNOBS[variant], **{k: v for k, v in kwargs.items() if k in KNOBS[variant]}}
    rest = {k: v for k, v in kwargs.items() if k not in knobs}
    if scores is None:
        scores = torch.ones(logprobs.shape[0])
    loss, metrics = PG_VARIANTS[variant](
        logprobs, old, advantages, mask, **knobs, scores=scores, **rest
    )
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss.detach(), grad, metrics


@pytest.mark.parametrize(
    ("variant", "knobs", "loss", "grad"),
    [
        # -A * lp: 1 - 2 + 1 = 0; grad -A / 3
        ("vanilla", {}, 0.0, [-1 / 3, 1 / 3, -2 / 3]),
        # weights clip(r, 0, 1) = 1, 0.5, 1: -(−1 + 1 − 1) / 3
        ("tis", {}, 1 / 3, [-1 / 3, 0.5 / 3, -2 / 3]),
        # weights clip(r, 0.5, 2) = 2, 0.5, 1: -(−2 + 1 − 1) / 3
        ("tis", {"tis_lower_bound": 0.5, "tis_upper_bound": 2.0}, 2 / 3, [-2 / 3, 0.5 / 3, -2 / 3]),
        # weights clip(r, 0.9, 1.1) = 1.1, 0.9, 1: -(−1.1 + 1.8 − 1) / 3
        ("cispo", {}, 0.1, [-1.1 / 3, 0.9 / 3, -2 / 3]),
        # weights clip(r, 1 - 0.6, 1 + 0.5) = 1.5, 0.5, 1: -(−1.5 + 1 − 1) / 3
        (
            "cispo",
            {"cispo_epsilon_low": 0.6, "cispo_epsilon_high": 0.5},
            0.5,
            [-1.5 / 3, 0.5 / 3, -2 / 3],
        ),
        # unified mask: t0 (A > 0, r > 1.1) and t1 (A < 0, r < 0.9) give 0
        ("cispo", {"cispo_use_unified_mask": True}, 1 / 3, [0.0, 0.0, -2 / 3]),
        # max(-A r, -A clip(r, 0.8, 1.2)) = -1.2, 0.8, -2 (t0, t1 clipped: no gradient)
        ("ppo", {}, -0.8, [0.0, 0.0, -2 / 3]),
        # -A lp + tau/2 (ln r)^2 = (1 - 2 + 1) + 0.25 (ln 2)^2 * 2; grad (-A + tau ln r) / 3
        (
            "kimi15",
            {},
            LN2**2 / 6,
            [(-1 + 0.5 * LN2) / 3, (1 - 0.5 * LN2) / 3, -2 / 3],
        ),
    ],
)
def test_each_variant_by_hand(
    variant: str, knobs: dict[str, Any], loss: float, grad: list[float]
) -> None:
    got_loss, got_grad, metrics = run(variant, **knobs)
    assert_close(got_loss, torch.tensor(loss))
    assert_close(got_grad, torch.tensor([grad]))
    assert_close(metrics["pg_loss"], torch.tensor(loss))
    assert_close(metrics["ratio_max"], torch.tensor(2.0))
    assert_close(metrics["ratio_min"], torch.tensor(0.5))
    assert_close(metrics["ratio_mean"], torch.tensor(3.5 / 3))


def test_the_variants_metrics_by_hand() -> None:
    *_, tis = run("tis")
    assert_close(tis["tis_upper_clipfrac"], torch.tensor(1 / 3))  # r = 2 > 1
    assert_close(tis["tis_lower_clipfrac"], torch.tensor(0.0))
    assert_close(tis["tis_weight_mean"], torch.tensor(2.5 / 3))
    *_, cispo = run("cispo", cispo_use_unified_mask=True)
    assert_close(cispo["cispo_upper_clipfrac"], torch.tensor(1 / 3))
    assert_close(cispo["cispo_lower_clipfrac"], torch.tensor(1 / 3))
    assert_close(cispo["cispo_masked_frac"], torch.tensor(2 / 3))
    assert_close(cispo["cispo_weight_mean"], torch.tensor(1 / 3))  # 0, 0, 1
    *_, kimi = run("kimi15")
    assert_close(kimi["kimi15_reg"], torch.tensor(0.25 * LN2**2 * 2 / 3))


def test_topr_positive_samples_skip_the_ratio_negative_ones_are_tapered() -> None:
    # row 0 positive (score 1), row 1 negative (score 0), both with r = 2, 0.5 and A = 1, -1
    logprobs = torch.tensor([[-1.0, -2.0], [-1.0, -2.0]])
    old = logprobs - torch.tensor([[LN2, -LN2], [LN2, -LN2]])
    advantages = torch.tensor([[1.0, -1.0], [1.0, -1.0]])
    weights = {"topr_positive_weight": 0.5, "topr_negative_weight": 2.0}
    loss, grad, metrics = run(
        "topr", logprobs, old, advantages, torch.ones(2, 2), scores=torch.tensor([1.0, 0.0]),
        **weights,
    )  # fmt: skip
    # w: positive 0.5, 0.5 (no ratio); negative 2 * min(r, 1) = 2, 1; grad -w A / 4
    assert_close(grad, torch.tensor([[-0.125, 0.125], [-0.5, 0.25]]))
    # -w A lp: 0.5 - 1 + 2 - 2
    assert_close(loss, torch.tensor(-0.5 / 4))
    assert_close(metrics["topr_positive_frac"], torch.tensor(0.5))
    assert_close(metrics["topr_negative_clipfrac"], torch.tensor(0.25))  # row 1, r = 2
    # the sign of the score picks the branch, not the advantage's
    _, flipped, _ = run(
        "topr", logprobs, old, advantages, torch.ones(2, 2), scores=torch.tensor([0.0, 1.0]),
        **weights,
    )  # fmt: skip
    assert_close(flipped, torch.tensor([[-0.5, 0.25], [-0.125, 0.125]]))


def test_cispo_keeps_every_tokens_gradient_through_a_detached_clipped_weight() -> None:
    """PPO stops the gradient of a clipped token; CISPO only bounds its weight, and no
    gradient flows through the weight itself."""
    _, cispo, _ = run("cispo")
    _, ppo, _ = run("ppo", clip_ratio_low=0.1, clip_ratio_high=0.1)
    assert (cispo != 0).all()
    assert (ppo[0, :2] == 0).all()  # the same clip range: PPO drops both clipped tokens
    # if the weight carried a gradient, d/dlp of r * A * lp would add r * A * lp at r in range
    logprobs = torch.tensor([[-1.0]])
    _, inside, _ = run("cispo", logprobs, logprobs - 0.05, torch.tensor([[1.0]]), torch.ones(1, 1))
    assert_close(inside, torch.tensor([[-math.exp(0.05)]]))


@pytest.mark.parametrize("variant", list(PG_VARIANTS))
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_at_ratio_one_every_gradient_is_vanillas_times_its_weight(variant: str, mode: str) -> None:
    """On a fresh batch (old == new) all variants are REINFORCE, up to TOPR's weights."""
    generator = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(4, 6, generator=generator) * 3
    advantages = torch.randn(4, 6, generator=generator)
    mask = (torch.rand(4, 6, generator=generator) < 0.7).float()
    scores = torch.tensor([1.0, -1.0, 0.0, 2.0])
    args = (logprobs, logprobs, advantages, mask)
    common: dict[str, Any] = {"scores": scores, "loss_agg_mode": mode, "norm_length": 6}
    _, reference, _ = run("vanilla", *args, **common)
    weight = torch.ones(4, 1)
    knobs: dict[str, Any] = {}
    if variant == "topr":
        knobs = {"topr_positive_weight": 0.5, "topr_negative_weight": 3.0}
        weight = torch.where(scores[:, None] > 0, 0.5, 3.0)
    if variant == "opmd":  # -A * lp / (1 + tau), tau = 1
        weight = torch.full((4, 1), 0.5)
    _, grad, metrics = run(variant, *args, **{**knobs, **common})
    assert_close(grad, reference * weight)
    assert_close(metrics["ratio_mean"], torch.tensor(1.0))
    assert_close(metrics["approx_kl"], torch.tensor(0.0))


@pytest.mark.parametrize("variant", list(PG_VARIANTS))
def test_nothing_off_the_mask_reaches_the_loss_or_the_gradient(variant: str) -> None:
    logprobs = torch.tensor([[-1.0, NAN, -2.0], [NAN, NAN, NAN]])
    old = torch.tensor([[-1.5, NAN, -1.0], [NAN, 0.0, NAN]])
    advantages = torch.tensor([[1.0, NAN, -2.0], [NAN, NAN, NAN]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    for mode in LOSS_AGG_MODES:
        loss, grad, metrics = run(
            variant, logprobs, old, advantages, mask, scores=torch.tensor([1.0, 0.0]),
            loss_agg_mode=mode, norm_length=3,
        )  # fmt: skip
        assert torch.isfinite(loss)
        assert torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()
        assert all(torch.isfinite(value) for value in metrics.values())


@pytest.mark.parametrize("variant", list(PG_VARIANTS))
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_shares_add_up_to_the_mini_batch(variant: str, mode: str) -> None:
    generator = torch.Generator().manual_seed(1)
    logprobs = -torch.rand(6, 5, generator=generator) * 2
    old = logprobs + 0.5 * torch.randn(6, 5, generator=generator)
    advantages = torch.randn(6, 5, generator=generator)
    mask = (torch.rand(6, 5, generator=generator) < 0.6).float()
    mask[:, 0] = 1
    scores = torch.randn(6, generator=generator)
    counts = {"num_tokens": mask.sum(), "num_seqs": torch.tensor(6.0), "norm_length": 5}
    common = {"loss_agg_mode": mode, **counts}
    whole, _, _ = run(variant, logprobs, old, advantages, mask, scores=scores, **common)
    parts = [
        run(variant, logprobs[s], old[s], advantages[s], mask[s], scores=scores[s], **common)[0]
        for s in (slice(0, 2), slice(2, 6))
    ]
    assert_close(sum(parts), whole)


@pytest.mark.parametrize("variant", list(PG_VARIANTS))
def test_is_weights_and_sample_weights_scale_each_tokens_loss(variant: str) -> None:
    scores = torch.tensor([1.0])
    plain, plain_grad, _ = run(variant, scores=scores)
    # is_weights multiply after the variant (ROLL's train_infer_correction.is_weight)
    loss, grad, metrics = run(variant, scores=scores, is_weights=torch.full((1, 3), 2.0))
    assert_close((loss, grad), (2 * plain, 2 * plain_grad))
    assert_close(metrics["is_weight_mean"], torch.tensor(2.0))
    loss, grad, _ = run(variant, scores=scores, sample_weights=torch.tensor([0.5]))
    assert_close((loss, grad), (0.5 * plain, 0.5 * plain_grad))


def test_ppo_is_policy_loss() -> None:
    logprobs = LOGPROBS.clone().requires_grad_(True)
    expected, metrics = policy_loss(logprobs, OLD, ADVANTAGES, MASK, dual_clip=1.4)
    loss, got = PG_VARIANTS["ppo"](
        logprobs,
        OLD,
        ADVANTAGES,
        MASK,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        dual_clip_ratio_c=1.4,
    )
    assert_close(loss, expected)
    assert got.keys() == metrics.keys()


@pytest.mark.parametrize("variant", list(PG_VARIANTS))
def test_every_variant_reports_the_common_metrics_by_hand(variant: str) -> None:
    # ratios 2, 0.5, 1: log ratios ln 2, -ln 2, 0 average to 0; their mean is 3.5 / 3
    loss, _, metrics = run(variant)
    common = {
        "pg_loss": loss,
        "approx_kl": torch.tensor(0.0),
        "ratio_mean": torch.tensor(3.5 / 3),
        "ratio_min": torch.tensor(0.5),
        "ratio_max": torch.tensor(2.0),
    }
    assert_close({key: metrics[key] for key in common}, common)


def test_each_variant_takes_the_knobs_its_table_names_and_the_common_arguments() -> None:
    assert set(VariantArgs.__annotations__) == {
        "scores", "is_weights", "sample_weights", "loss_agg_mode", "norm_length", "num_tokens",
        "num_seqs",
    }  # fmt: skip
    for name, function in PG_VARIANTS.items():
        parameters = inspect.signature(function).parameters
        keyword = [p for p, v in parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]
        assert keyword == list(PG_VARIANT_KNOBS[name]), name
        assert all(parameters[k].default is inspect.Parameter.empty for k in keyword)
        assert list(parameters)[:4] == ["logprobs", "old_logprobs", "advantages", "mask"]
        assert parameters["args"].kind is inspect.Parameter.VAR_KEYWORD


@pytest.mark.parametrize(
    ("variant", "knobs", "match"),
    [
        ("tis", {"tis_lower_bound": 1.5, "tis_upper_bound": 1.0}, "0 <= tis_lower_bound <= "),
        ("tis", {"tis_lower_bound": -0.1}, "got -0.1 and 1.0"),
        ("topr", {"topr_negative_weight": -1.0}, "topr_negative_weight must be >= 0, got -1.0"),
        ("cispo", {"cispo_epsilon_high": -0.1}, "must be >= 0, got 0.1 and -0.1"),
        ("kimi15", {"kimi15_tau": -1.0}, "kimi15_tau must be >= 0, got -1.0"),
    ],
)
def test_a_bad_knob_is_named(variant: str, knobs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run(variant, **knobs)


def test_topr_needs_scores_and_shapes_must_match() -> None:
    with pytest.raises(ValueError, match="topr splits samples by their score: pass scores"):
        PG_VARIANTS["topr"](
            LOGPROBS, OLD, ADVANTAGES, MASK, topr_positive_weight=1.0, topr_negative_weight=1.0,
            topr_advantage_threshold=None,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"advantages must have the shape of logprobs \(1, 3\)"):
        run("cispo", advantages=torch.ones(1, 2))
