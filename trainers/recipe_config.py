"""The recipe's settings as small frozen dataclasses: the loss, the advantage and the
schedule, and :class:`GRPOConfig` that holds one of each.

The schema (:mod:`agentgym.schema`) declares each key, its default and its help;
:func:`agentgym.builders.recipe.grpo_config` fills each field here from the key of the
same name (the few that live in sections or are derived are named there), so a field
states only the trainer's type for it. Nothing here has a default of its own but
``async_generation_ratio`` and ``eval_on_startup``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from agentgym.trainers.correction import CorrectionConfig
from agentgym.trainers.strategies.batching import TokenBudget


@dataclass(frozen=True)
class LossConfig:
    """What the policy's and the critic's per-micro-batch losses compute
    (:mod:`~agentgym.trainers.objectives`)."""

    clip_ratio_low: float
    clip_ratio_high: float
    dual_clip_ratio_c: float | None
    loss_agg_mode: str
    loss_scale_factor: int
    use_kl_loss: bool
    kl_loss_coef: float
    kl_penalty: str
    """The KL estimator, of the loss term and of the token-level KL in the reward."""
    entropy_loss_coef: float
    sft_loss_coef: float
    rl_loss_coef: float
    use_topr_loss: bool
    length_loss_weight: bool
    difficulty_loss_weight: bool
    value_clip: float | None
    old_logprobs: str
    """Where the ratio's denominator comes from: ``engine`` or ``trainer``."""
    train_infer_correction: CorrectionConfig
    pg_variant: str
    """The policy loss: a key of :data:`~agentgym.trainers.pg_variants.PG_VARIANTS`; it
    reads the fields :data:`~agentgym.choices.PG_VARIANT_KNOBS` names."""
    topr_positive_weight: float
    topr_negative_weight: float
    topr_advantage_threshold: float | None
    """None: ``topr`` splits by each sample's score (ROLL); a number: by each token's
    advantage (Trinity-RFT's ``advantage_threshold``)."""
    tis_lower_bound: float
    tis_upper_bound: float
    cispo_epsilon_low: float
    cispo_epsilon_high: float
    cispo_use_unified_mask: bool
    kimi15_tau: float
    opmd_tau: float


@dataclass(frozen=True)
class AdvantageConfig:
    """How scores become rewards and rewards become advantages
    (:mod:`~agentgym.trainers.batch_prep`)."""

    adv_estimator: str
    gamma: float
    lambd: float
    whiten_advantages: bool
    advantage_clip: float | None
    reward_clip: float | None
    use_reward_scaling: bool
    use_reward_norm: bool
    reward_norm: str | None
    reward_shift: bool
    reward_scale: bool
    whiten_rewards: bool
    grouping: str
    normalization: str
    norm_mean_type: str | None
    """ROLL's ``reward_normalization.norm_mean_type`` (None: from ``normalization``)."""
    norm_std_type: str | None
    """ROLL's ``reward_normalization.norm_std_type`` (None: from ``normalization``)."""
    drop_zero_variance_groups: bool
    opmd_baseline: str
    """``adv_estimator: opmd``'s group baseline: ``mean`` or ``logavgexp``."""
    opmd_baseline_tau: float
    step_score: str
    step_advantage_weight: float
    step_gamma: float
    add_token_level_kl: bool
    init_kl_coef: float
    target_kl: float | None
    kl_horizon: int

    @property
    def processes_rewards(self) -> bool:
        """Whether the scores go through ROLL's reward processing (docs/rewards.md):
        with GAE, or any of ``use_reward_scaling``, ``reward_norm``, ``whiten_rewards``."""
        return (
            self.adv_estimator == "gae"
            or self.use_reward_scaling
            or self.reward_norm is not None
            or self.whiten_rewards
        )


@dataclass(frozen=True)
class ScheduleConfig:
    """When things happen and in what sizes: steps, mini-batches, validation,
    checkpoints, timeouts."""

    max_steps: int
    save_steps: int
    logging_steps: int
    eval_steps: int
    ppo_epochs: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    """Micro-batches per mini-batch, over all data-parallel replicas."""
    critic_warmup: int
    critic_micro_batch_size: int
    critic_gradient_accumulation_steps: int
    val_renders: int
    seed: int
    max_failed_fraction: float
    rpc_timeout: float
    train_token_budget: TokenBudget | None
    """``actor_train``'s dynamic batching of the update (None: ``micro_batch_size`` rows)."""
    logprobs_token_budget: TokenBudget | None
    """``actor_train``'s dynamic batching of π_old's forward passes (``old_logprobs=trainer``)."""
    reference_token_budget: TokenBudget | None
    """``reference``'s dynamic batching of its forward passes."""
    async_generation_ratio: float = 0.0
    """k > 0: rollout runs up to k steps ahead of training (docs/async.md)."""
    eval_on_startup: bool = True
    """Validate the starting weights (step 0) when ``eval_steps`` > 0."""


@dataclass(frozen=True)
class GRPOConfig:
    """The recipe's settings: one :class:`LossConfig`, one :class:`AdvantageConfig`
    and one :class:`ScheduleConfig`."""

    loss: LossConfig
    advantage: AdvantageConfig
    schedule: ScheduleConfig

    @property
    def needs_reference(self) -> bool:
        """Whether a frozen reference model is needed (a KL term is used)."""
        return self.loss.use_kl_loss or self.advantage.add_token_level_kl

    def with_values(self, **values: Any) -> GRPOConfig:
        """A copy with the named fields changed, each found in the sub-config that holds it
        (for Python users and tests: ``config.with_values(max_steps=3, kl_loss_coef=0.1)``).

        Raises:
            TypeError: On a name no sub-config has.
        """
        parts: dict[str, Any] = {"loss": self.loss, "advantage": self.advantage}
        parts["schedule"] = self.schedule
        changes: dict[str, dict[str, Any]] = {name: {} for name in parts}
        owners = {f.name: name for name, part in parts.items() for f in fields(part)}
        unknown = sorted(set(values) - set(owners))
        if unknown:
            raise TypeError(f"GRPOConfig has no field {unknown} (fields: {sorted(owners)})")
        for key, value in values.items():
            changes[owners[key]][key] = value
        return GRPOConfig(**{name: replace(part, **changes[name]) for name, part in parts.items()})
