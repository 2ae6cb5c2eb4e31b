"""The keys of Trinity-RFT's config files read here, by section: any other is an error
that names it (with the close match for a misspelling). :mod:`agentgym.formats.trinity`
translates what they say.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

TASKSET_KEYS = (
    "name", "storage_type", "path", "subset_name", "split", "format", "rollout_args",
    "default_workflow_type",
)  # fmt: skip
"""A task set's keys (Trinity's ``StorageConfig``) read here."""

ENGINE_OPTIONS = ("enable_prefix_caching", "gpu_memory_utilization", "enforce_eager")
"""``explorer.rollout_model``'s vLLM engine arguments, passed on as ROLL's
``actor_infer.strategy_args.strategy_config`` (the engine's vLLM arguments)."""

TRAINER_TYPES = ("verl",)
"""Trinity's ``trainer.trainer_type`` values: verl's FSDP trainer, whose role the
strategy (``actor_train.strategy_args``) plays here."""

KEYS: dict[str, tuple[str, ...]] = {
    "": (
        "project", "name", "mode", "checkpoint_root_dir", "continue_from_checkpoint",
        "algorithm", "model", "cluster", "buffer", "explorer", "synchronizer", "trainer",
    ),
    "algorithm": (
        "algorithm_type", "repeat_times", "optimizer", "policy_loss_fn", "policy_loss_fn_args",
        "advantage_fn_args", "kl_loss_fn", "kl_loss_fn_args",
    ),
    "algorithm.kl_loss_fn_args": ("kl_coef",),
    "algorithm.optimizer": ("lr",),
    "model": ("model_path", "max_model_len", "max_response_tokens", "max_prompt_tokens"),
    "cluster": ("node_num", "gpu_per_node"),
    "buffer": ("total_epochs", "batch_size", "train_batch_size", "explorer_input", "trainer_input"),
    "buffer.explorer_input": ("taskset", "eval_tasksets", "default_workflow_type"),
    "buffer.explorer_input.taskset": TASKSET_KEYS,
    "buffer.explorer_input.taskset.rollout_args": ("temperature",),
    "buffer.explorer_input.eval_tasksets": (*TASKSET_KEYS, "repeat_times"),
    "buffer.explorer_input.eval_tasksets.rollout_args": ("temperature",),
    "buffer.trainer_input": ("experience_buffer",),
    "buffer.trainer_input.experience_buffer": ("name", "storage_type", "path"),
    "explorer": (
        "name", "runner_per_model", "rollout_model", "bench_on_latest_checkpoint",
        "eval_interval", "eval_on_startup", "proxy_port", "listen_address", "max_timeout",
    ),
    "explorer.rollout_model": (
        "engine_num", "tensor_parallel_size", *ENGINE_OPTIONS, "dtype", "seed",
    ),
    "synchronizer": ("sync_method", "sync_interval", "sync_offset", "sync_style", "sync_timeout"),
    "trainer": (
        "grad_clip", "use_dynamic_bsz", "max_token_len_per_gpu", "ulysses_sequence_parallel_size",
        "save_interval", "trainer_type",
    ),
}  # fmt: skip
"""Every Trinity key read here, by section; any other is an error naming it."""


def check_keys(raw: Mapping[str, Any], section: str, shown: str | None = None) -> None:
    """Every key of ``raw`` (the file's ``section``, written ``shown`` in errors) is
    one of :data:`KEYS`; a task set's ``format`` is checked when the task set is read."""
    known = KEYS[section]
    shown = section if shown is None else shown
    for key, value in raw.items():
        path = f"{section}.{key}" if section else key
        where = f"{shown}.{key}" if shown else key
        if key not in known:
            raise ConfigError(
                f"Trinity key {where!r} has no counterpart here.{did_you_mean(key, known)} "
                f"(read: {', '.join(known)})"
            )
        if path in KEYS and isinstance(value, Mapping):
            check_keys(value, path, where)
        elif path in KEYS and isinstance(value, list):  # eval_tasksets: a list of task sets
            for index, item in enumerate(value):
                if not isinstance(item, Mapping):
                    raise ConfigError(f"Trinity's {where}[{index}] must be a mapping, got {item!r}")
                check_keys(item, path, f"{where}[{index}]")
