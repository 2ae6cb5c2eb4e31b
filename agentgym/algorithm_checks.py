"""The checks of the algorithm's keys that span several (run by
:func:`agentgym.config_checks.check_relations`): the estimator with its keys, OPMD,
and ROLL's ``pg_variant`` with the knobs each variant reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgym.choices import CRITIC_STRATEGY_NAMES, PG_VARIANT_KNOBS, check_reward_options
from agentgym.errors import ConfigError, check_choice

if TYPE_CHECKING:
    from agentgym.schema import TrainConfig


def check_algorithm(config: TrainConfig) -> None:
    """Keys of issue 19 that only make sense together (each message names the fix)."""
    if config.dual_clip_loss:
        if config.clip_ratio_low != config.clip_ratio_high:
            raise ConfigError(
                f"dual_clip_loss=true bounds the loss at (1 + 2 × pg_clip) × |A| (ROLL), which "
                f"needs one clip: clip_ratio_low={config.clip_ratio_low} != clip_ratio_high="
                f"{config.clip_ratio_high}; make them equal, or set dual_clip_ratio_c instead"
            )
        if config.dual_clip_ratio_c not in (None, config.dual_clip_c):
            raise ConfigError(
                f"dual_clip_loss=true means dual-clip with c = 1 + 2 × {config.clip_ratio_low} "
                f"= {config.dual_clip_c} (ROLL), but dual_clip_ratio_c="
                f"{config.dual_clip_ratio_c}: set one of them"
            )
    try:
        check_reward_options(
            use_reward_scaling=config.use_reward_scaling,
            use_reward_norm=config.use_reward_norm,
            reward_norm=config.reward_norm,
            reward_shift=config.reward_shift,
            reward_scale=config.reward_scale,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    method = config.reward_normalization.method
    if config.reward_norm is not None and method != "identity":
        raise ConfigError(
            f"reward_norm={config.reward_norm!r} normalizes the scores, and so does "
            f"reward_normalization.method={method!r}: set reward_normalization.method=identity "
            "(docs/rewards.md: how the reward keys compose)"
        )
    if config.whiten_rewards and config.adv_estimator in ("grpo", "opmd", "step_reinforce"):
        raise ConfigError(
            f"whiten_rewards whitens the token-level rewards, which adv_estimator="
            f"{config.adv_estimator} does not read (it spreads the normalized score): use "
            "adv_estimator=reinforce or gae, or whiten_advantages"
        )
    check_opmd(config)
    check_step_reinforce(config)
    if config.use_topr_loss and not config.sft_loss_coef:
        raise ConfigError(
            "use_topr_loss adds TOPR's tapered term for negative samples to the sft_loss_coef "
            "term (ROLL): set sft_loss_coef > 0 (with rl_loss_coef=0 for pure TOPR)"
        )
    check_pg_variant(config)
    if config.target_kl is not None and not config.add_token_level_kl:
        raise ConfigError(
            f"target_kl={config.target_kl} adapts the coefficient of the token-level KL "
            "penalty: set add_token_level_kl=true (or target_kl=null)"
        )
    gae = config.adv_estimator == "gae"
    for key in ("critic_warmup", "value_clip"):
        if not gae and getattr(config, key):
            raise ConfigError(
                f"{key}={getattr(config, key)} applies to the critic, which only "
                "adv_estimator=gae trains: set adv_estimator=gae"
            )
    if gae:
        name = config.critic.strategy_args.strategy_name or "torch"
        check_choice("critic.strategy_args.strategy_name", name, CRITIC_STRATEGY_NAMES)


def check_step_reinforce(config: TrainConfig) -> None:
    """``adv_estimator=step_reinforce`` (ROLL's) trains one sample per step, judged by
    its discounted return: it needs ``rollout_mode=step`` and ``step_score=return``, and
    no GiGPO step term beside it (ROLL adds that term only for ``gigpo``)."""
    if config.adv_estimator != "step_reinforce":
        return
    wanted = {"rollout_mode": "step", "step_score": "return", "step_advantage_weight": 0.0}
    wrong = {key: getattr(config, key) for key, value in wanted.items()}
    wrong = {key: value for key, value in wrong.items() if value != wanted[key]}
    if wrong:
        given = ", ".join(f"{key}={value!r}" for key, value in wrong.items())
        fix = " ".join(f"{key}={wanted[key]}" for key in wrong)
        raise ConfigError(
            "adv_estimator=step_reinforce trains one sample per step, judged by its "
            f"discounted return (step_gamma), with no GiGPO step term; {given}: set {fix}"
        )


def check_opmd(config: TrainConfig) -> None:
    """``adv_estimator=opmd`` subtracts its own group baseline from the raw scores, so
    ``reward_normalization.method`` must be ``identity``; its keys are read by it only."""
    fields = type(config).model_fields
    if config.adv_estimator != "opmd":
        for key in ("opmd_baseline", "opmd_baseline_tau"):
            value = getattr(config, key)
            if value != fields[key].default:
                raise ConfigError(
                    f"{key}={value} is read by adv_estimator=opmd only, but adv_estimator="
                    f"{config.adv_estimator}: drop {key}, or set adv_estimator=opmd"
                )
        return
    method = config.reward_normalization.method
    if method != "identity":
        raise ConfigError(
            f"adv_estimator=opmd subtracts its group baseline (opmd_baseline="
            f"{config.opmd_baseline}) from the scores, and reward_normalization.method="
            f"{method!r} would normalize them first: set reward_normalization.method=identity"
        )


def check_pg_variant(config: TrainConfig) -> None:
    """``pg_variant`` and its knobs (:data:`~agentgym.choices.PG_VARIANT_KNOBS`): each knob
    is read by its own variant only, so one set away from its default under another
    variant would change nothing, which is refused rather than ignored."""
    if config.tis_lower_bound > config.tis_upper_bound:
        raise ConfigError(
            f"tis_lower_bound={config.tis_lower_bound} > tis_upper_bound="
            f"{config.tis_upper_bound}: tis weighs each token by its ratio clipped to "
            "[tis_lower_bound, tis_upper_bound]; swap them"
        )
    variant = config.pg_variant
    fields = type(config).model_fields
    for owner, knobs in PG_VARIANT_KNOBS.items():
        # ppo's dual-clip bound has two keys: dual_clip_ratio_c, or ROLL's dual_clip_loss
        keys = [*knobs, *(["dual_clip_loss"] if owner == "ppo" else [])]
        for key in keys:
            value = getattr(config, key)
            if owner != variant and value != fields[key].default:
                raise ConfigError(
                    f"{key}={value} is read by pg_variant={owner} only, but pg_variant="
                    f"{variant}: drop {key}, or set pg_variant={owner}"
                )
    if variant == "topr" and config.use_topr_loss:
        raise ConfigError(
            "pg_variant=topr makes TOPR the policy loss, and use_topr_loss adds TOPR's tapered "
            "term to the sft_loss_coef term of another policy loss: set one of them "
            "(use_topr_loss=false with pg_variant=topr)"
        )
    if (
        variant == "topr"
        and config.topr_advantage_threshold is None
        and config.rollout_mode == "step"
        and config.step_score == "turn"
    ):
        raise ConfigError(
            "pg_variant=topr splits the samples by their episode's score (> 0: positive, as "
            "ROLL's get_episode_scores), but with rollout_mode=step and step_score=turn a "
            "sample's score is its turn's reward: set step_score=episode"
        )
