"""The training roles' strategies: the policy (``actor_train``) and GAE's critic, in
this process or as rank groups on the cluster, with the settings each role's keys give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym.cluster import Cluster
from agentgym.schema import TrainConfig
from agentgym.trainers.ranks import StrategySpec, start_rank_group
from agentgym.trainers.strategies import Critic, Strategy
from agentgym.trainers.strategies.lora import lora_settings
from agentgym.trainers.strategies.optim import OptimizerConfig, optimizer_steps

_OPTIMIZER_KEYS = (
    "learning_rate",
    "weight_decay",
    "lr_scheduler_type",
    "warmup_steps",
    "warmup_ratio",
)
"""The :class:`OptimizerConfig` fields that ``training_args`` holds under the same names
(Adam's betas keep their default)."""


def _training_settings(config: TrainConfig, role_name: str, *, passes: int) -> dict[str, Any]:
    """What a training role (``actor_train``, ``critic``) gives its strategy: model,
    optimizer and schedule settings; ``passes`` over each rollout batch (``ppo_epochs``
    for the policy; ROLL's critic makes one) set the optimizer steps of the run."""
    role = getattr(config, role_name)
    args = role.training_args
    optimizer = OptimizerConfig(
        **{name: getattr(args, name) for name in _OPTIMIZER_KEYS},
        total_steps=optimizer_steps(
            max_steps=config.max_steps,
            rollout_batch_size=config.rollout_batch_size,
            ppo_epochs=passes,
            mini_batch_size=args.per_device_train_batch_size
            * args.gradient_accumulation_steps
            * config.data_parallel[role_name],
        ),
        max_grad_norm=config.max_grad_norm,
    )
    return {
        "dtype": role.model_args.dtype,
        "device": config.model.device,
        "gradient_checkpointing": not role.model_args.disable_gradient_checkpointing,
        "attn_implementation": role.model_args.attn_implementation,
        "optimizer": optimizer,
        "micro_batch_size": args.per_device_train_batch_size,
    }


def strategy_settings(config: TrainConfig, path: Path, *, needs_reference: bool) -> dict[str, Any]:
    """The ``actor_train`` role's settings for :func:`build_strategy` (every rank gets
    these); ``lora``: the adapter of ``model_args.lora_target`` (None: every weight trains)."""
    args = config.actor_train.model_args
    return {
        **_training_settings(config, "actor_train", passes=config.ppo_epochs),
        "temperature": config.actor_infer.generating_args.temperature,
        "reference_path": path if needs_reference else None,
        "lora": lora_settings(args.lora_target, args.lora_rank, args.lora_alpha),
    }


def policy_strategy(
    config: TrainConfig, path: Path, *, needs_reference: bool, cluster: Cluster | None = None
) -> Strategy:
    """The training strategy ``actor_train.strategy_args.strategy_name`` for ``path``:
    in this process (``distributed=local``), or a trainer worker group of one rank
    per ``actor_train.device_mapping`` device on ``cluster``."""
    settings = strategy_settings(config, path, needs_reference=needs_reference)
    name = str(config.actor_train.strategy_args.strategy_name)
    built: Strategy = _role_strategy(config, "actor_train", name, path, settings, cluster)
    return built


def critic_strategy(config: TrainConfig, path: Path, cluster: Cluster | None = None) -> Critic:
    """GAE's critic (``critic.strategy_args.strategy_name``, torch by default): the value
    model starts from ``critic.model_args.model_name_or_path`` or else the policy at
    ``path``, trains with ``critic.training_args``, on ``model.device`` in this process
    (``distributed=local``) or on a critic group of one rank per ``critic.device_mapping``
    device (default: ``actor_train``'s) on ``cluster``."""
    source = config.critic.model_args.model_name_or_path
    name = config.critic.strategy_args.strategy_name or "torch"
    settings = {**_training_settings(config, "critic", passes=1), "seed": config.seed}
    model_path = Path(source).expanduser() if source else path
    built: Critic = _role_strategy(config, "critic", name, model_path, settings, cluster)
    return built


def _role_strategy(
    config: TrainConfig,
    role_name: str,
    name: str,
    path: Path,
    settings: dict[str, Any],
    cluster: Cluster | None,
) -> Any:
    """A training role's strategy: built in this process (``distributed=local``), or one
    rank per device of the role's ``device_mapping`` on ``cluster``."""
    options = getattr(config, role_name).strategy_args.strategy_config
    spec = StrategySpec(role_name, name, path, options, settings)
    if cluster is None or cluster.kind == "local":
        return spec.build()
    workers = config.placement.workers[role_name]
    return start_rank_group(cluster, workers, spec, rpc_timeout=config.rpc_timeout)
