"""The checks of a config that span keys (:func:`agentgym.schema.validate` runs them after
each key's own type and range): ROLL keys not implemented yet, relations between
keys, the placement on the cluster, and what only training needs.
"""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import (
    BaseModel,
)

from agentgym.algorithm_checks import check_algorithm
from agentgym.choices import (
    BUFFER_STORAGE,
    LORA_STRATEGY_NAMES,
    MODES,
    STRATEGY_NAMES,
    SYNC_METHODS,
    UNBUILT_BUFFER_STORAGE,
    UNBUILT_MODES,
    UNBUILT_SYNC_METHODS,
    UNSUPPORTED_STRATEGIES,
    parse_lora_target,
)
from agentgym.cluster import device_type
from agentgym.config_sections import DataArgs, Role
from agentgym.errors import ConfigError, check_choice
from agentgym.rollout.backends import BACKENDS, check_backend

if TYPE_CHECKING:
    from agentgym.schema import TrainConfig


# Keys known from ROLL, not implemented yet ---------------------------------------------

_RAY = "roles are sized by device_mapping (one rank per device; num_gpus_per_worker per engine)"
NOT_YET: dict[str, str] = {
    "local_rank": "it is set by a launcher; agentgym runs one process",
    "add_len_reward": "ROLL declares add_len_reward but no version of its code reads it, so "
    "there is no behaviour to reproduce; shape rewards in the env instead",
    "l2": "ROLL declares l2 ('L2 regularization') but no version of its code reads it; "
    "use actor_train.training_args.weight_decay (or critic.training_args.weight_decay)",
    "prompt_length": "multi-turn rollouts bound prompt + responses with sequence_length",
    "response_length": "use generation.max_new_tokens (per turn) and sequence_length",
    "checkpoint_config": "checkpoints go to output_dir/checkpoints",
    "reward_pretrain": "reward models are not supported; envs give the rewards",
    "train_env_manager.worker_cls": "env workers in their own processes come with Ray",
    "val_env_manager.worker_cls": "env workers in their own processes come with Ray",
    "train_infer_correction.is_weight.detach": "the weights never carry a gradient "
    "(importance weights change the measure, not the objective)",
}
for _role in ("actor_train", "actor_infer", "critic", "reference"):
    NOT_YET |= {
        f"{_role}.data_args.{key}": "agentic runs take prompts from envs and the chat "
        "template from the tokenizer"
        for key in DataArgs.model_fields
    }
    NOT_YET |= {f"{_role}.{key}": _RAY for key in ("world_size", "infer_batch_size")}
    if _role != "actor_infer":
        NOT_YET[f"{_role}.num_gpus_per_worker"] = (
            "devices per worker apply to actor_infer's engines; a trainer rank has one device"
        )
    NOT_YET[f"{_role}.model_update_frequency"] = "weights sync after every step"
    NOT_YET[f"{_role}.generating_args.num_beams"] = "beam search is not supported in RL rollouts"
    NOT_YET[f"{_role}.generating_args.num_return_sequences"] = (
        "use train_env_manager.group_size for several samples of one state"
    )


def _get(config: BaseModel, path: str) -> Any:
    value: Any = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def check_not_yet(config: TrainConfig) -> None:
    defaults = type(config)()
    for key, message in NOT_YET.items():
        path, _, bad = key.partition("=")
        value = _get(config, path)
        if (str(value) == bad) if bad else (value != _get(defaults, path)):
            raise ConfigError(f"{path}={value!r} is not supported yet: {message}")


def check_training(config: TrainConfig) -> None:
    manager = config.train_env_manager
    per_step = manager.env_groups * manager.group_size * manager.max_traj_per_env
    if config.rollout_batch_size != per_step:
        raise ConfigError(
            f"rollout_batch_size={config.rollout_batch_size} must equal train_env_manager "
            f"env_groups × group_size × max_traj_per_env = {manager.env_groups} × "
            f"{manager.group_size} × {manager.max_traj_per_env} = {per_step}"
        )
    args = config.actor_train.training_args
    replicas = config.data_parallel["actor_train"]
    minibatch = args.per_device_train_batch_size * args.gradient_accumulation_steps * replicas
    if config.rollout_mode == "trajectory" and config.rollout_batch_size % minibatch:
        raise ConfigError(
            f"rollout_batch_size={config.rollout_batch_size} is not divisible by the mini-batch "
            f"per_device_train_batch_size × gradient_accumulation_steps × data-parallel "
            f"replicas = {args.per_device_train_batch_size} × "
            f"{args.gradient_accumulation_steps} × {replicas} = {minibatch}"
        )
    if config.step_advantage_weight and config.rollout_mode != "step":
        raise ConfigError(
            f"step_advantage_weight={config.step_advantage_weight} (GiGPO) needs one sample per "
            f"turn: set rollout_mode=step (it is {config.rollout_mode!r})"
        )
    correction = config.train_infer_correction
    if correction.is_weight.enabled and config.tis_cap is not None:
        raise ConfigError(
            f"tis_cap={config.tis_cap} is token importance weights truncated at it, and so is "
            "train_infer_correction.is_weight: set one of them (is_weight.upper_bound is the cap)"
        )
    for index, rule in enumerate(correction.filters):
        if rule.ratio_low > rule.ratio_high or rule.diff_low > rule.diff_high:
            raise ConfigError(
                f"train_infer_correction.filters[{index}] keeps nothing: ratio_low="
                f"{rule.ratio_low} > ratio_high={rule.ratio_high} or diff_low={rule.diff_low} "
                f"> diff_high={rule.diff_high}; swap the bounds"
            )
    corrects = correction.is_weight.enabled or any(rule.enabled for rule in correction.filters)
    if corrects and config.old_logprobs != "trainer":
        raise ConfigError(
            "train_infer_correction weighs and filters by π_old/π_engine, which needs π_old "
            "recomputed by the trainer: set old_logprobs=trainer (it is "
            f"{config.old_logprobs!r}: the engine's logprobs are π_old, the bypass mode)"
        )
    if config.tis_cap is not None and config.old_logprobs != "trainer":
        raise ConfigError(
            f"tis_cap={config.tis_cap} reweights by the trainer/engine logprob gap, which needs "
            f"π_old recomputed by the trainer: set old_logprobs=trainer "
            f"(it is {config.old_logprobs!r})"
        )
    check_dynamic_batching(config)


DYNAMIC_BATCHING = {
    ("actor_train", "train"): "",
    ("actor_train", "infer"): "",
    ("reference", "infer"): "",
    ("reference", "train"): "the reference is never trained",
    ("actor_infer", "train"): "actor_infer generates and is never trained",
    ("actor_infer", "infer"): "the generation engine batches its requests itself (ROLL's "
    "agentic pipeline reads dynamic batching for actor_train and reference only)",
    ("critic", "train"): "the critic trains on micro-batches of per_device_train_batch_size "
    "rows (ROLL's agentic pipeline batches only actor_train and reference by tokens)",
    ("critic", "infer"): "the critic values micro-batches of per_device_train_batch_size rows "
    "(ROLL's agentic pipeline batches only actor_train and reference by tokens)",
}
"""Each role's phase -> "" where dynamic batching applies, else why not."""


def check_dynamic_batching(config: TrainConfig) -> None:
    """ROLL's ``use_dynamic_batching_in_{train,infer}`` with ``max_tokens_per_microbatch_*``
    and ``sequence_length_round_*``, per role (:data:`DYNAMIC_BATCHING`): a budget that
    holds the longest sample, and no companion key set without its switch."""
    fields = Role.model_fields
    for (role_name, phase), why_not in DYNAMIC_BATCHING.items():
        role = getattr(config, role_name)
        switch = f"use_dynamic_batching_in_{phase}"
        keys = [
            switch,
            f"max_tokens_per_microbatch_in_{phase}",
            f"sequence_length_round_in_{phase}",
        ]
        changed = [key for key in keys if getattr(role, key) != fields[key].default]
        if why_not and changed:
            raise ConfigError(
                f"{role_name}.{changed[0]}={getattr(role, changed[0])!r}: dynamic batching does "
                f"not apply to {role_name} ({why_not}); drop {role_name}'s {phase} keys"
            )
        if not getattr(role, switch):
            if changed:
                raise ConfigError(
                    f"{role_name}.{changed[0]}={getattr(role, changed[0])!r} applies only with "
                    f"{role_name}.{switch}=true; set it, or drop {changed[0]}"
                )
            continue
        budget = getattr(role, keys[1]) or 0
        step = getattr(role, keys[2])
        longest = -(-config.sequence_length // step) * step
        if budget < longest:
            raise ConfigError(
                f"{role_name}.{keys[1]}={budget or None} cannot hold a sample of sequence_length="
                f"{config.sequence_length} tokens ({longest} once rounded up to a multiple of "
                f"{keys[2]}={step}): "
                f"set it to at least {longest} (ROLL recommends sequence_length × 2 × "
                "per_device_train_batch_size)"
            )


def check_scheduling(config: TrainConfig) -> None:
    if config.is_use_additional_prompts and not config.max_additional_running_prompts:
        raise ConfigError(
            "is_use_additional_prompts=true starts max_additional_running_prompts extra groups "
            "beyond the batch, but max_additional_running_prompts=0: set it >= 1"
        )
    if config.generate_opt_level == 0 and config.async_generation_ratio > 0:
        raise ConfigError(  # ROLL asserts the same
            f"generate_opt_level=0 (lockstep batches) cannot run ahead of the trainer: a "
            f"lockstep turn waits for a request from every env, and ahead of training an env "
            f"waits for the staleness bound to admit its next episode, so the turn would never "
            f"be complete; async_generation_ratio={config.async_generation_ratio} needs "
            f"generate_opt_level=1"
        )
    if config.is_use_additional_prompts and config.async_generation_ratio > 0:
        raise ConfigError(
            "is_use_additional_prompts=true cannot run ahead of the trainer: extra groups "
            "close a step's batch with the groups that finish first, while "
            f"async_generation_ratio={config.async_generation_ratio} hands out batches in the "
            "order their episodes were admitted, which is what bounds every sample's "
            "staleness; use one of the two"
        )
    if config.partial_rollout and not config.async_generation_ratio:
        raise ConfigError(
            f"partial_rollout={config.partial_rollout} continues turns across the weight syncs "
            "that happen while episodes are generated, which needs async_generation_ratio > 0 "
            "(at 0, generation has stopped before each sync); set partial_rollout=0"
        )


def check_decoupled(config: TrainConfig) -> None:
    """``mode``, ``buffer`` and ``synchronizer``: built names, or what to use instead."""
    for key, value, built, unbuilt in (
        ("mode", config.mode, MODES, UNBUILT_MODES),
        ("buffer.storage_type", config.buffer.storage_type, BUFFER_STORAGE, UNBUILT_BUFFER_STORAGE),
        (
            "synchronizer.sync_method",
            config.synchronizer.sync_method,
            SYNC_METHODS,
            UNBUILT_SYNC_METHODS,
        ),
    ):
        if value in unbuilt:
            raise ConfigError(unbuilt[value])
        if value not in built:
            close = difflib.get_close_matches(str(value), [*built, *unbuilt], n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}={value!r} is not one of {[*built, *unbuilt]}.{hint}")
    if config.synchronizer.sync_method == "nccl":
        import torch  # only for nccl: the schema's import stays without torch

        from agentgym.job.collective_weights import collective_backend  # imports torch

        try:
            backend = collective_backend()
        except ValueError as error:
            raise ConfigError(str(error)) from error
        if backend == "nccl" and not torch.cuda.is_available():
            raise ConfigError(
                "synchronizer.sync_method=nccl needs GPUs (torch sees no CUDA device); use "
                "checkpoint (a shared filesystem) or memory (a Ray cluster)"
            )
        trains_here = config.mode == "train" and config.distributed == "local"
        if backend == "nccl" and config.mode == "train" and not trains_here:
            raise ConfigError(
                "synchronizer.sync_method=nccl sends from the trainer's GPU in its own process: "
                "with distributed=ray its ranks' weights reach the driver on the host, which "
                "NCCL cannot send; use distributed=local, or sync_method checkpoint or memory"
            )
        from agentgym.trainers.ranks import group_backend  # imports torch

        device = {"device": device_type(config.model.device)}
        name = str(config.actor_train.strategy_args.strategy_name)
        on_gpu = group_backend(name, device) == "nccl"
        if backend == "nccl" and trains_here and not on_gpu:
            raise ConfigError(
                f"synchronizer.sync_method=nccl sends the trainer's weights from its GPU, but "
                f"model.device={config.model.device!r}: set model.device=cuda, or use "
                "sync_method checkpoint or memory"
            )
    if config.mode in ("explore", "serve") and config.is_use_additional_prompts:
        raise ConfigError(
            f"mode={config.mode} writes every complete group to the buffer: "
            "is_use_additional_prompts (cancelling the slowest groups of a step) does not "
            "apply; unset it"
        )
    if config.async_generation_ratio and config.mode in ("explore", "serve", "train"):
        conflict = config.sync_schedule.conflict(config.async_generation_ratio)
        if conflict:
            raise ConfigError(conflict)


TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "swanlab": "swanlab"}
"""The module each hosted or file tracker needs (its extra has the same name)."""


def check_trackers(config: TrainConfig) -> None:
    """Each tracker of ``track_with`` is installed, or a config error names its extra."""
    missing = [
        name
        for name in config.track_with
        if name in TRACKER_MODULES and importlib.util.find_spec(TRACKER_MODULES[name]) is None
    ]
    if missing:
        extras = ",".join(missing)
        raise ConfigError(
            f"track_with={list(config.track_with)}: {', '.join(missing)} not installed here; "
            f"pip install 'agentgym[{extras}]' (or agentgym[trackers] for all three), or "
            "drop it from track_with"
        )


def check_relations(config: TrainConfig) -> None:
    check_scheduling(config)
    check_decoupled(config)
    val = config.val_env_manager
    if val.env_groups * val.group_size != config.val_batch_size:
        raise ConfigError(
            f"val_batch_size={config.val_batch_size} must equal val_env_manager env_groups × "
            f"group_size = {val.env_groups} × {val.group_size}"
        )
    budget = config.actor_infer.generating_args.max_new_tokens
    if budget >= config.sequence_length:
        raise ConfigError(
            f"actor_infer.generating_args.max_new_tokens={budget} leaves no room for a prompt "
            f"in sequence_length={config.sequence_length}"
        )
    check_algorithm(config)
    if config.pretrain and not (Path(config.pretrain).expanduser() / "config.json").is_file():
        # named as given: model.path (which pretrain defaults to), or ROLL's pretrain
        key = "model.path" if config.model.path == config.pretrain else "pretrain"
        raise ConfigError(
            f"{key}={config.pretrain!r} is not a model folder (no config.json); "
            "models are loaded from local folders, never downloaded"
        )
    name = config.actor_train.strategy_args.strategy_name
    if name in UNSUPPORTED_STRATEGIES:
        raise ConfigError(
            f"actor_train.strategy_args.strategy_name={name!r}: {UNSUPPORTED_STRATEGIES[name]}"
        )
    if name not in STRATEGY_NAMES:
        check_choice("actor_train.strategy_args.strategy_name", str(name), STRATEGY_NAMES)
    check_lora(config)
    check_trackers(config)
    backend = config.actor_infer.strategy_args.strategy_name
    check_choice("actor_infer.strategy_args.strategy_name", str(backend), BACKENDS)
    try:
        check_backend(str(backend), config.generation.base_url)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_lora(config: TrainConfig) -> None:
    """LoRA (``model_args.lora_target``) trains ``actor_train``'s policy on the torch
    strategy; ``lora_rank`` and ``lora_alpha`` apply only with it."""
    for role in ("actor_train", "actor_infer", "critic", "reference"):
        args = getattr(config, role).model_args
        if args.lora_target is None:
            given = {"lora_alpha": args.lora_alpha} if args.lora_alpha is not None else {}
            if args.lora_rank != type(args)().lora_rank:
                given["lora_rank"] = args.lora_rank
            if given:
                raise ConfigError(
                    f"{role}.model_args sets {given} without lora_target: they apply only to "
                    f"a LoRA adapter; set {role}.model_args.lora_target or drop them"
                )
        elif role != "actor_train":
            raise ConfigError(
                f"{role}.model_args.lora_target={args.lora_target!r}: LoRA trains "
                "actor_train's policy (the engines get its merged weights, the reference is "
                "its base); set actor_train.model_args.lora_target and drop this one"
            )
    args = config.actor_train.model_args
    if args.lora_target is None:
        return
    try:
        parse_lora_target(args.lora_target)
    except ValueError as error:
        raise ConfigError(f"actor_train.model_args.{error}") from None
    name = str(config.actor_train.strategy_args.strategy_name)
    if name not in LORA_STRATEGY_NAMES:
        raise ConfigError(
            f"actor_train.model_args.lora_target={args.lora_target!r} with strategy_name="
            f"{name!r}: LoRA is built on the torch strategy only; set actor_train."
            "strategy_args.strategy_name: torch (one process per device, data parallel over "
            "Ray ranks), or drop model_args.lora_target to fine-tune every weight"
        )


def check_placement(config: TrainConfig) -> None:
    reference = config.reference.device_mapping
    mappings = config.device_mappings
    if reference and reference != mappings["actor_train"]:
        raise ConfigError(
            f"reference.device_mapping={reference}: the reference model lives in the "
            f"actor_train ranks (device_mapping={mappings['actor_train']}); leave it null "
            "or give the same list"
        )
    plan = config.placement
    if config.distributed == "local":
        sizes = {role: plan.world_size(role) for role in ("actor_train", "actor_infer")}
        if config.num_nodes != 1 or any(size != 1 for size in sizes.values()):
            raise ConfigError(
                f"distributed=local runs one trainer rank and one engine in this process, but "
                f"num_nodes={config.num_nodes}, actor_train has {sizes['actor_train']} rank(s) "
                f"and actor_infer {sizes['actor_infer']} engine(s): set distributed=ray"
            )
    if (
        config.distributed == "ray"
        and config.num_gpus_per_node
        and device_type(config.model.device) != "cuda"
    ):
        raise ConfigError(
            f"num_gpus_per_node={config.num_gpus_per_node} places the roles on GPUs, but "
            f"model.device={config.model.device!r} would train and generate on the CPU beside "
            "them: set model.device=cuda (each rank's and engine's own GPU)"
        )
