"""The recipe's settings (:class:`~agentgym.trainers.recipe_config.GRPOConfig`) from
the checked schema, every field named by code, so that a rename fails in mypy."""

from __future__ import annotations

from typing import Any

from agentgym.derived import data_parallel_size, dual_clip_c
from agentgym.schema import TrainConfig
from agentgym.trainers.correction import correction_config
from agentgym.trainers.kl_control import KLController, make_kl_controller
from agentgym.trainers.recipe_config import AdvantageConfig, GRPOConfig, LossConfig, ScheduleConfig
from agentgym.trainers.strategies.batching import token_budget


def grpo_config(config: TrainConfig) -> GRPOConfig:
    """The recipe's settings from the schema, every field named (a rename fails in mypy):
    mostly top-level keys of the same names, plus the few that live in sections
    (``reward_normalization``, ``training_args``) or are derived."""
    train_args, critic_args = config.actor_train.training_args, config.critic.training_args
    loss = LossConfig(
        clip_ratio_low=config.clip_ratio_low,
        clip_ratio_high=config.clip_ratio_high,
        dual_clip_ratio_c=dual_clip_c(config),
        loss_agg_mode=config.loss_agg_mode,
        loss_scale_factor=config.loss_scale_factor or config.sequence_length,
        use_kl_loss=config.use_kl_loss,
        kl_loss_coef=config.kl_loss_coef,
        kl_penalty=config.kl_penalty,
        entropy_loss_coef=config.entropy_loss_coef,
        sft_loss_coef=config.sft_loss_coef,
        rl_loss_coef=config.rl_loss_coef,
        use_topr_loss=config.use_topr_loss,
        length_loss_weight=config.length_loss_weight,
        difficulty_loss_weight=config.difficulty_loss_weight,
        value_clip=config.value_clip,
        old_logprobs=config.old_logprobs,
        train_infer_correction=correction_config(
            config.train_infer_correction, tis_cap=config.tis_cap
        ),
        pg_variant=config.pg_variant,
        topr_positive_weight=config.topr_positive_weight,
        topr_negative_weight=config.topr_negative_weight,
        topr_advantage_threshold=config.topr_advantage_threshold,
        tis_lower_bound=config.tis_lower_bound,
        tis_upper_bound=config.tis_upper_bound,
        cispo_epsilon_low=config.cispo_epsilon_low,
        cispo_epsilon_high=config.cispo_epsilon_high,
        cispo_use_unified_mask=config.cispo_use_unified_mask,
        kimi15_tau=config.kimi15_tau,
        opmd_tau=config.opmd_tau,
    )
    advantage = AdvantageConfig(
        adv_estimator=config.adv_estimator,
        gamma=config.gamma,
        lambd=config.lambd,
        whiten_advantages=config.whiten_advantages,
        advantage_clip=config.advantage_clip,
        reward_clip=config.reward_clip,
        use_reward_scaling=config.use_reward_scaling,
        use_reward_norm=config.use_reward_norm,
        reward_norm=config.reward_norm,
        reward_shift=config.reward_shift,
        reward_scale=config.reward_scale,
        whiten_rewards=config.whiten_rewards,
        grouping=config.reward_normalization.grouping,
        normalization=config.reward_normalization.method,
        drop_zero_variance_groups=config.drop_zero_variance_groups,
        opmd_baseline=config.opmd_baseline,
        opmd_baseline_tau=config.opmd_baseline_tau,
        step_score=config.step_score,
        step_advantage_weight=config.step_advantage_weight,
        step_gamma=config.step_gamma,
        add_token_level_kl=config.add_token_level_kl,
        init_kl_coef=config.init_kl_coef,
        target_kl=config.target_kl,
        kl_horizon=config.kl_horizon,
    )
    schedule = ScheduleConfig(
        max_steps=config.max_steps,
        save_steps=config.save_steps,
        logging_steps=config.logging_steps,
        eval_steps=0 if config.mode == "train" else config.eval_steps,  # explorers validate
        ppo_epochs=config.ppo_epochs,
        micro_batch_size=train_args.per_device_train_batch_size,
        # ROLL's mini-batch: per device × accumulation × data-parallel replicas; the
        # recipe counts micro-batches per mini-batch, dealt out to the replicas
        gradient_accumulation_steps=(
            train_args.gradient_accumulation_steps * data_parallel_size(config)
        ),
        critic_warmup=config.critic_warmup,
        critic_micro_batch_size=critic_args.per_device_train_batch_size,
        critic_gradient_accumulation_steps=(
            critic_args.gradient_accumulation_steps * data_parallel_size(config, "critic")
        ),
        val_renders=config.validation.renders,
        eval_on_startup=config.validation.on_startup,
        seed=config.seed,
        max_failed_fraction=config.max_failed_fraction,
        rpc_timeout=config.rpc_timeout,
        train_token_budget=token_budget(
            config.actor_train.use_dynamic_batching_in_train,
            config.actor_train.max_tokens_per_microbatch_in_train,
            config.actor_train.sequence_length_round_in_train,
        ),
        logprobs_token_budget=token_budget(
            config.actor_train.use_dynamic_batching_in_infer,
            config.actor_train.max_tokens_per_microbatch_in_infer,
            config.actor_train.sequence_length_round_in_infer,
        ),
        reference_token_budget=token_budget(
            config.reference.use_dynamic_batching_in_infer,
            config.reference.max_tokens_per_microbatch_in_infer,
            config.reference.sequence_length_round_in_infer,
        ),
        async_generation_ratio=config.async_generation_ratio,
    )
    return GRPOConfig(loss=loss, advantage=advantage, schedule=schedule)


def default_grpo_config(**overrides: Any) -> GRPOConfig:
    """The recipe's settings at the schema's defaults (those of ``python -m
    agentgym.train``), with ``overrides`` by field name (:meth:`GRPOConfig.with_values`):
    what a Python user starts from."""
    return grpo_config(TrainConfig()).with_values(**overrides)


def kl_controller(config: GRPOConfig) -> KLController:
    """The coefficient of ``add_token_level_kl``: adaptive with ``target_kl`` (over
    ``kl_horizon`` samples), else fixed at ``init_kl_coef`` (ROLL's ``get_kl_controller``)."""
    return make_kl_controller(
        config.advantage.init_kl_coef,
        target_kl=config.advantage.target_kl,
        kl_horizon=config.advantage.kl_horizon if config.advantage.target_kl is not None else None,
    )
