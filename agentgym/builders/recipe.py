"""The recipe's settings (:class:`~agentgym.trainers.recipe_config.GRPOConfig`) from
the checked schema: the schema declares each key, its default and its help; the
settings take it by name."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from agentgym.config_sections import Role
from agentgym.schema import TrainConfig
from agentgym.trainers.correction import correction_config
from agentgym.trainers.kl_control import KLController, make_kl_controller
from agentgym.trainers.recipe_config import AdvantageConfig, GRPOConfig, LossConfig, ScheduleConfig
from agentgym.trainers.strategies.batching import TokenBudget, token_budget


def grpo_config(config: TrainConfig) -> GRPOConfig:
    """The recipe's settings from the schema: each field is the schema's key of the
    same name, except the few that live in sections (``reward_normalization``,
    ``training_args``, ``validation``) or are derived, named here.

    Raises:
        AttributeError: When a field names no schema key and is not derived here (a
            key renamed on one side only; every test that builds a config finds it).
    """
    train_args, critic_args = config.actor_train.training_args, config.critic.training_args
    loss = _from_schema(
        LossConfig,
        config,
        dual_clip_ratio_c=config.dual_clip_c,
        loss_scale_factor=config.loss_scale_factor or config.sequence_length,
        train_infer_correction=correction_config(
            config.train_infer_correction, tis_cap=config.tis_cap
        ),
    )
    advantage = _from_schema(
        AdvantageConfig,
        config,
        grouping=config.reward_normalization.grouping,
        normalization=config.reward_normalization.method,
        norm_mean_type=config.reward_normalization.norm_mean_type,
        norm_std_type=config.reward_normalization.norm_std_type,
    )
    schedule = _from_schema(
        ScheduleConfig,
        config,
        eval_steps=0 if config.mode == "train" else config.eval_steps,  # explorers validate
        micro_batch_size=train_args.per_device_train_batch_size,
        # ROLL's mini-batch: per device × accumulation × data-parallel replicas; the
        # recipe counts micro-batches per mini-batch, dealt out to the replicas
        gradient_accumulation_steps=(
            train_args.gradient_accumulation_steps * config.data_parallel["actor_train"]
        ),
        critic_micro_batch_size=critic_args.per_device_train_batch_size,
        critic_gradient_accumulation_steps=(
            critic_args.gradient_accumulation_steps * config.data_parallel["critic"]
        ),
        val_renders=config.validation.renders,
        eval_on_startup=config.validation.on_startup,
        train_token_budget=_budget(config.actor_train, "train"),
        logprobs_token_budget=_budget(config.actor_train, "infer"),
        reference_token_budget=_budget(config.reference, "infer"),
    )
    return GRPOConfig(loss=loss, advantage=advantage, schedule=schedule)


_Settings = TypeVar("_Settings")


def _from_schema(settings: type[_Settings], config: TrainConfig, **derived: Any) -> _Settings:
    """``settings`` (a dataclass) with each field the schema's key of the same name,
    or its value in ``derived``."""
    values = {
        field.name: derived[field.name] if field.name in derived else getattr(config, field.name)
        for field in fields(settings)  # type: ignore[arg-type]
    }
    return settings(**values)


def _budget(role: Role, phase: str) -> TokenBudget | None:
    """A role's dynamic batching of its ``train`` or ``infer`` passes (ROLL's
    ``use_dynamic_batching_in_*`` keys)."""
    return token_budget(
        getattr(role, f"use_dynamic_batching_in_{phase}"),
        getattr(role, f"max_tokens_per_microbatch_in_{phase}"),
        getattr(role, f"sequence_length_round_in_{phase}"),
    )


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
