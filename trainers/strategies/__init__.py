"""Training strategies, picked by ROLL's ``actor_train.strategy_args.strategy_name``.

Each entry of :data:`STRATEGIES` builds a :class:`Strategy` from the role's
settings plus the ``strategy_config`` mapping passed through unchanged, so a
strategy's own options never need a key in the recipe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentgym.choices import UNSUPPORTED_STRATEGIES
from agentgym.trainers.strategies.base import (
    Critic,
    LossFunction,
    LossInputs,
    Metric,
    MetricReducer,
    ModelOutputs,
    Strategy,
    ValueLossFunction,
    micro_batches,
)

__all__ = [
    "CRITIC_STRATEGIES",
    "STRATEGIES",
    "UNSUPPORTED_STRATEGIES",
    "Critic",
    "LossFunction",
    "LossInputs",
    "Metric",
    "MetricReducer",
    "ModelOutputs",
    "Strategy",
    "ValueLossFunction",
    "build_critic",
    "build_strategy",
    "micro_batches",
]


def _torch(model_path: Path, strategy_config: Mapping[str, Any], **settings: Any) -> Strategy:
    from agentgym.trainers.strategies.torch_strategy import TorchStrategy

    return TorchStrategy(model_path, **settings, **strategy_config)


def _megatron(model_path: Path, strategy_config: Mapping[str, Any], **settings: Any) -> Strategy:
    from agentgym.trainers.strategies.megatron import build_megatron

    return build_megatron(model_path, strategy_config, **settings)


def _fsdp2(model_path: Path, strategy_config: Mapping[str, Any], **settings: Any) -> Strategy:
    from agentgym.trainers.strategies.fsdp2 import build_fsdp2

    return build_fsdp2(model_path, strategy_config, **settings)


STRATEGIES: dict[str, Callable[..., Strategy]] = {
    "torch": _torch,
    "megatron_train": _megatron,
    "fsdp2_train": _fsdp2,
}
"""``strategy_name`` -> builder ``(model_path, strategy_config, **role settings)``."""


def _torch_critic(model_path: Path, strategy_config: Mapping[str, Any], **settings: Any) -> Critic:
    from agentgym.trainers.strategies.torch_critic import TorchCritic

    return TorchCritic(model_path, **settings, **strategy_config)


CRITIC_STRATEGIES: dict[str, Callable[..., Critic]] = {"torch": _torch_critic}
"""``critic.strategy_args.strategy_name`` -> builder, as :data:`STRATEGIES`."""


def build_strategy(
    name: str, model_path: Path, strategy_config: Mapping[str, Any], **settings: Any
) -> Strategy:
    """Build the strategy ``name`` for ``model_path``.

    Args:
        name: A key of :data:`STRATEGIES`.
        model_path: The policy's Hugging Face folder.
        strategy_config: ROLL's ``strategy_args.strategy_config``: passed to the builder.
        **settings: The role's settings (dtype, learning rate, temperature, ...).

    Raises:
        ValueError: On an unknown or unsupported name (with what to use instead).
    """
    from agentgym.errors import unknown_choice

    if name in UNSUPPORTED_STRATEGIES:
        raise ValueError(f"strategy_name={name!r}: {UNSUPPORTED_STRATEGIES[name]}")
    if name not in STRATEGIES:
        raise unknown_choice("actor_train.strategy_args.strategy_name", name, list(STRATEGIES))
    return STRATEGIES[name](model_path, strategy_config, **settings)


def build_critic(
    name: str, model_path: Path, strategy_config: Mapping[str, Any], **settings: Any
) -> Critic:
    """Build the critic strategy ``name`` (GAE's value model) from ``model_path``.

    Args:
        name: A key of :data:`CRITIC_STRATEGIES`.
        model_path: The policy's folder (the value model starts from its body).
        strategy_config: ROLL's ``critic.strategy_args.strategy_config``: passed to the builder.
        **settings: The role's settings (dtype, learning rate, ...).

    Raises:
        ValueError: On an unknown name (with the valid ones).
    """
    from agentgym.errors import unknown_choice

    if name not in CRITIC_STRATEGIES:
        raise unknown_choice("critic.strategy_args.strategy_name", name, list(CRITIC_STRATEGIES))
    return CRITIC_STRATEGIES[name](model_path, strategy_config, **settings)
