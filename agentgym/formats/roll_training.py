"""ROLL's training keys, read as agentgym's: the roles' sections (worker class,
model and data arguments, per-role environment variables, keys that only matter with a switch on)
and the loss and advantage keys (``pg_variant``, GiGPO's weights, π_old's source).

Part of the pure translation of :mod:`agentgym.formats.roll`: the same file gives
the same config on every machine; what has no meaning here is an error naming
the key and what to use instead.
"""

from __future__ import annotations

from typing import Any

from agentgym.choices import ROLL_PG_VARIANTS
from agentgym.errors import ConfigError, check_choice

PG_WORKER = "roll.pipeline.agentic.agentic_actor_pg_worker.ActorWorker"
"""ROLL's agentic actor whose loss ``actor_train.pg_variant`` picks."""

DEFAULT_WORKERS = ("roll.pipeline.base_worker.ActorWorker",)
"""``actor_train.worker_cls`` values that name ROLL's default actor (PPO-clip: ours)."""

PG_VARIANT_KEYS = (
    "topr_positive_weight",
    "topr_negative_weight",
    "tis_lower_bound",
    "tis_upper_bound",
    "cispo_epsilon_low",
    "cispo_epsilon_high",
    "cispo_use_unified_mask",
    "kimi15_tau",
)
"""The pg worker's knobs, read from ``actor_train`` in ROLL, top-level keys here (the
keyword arguments of :mod:`agentgym.trainers.pg_variants`)."""

ROLES = ("actor_train", "actor_infer", "critic", "reference")

COMPANIONS = {
    "use_dynamic_batching_in_train": (
        "max_tokens_per_microbatch_in_train",
        "sequence_length_round_in_train",
    ),
    "use_dynamic_batching_in_infer": (
        "max_tokens_per_microbatch_in_infer",
        "sequence_length_round_in_infer",
    ),
    "model_args.lora_target": ("model_args.lora_rank", "model_args.lora_alpha"),
}
"""Per-role switch -> the keys that only matter with it on (ROLL ignores them with the
switch off, and so does the translation, with a note; the schema would refuse them)."""

GIGPO_KEYS = ("episode_reward_weight", "step_reward_weight", "step_reward_gamma")
"""ROLL's GiGPO weights and step discount (read only with ``adv_estimator: gigpo``)."""


def gigpo(data: dict[str, Any], notes: list[str]) -> None:
    """``adv_estimator: gigpo`` is GRPO's episode advantage plus ``step_advantage_weight``
    times the anchor-state step advantage (``step_reward_weight``), discounted by
    ``step_gamma`` (``step_reward_gamma``), in step mode. ``batch_adjust_mode`` pads
    ROLL's step-mode batch to a multiple of the mini-batch; here every sample trains
    once, whatever their count, so it is dropped."""
    adjust = data.pop("batch_adjust_mode", None)
    if adjust is not None:
        notes.append(
            f"batch_adjust_mode={adjust} dropped: every sample trains once here, whatever "
            "their count (none copied or deleted)"
        )
    given = {key: data.pop(key) for key in GIGPO_KEYS if key in data}
    if data.get("adv_estimator") != "gigpo":
        if given:
            raise ConfigError(
                f"{sorted(given)} only apply with adv_estimator: gigpo (it is "
                f"{data.get('adv_estimator', 'grpo')!r}); drop them, or set adv_estimator: gigpo"
            )
        return
    episode = given.get("episode_reward_weight", 1.0)
    if episode != 1.0:
        raise ConfigError(
            f"episode_reward_weight={episode}: here GiGPO's episode term has weight 1 and "
            "step_advantage_weight weighs the step term; set episode_reward_weight: 1.0 and "
            "step_reward_weight to the ratio of the two (the learning rate takes the scale)"
        )
    step = given.get("step_reward_weight", 1.0)
    if data.setdefault("step_advantage_weight", step) != step:
        raise ConfigError(
            f"step_reward_weight={step} and step_advantage_weight="
            f"{data['step_advantage_weight']} are one key; set one of them"
        )
    data["adv_estimator"] = "grpo"
    moved = f"adv_estimator=gigpo → grpo with step_advantage_weight={step}"
    if "step_reward_gamma" in given:
        data["step_gamma"] = given["step_reward_gamma"]
        moved += f", step_gamma={given['step_reward_gamma']}"
    notes.append(moved + " (GiGPO's anchor-state step term)")


def _pg_worker(data: dict[str, Any], notes: list[str]) -> None:
    """``actor_train.worker_cls`` = ROLL's agentic pg worker: its ``pg_variant`` (ROLL's
    default there: vanilla) and knobs become top-level keys. Without it, ROLL's actor is
    PPO-clip and never reads them: setting them is an error here, not a no-op."""
    actor = data.get("actor_train")
    if not isinstance(actor, dict):
        return
    worker = actor.pop("worker_cls", None)
    knobs = {key: actor.pop(key) for key in ("pg_variant", *PG_VARIANT_KEYS) if key in actor}
    if worker is None or worker in DEFAULT_WORKERS:
        if knobs:
            raise ConfigError(
                f"actor_train sets {sorted(knobs)}, which only ROLL's pg worker reads: add "
                f"actor_train.worker_cls: {PG_WORKER} (ROLL's default actor is PPO-clip "
                "and ignores them), or drop them"
            )
        return
    if worker != PG_WORKER:
        raise ConfigError(
            f"actor_train.worker_cls={worker!r} has no counterpart here; known: "
            f"{[PG_WORKER, *DEFAULT_WORKERS]} (the pg worker's loss is picked by pg_variant)"
        )
    variant = knobs.pop("pg_variant", None) or "vanilla"
    data["pg_variant"] = check_choice("actor_train.pg_variant", variant, ROLL_PG_VARIANTS)
    data.update(knobs)
    moved = ", ".join(f"{key}={value}" for key, value in knobs.items())
    notes.append(
        f"actor_train.worker_cls=...agentic_actor_pg_worker.ActorWorker → pg_variant={variant}"
        + (f"; actor_train's {moved} → top-level keys" if moved else "")
    )


def _system_envs(data: dict[str, Any], notes: list[str]) -> None:
    """Per-role ``system_envs`` join the top-level ones: here one set of environment
    variables reaches every process (those of all roles)."""
    merged = dict(data.get("system_envs") or {})
    origin = dict.fromkeys(merged, "system_envs")
    for role in ROLES:
        section = data.get(role)
        own = section.pop("system_envs", None) if isinstance(section, dict) else None
        if not own:
            continue
        for key, value in own.items():
            if key in merged and str(merged[key]) != str(value):
                raise ConfigError(
                    f"{role}.system_envs.{key}={value!r}, but {origin[key]}.{key}="
                    f"{merged[key]!r}: here every process gets one set of system_envs; "
                    "make them agree"
                )
            merged[key], origin[key] = value, f"{role}.system_envs"
        notes.append(f"{role}.system_envs {sorted(own)} → system_envs (every process here)")
    if merged:
        data["system_envs"] = merged


def _old_logprobs(data: dict[str, Any], notes: list[str]) -> None:
    """``enable_old_logprobs_recompute: true`` is the trainer recomputing π_old:
    ``old_logprobs: trainer``. ROLL decides ``false`` itself from the batch sizes;
    here ``old_logprobs`` (default: the engine's) says it."""
    if "enable_old_logprobs_recompute" not in data:
        return
    recompute = data.pop("enable_old_logprobs_recompute")
    if not recompute:
        notes.append(
            "enable_old_logprobs_recompute=false dropped: old_logprobs says where π_old comes from"
        )
        return
    if data.setdefault("old_logprobs", "trainer") != "trainer":
        raise ConfigError(
            f"enable_old_logprobs_recompute=true is old_logprobs=trainer, but old_logprobs="
            f"{data['old_logprobs']!r}: set one of them"
        )
    notes.append("enable_old_logprobs_recompute=true → old_logprobs=trainer")


def _rollout_mock(data: dict[str, Any], notes: list[str]) -> None:
    """ROLL's ``rollout_mock`` (``enable``, ``mode: dump | mock``, ``dump_dir``): the same
    keys here (:mod:`agentgym.rollout.dump`); off, it is dropped."""
    mock = data.get("rollout_mock")
    if not mock:
        data.pop("rollout_mock", None)
        return
    if not mock.get("enable"):
        data.pop("rollout_mock")
        notes.append("rollout_mock dropped: enable=false")
        return
    notes.append(
        f"rollout_mock: mode={mock.get('mode', 'dump')}, dump_dir={mock.get('dump_dir')} "
        "(each step's batch written, or a dump replayed)"
    )


def _companions(data: dict[str, Any], notes: list[str]) -> None:
    for role in ROLES:
        section = data.get(role)
        if not isinstance(section, dict):
            continue
        for switch, keys in COMPANIONS.items():
            if _get_path(section, switch):
                continue
            for key in keys:
                value = _pop_path(section, key)
                if value is not None:
                    notes.append(
                        f"{role}.{key}={value} dropped: ROLL reads it only with {switch} on"
                    )


LORA_KEYS = ("lora_target", "lora_rank", "lora_alpha")
"""ROLL's LoRA keys of a role's ``model_args`` (:mod:`agentgym.trainers.strategies.lora`)."""


def _lora(data: dict[str, Any], notes: list[str]) -> None:
    """``actor_train.model_args``' LoRA keys stay (the schema reads them, ROLL's
    ``lora_alpha`` default of 2 × ``lora_rank`` included). ROLL repeats them under
    ``actor_infer`` for vLLM's LoRA path; here the engines get the adapter merged into
    the weights, so with actor_train's adapter set they are dropped."""
    trains = (data.get("actor_train") or {}).get("model_args") or {}
    model_args = (data.get("actor_infer") or {}).get("model_args")
    if not trains.get("lora_target") or not isinstance(model_args, dict):
        return
    given = sorted(key for key in LORA_KEYS if model_args.pop(key, None) is not None)
    if given:
        notes.append(
            f"actor_infer.model_args {given} dropped: the engines get actor_train's adapter "
            "merged into the weights (every backend serves them), not the adapter"
        )


def _get_path(section: dict[str, Any], path: str) -> Any:
    head, _, rest = path.partition(".")
    inner = section.get(head)
    if not rest:
        return inner
    return _get_path(inner, rest) if isinstance(inner, dict) else None


def _pop_path(section: dict[str, Any], path: str) -> Any:
    head, _, rest = path.partition(".")
    if not rest:
        return section.pop(head, None)
    inner = section.get(head)
    return _pop_path(inner, rest) if isinstance(inner, dict) else None


def _roles(data: dict[str, Any], notes: list[str]) -> None:
    for name in ("actor_train", "actor_infer", "critic", "reference"):
        role = data.get(name)
        if not isinstance(role, dict):
            continue
        model_args = role.get("model_args") or {}
        if model_args.get("model_type", None) is not None:
            raise ConfigError(
                f"{name}.model_args.model_type={model_args['model_type']!r}: the model type "
                "comes from the model folder's config.json"
            )
        model_args.pop("model_type", None)
        if "flash_attn" in model_args:  # dacite drops keys ModelArguments does not declare
            notes.append(
                f"{name}.model_args.flash_attn={model_args.pop('flash_attn')} dropped: ROLL's "
                "ModelArguments has no such key and ignores it (attn_implementation picks)"
            )
        if model_args.get("attn_implementation") == "fa2":
            model_args["attn_implementation"] = "flash_attention_2"
            notes.append(f"{name}.model_args.attn_implementation=fa2 → flash_attention_2")
        template = (role.get("data_args") or {}).pop("template", None)
        if template is not None:
            notes.append(
                f"{name}.data_args.template={template} dropped: the tokenizer's chat "
                "template renders the conversation"
            )
        if role.get("infer_batch_size") is not None:
            notes.append(
                f"{name}.infer_batch_size dropped: inference micro-batches are "
                "per_device_train_batch_size"
            )
            role.pop("infer_batch_size")
        strategy = role.get("strategy_args")
        if isinstance(strategy, dict) and strategy.get("strategy_config", {}) is None:
            strategy["strategy_config"] = {}
        if isinstance(strategy, dict):
            _strategy_grad_norm(data, name, strategy.get("strategy_config") or {}, notes)
            _fusions(name, strategy.get("strategy_config") or {}, notes)
        if name == "reference" and isinstance(strategy, dict) and strategy.get("strategy_name"):
            _reference_strategy(data, strategy["strategy_name"], notes)


def _reference_strategy(data: dict[str, Any], name: str, notes: list[str]) -> None:
    """ROLL's reference is a forward-only worker of its own (``hf_infer``,
    ``megatron_infer``, ``fsdp2_infer``: the training strategies' inference halves);
    here the reference model lives in actor_train's ranks and runs forward passes on
    actor_train's strategy (``megatron_infer`` beside ``megatron_train`` is that: a
    Megatron model, forward only, on the policy's parallel layout)."""
    trainer = ((data.get("actor_train") or {}).get("strategy_args") or {}).get("strategy_name")
    notes.append(
        f"reference.strategy_args.strategy_name={name}: the reference runs forward passes in "
        f"actor_train's ranks on its strategy ({trainer or 'torch'})"
    )


FUSIONS = ("bias_activation_fusion", "apply_rope_fusion")
"""Megatron's fused kernels (bias + activation, rotary embedding): the same math as the
unfused path that agentgym's Megatron strategy runs."""


def _fusions(name: str, strategy_config: dict[str, Any], notes: list[str]) -> None:
    fused = {key: strategy_config.pop(key) for key in FUSIONS if key in strategy_config}
    if fused:
        notes.append(
            f"{name}.strategy_args.strategy_config {sorted(fused)} dropped: fused kernels of "
            "the same math; agentgym's Megatron strategy runs the unfused path"
        )


def _strategy_grad_norm(
    data: dict[str, Any], name: str, strategy_config: dict[str, Any], notes: list[str]
) -> None:
    """ROLL's Megatron files repeat ``max_grad_norm: ${max_grad_norm}`` in the
    ``strategy_config``; here the top-level key is the one clip for every strategy."""
    if "max_grad_norm" not in strategy_config:
        return
    value = strategy_config.pop("max_grad_norm")
    top = data.get("max_grad_norm")
    if top is not None and value != top:
        raise ConfigError(
            f"{name}.strategy_args.strategy_config.max_grad_norm={value} differs from "
            f"max_grad_norm={top}; the top-level max_grad_norm is the one gradient clip here: "
            "set it and drop the strategy_config key"
        )
    data["max_grad_norm"] = value
    notes.append(
        f"{name}.strategy_args.strategy_config.max_grad_norm={value} → max_grad_norm (one clip)"
    )


def training_keys(data: dict[str, Any], notes: list[str]) -> None:
    """Translate the roles' sections and the loss keys of ``data`` in place, adding a
    note for each key mapped or dropped (GiGPO's keys: :func:`gigpo`, called first).

    Raises:
        ConfigError: On an ``actor_train.worker_cls`` with no counterpart, pg worker keys
            without it, per-role ``system_envs`` that set one variable two ways,
            ``rollout_mock`` enabled, or a model type or gradient clip that contradicts
            the rest.
    """
    _pg_worker(data, notes)
    _system_envs(data, notes)
    _old_logprobs(data, notes)
    _rollout_mock(data, notes)
    _companions(data, notes)
    _lora(data, notes)
    _roles(data, notes)
