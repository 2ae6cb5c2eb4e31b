"""The names a config may choose from, in one leaf module.

The schema (:mod:`agentgym.schema`) checks a config against these names, and the
modules that implement each choice hold their tables under the same names (a
test keeps each table's keys equal to its tuple here), so validating a config
imports neither torch nor any trainer.
"""

from __future__ import annotations

from agentgym.errors import check_choice

SAMPLE_MODES = ("trajectory", "step")
"""``rollout_mode``: one sample per episode with the full history, or one per turn."""

AGENT_KINDS = ("env", "proxy", "native")
"""``agent.kind``: who plays the episodes: the env manager's own loop, an agent
through the OpenAI-compatible proxy (:mod:`agentgym.proxy`), or the env itself, which
owns the conversation and hands the model each prompt (``native``, ROLL's
``AgentNativeStepEnvManager``: :mod:`agentgym.proxy.native`)."""

STEP_SCORES = ("turn", "episode", "return")
"""What a ``step``-mode sample is judged by: its turn's reward, its episode's score, or
its discounted return from its turn to the episode's end (``step_gamma``; ROLL's
``step_reinforce``)."""

GROUPINGS = ("state", "batch", "inductive")
"""``reward_normalization.grouping``: samples of the same GRPO group (same env and
seed), the whole batch, or samples of the same env tag."""

NORMALIZATIONS = ("identity", "mean", "mean_std", "asym_clip")
"""``reward_normalization.method``: the score; minus the group mean; (score - mean) /
(unbiased std + 1e-6); mean_std clamped to [-1, 3]."""

ADVANTAGE_ESTIMATORS = ("grpo", "reinforce", "gae", "opmd", "step_reinforce")
"""``adv_estimator``: the built-in estimators (``gae`` with the critic; ``opmd``:
Trinity-RFT's OPMD, the score minus its group's ``opmd_baseline``; ``step_reinforce``:
ROLL's, each step sample judged by its normalized discounted return)."""

NORM_SCOPES = ("group", "batch")
"""``reward_normalization.norm_mean_type`` / ``norm_std_type`` (ROLL's): take the mean
(or the std) over the sample's group, or over the whole batch."""

OPMD_BASELINES = ("mean", "logavgexp")
"""``opmd_baseline``: the group's mean score, or ``tau * log(mean(exp(score / tau)))``
(Trinity-RFT's ``advantage_fn_args.opmd_baseline``)."""

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
"""``loss_agg_mode``: how token losses become the mini-batch's loss."""

KL_PENALTIES = ("kl", "abs", "mse", "low_var_kl", "full")
"""``kl_penalty``: the KL estimator (``k1``, ``k2``, ``k3`` are accepted aliases)."""

ROLL_PG_VARIANTS = ("vanilla", "ppo", "tis", "topr", "cispo", "kimi15")
"""ROLL's ``pg_variant`` values (its ``agentic_actor_pg_worker``)."""

PG_VARIANTS = (*ROLL_PG_VARIANTS, "opmd")
"""``pg_variant``: ROLL's agentic policy losses (``agentic_actor_pg_worker``) and
Trinity-RFT's ``opmd``."""

PG_VARIANT_KNOBS: dict[str, tuple[str, ...]] = {
    "vanilla": (),
    "ppo": ("clip_ratio_low", "clip_ratio_high", "dual_clip_ratio_c"),
    "tis": ("tis_lower_bound", "tis_upper_bound"),
    "topr": ("topr_positive_weight", "topr_negative_weight", "topr_advantage_threshold"),
    "cispo": ("cispo_epsilon_low", "cispo_epsilon_high", "cispo_use_unified_mask"),
    "kimi15": ("kimi15_tau",),
    "opmd": ("opmd_tau",),
}
"""The keyword arguments each variant of :mod:`agentgym.trainers.pg_variants` requires
besides the common ones, named as the config keys that set them (``dual_clip_ratio_c``:
the recipe's value, which is ROLL's ``1 + 2 * pg_clip`` with ``dual_clip_loss``); the
config check refuses a knob set under another variant."""

WEIGHT_TYPES = ("token", "segment", "geometric", "sequence")
"""ROLL's granularities of the ratio π_prox/μ (``weight_type``, ``agg_type``)."""

REWARD_NORMS = ("batch", "group", "running")
"""``reward_norm``: the batch's mean and std, the GRPO group's, or running ones."""

LR_SCHEDULER_TYPES = ("constant", "constant_with_warmup", "linear", "cosine")
"""``lr_scheduler_type``: transformers' schedules (with ROLL's warmup rule)."""

STRATEGY_NAMES = ("torch", "megatron_train", "fsdp2_train")
"""``actor_train.strategy_args.strategy_name``: the training strategies built."""

CRITIC_STRATEGY_NAMES = ("torch",)
"""``critic.strategy_args.strategy_name``: the critic strategies built."""

UNSUPPORTED_STRATEGIES = {
    "deepspeed_train": (
        "deepspeed_train (DeepSpeed ZeRO) is not supported; use strategy_name: fsdp2_train "
        "with the strategy_config of your ZeRO stage: stage 3 -> full sharding (fsdp_size: 1, "
        "or the number of ranks; reshard_after_forward: true); stage 2 -> "
        "reshard_after_forward: false; offload_optimizer / offload_param -> "
        "offload_policy: true (docs/fsdp2.md)"
    ),
    "hf_infer": "hf_infer is an inference strategy (actor_infer); train with strategy_name: torch",
}
"""ROLL's other strategy names, with what to use instead."""


LORA_STRATEGY_NAMES = ("torch",)
"""Strategies that train a LoRA adapter (``actor_train.model_args.lora_target``)."""

ALL_LINEAR = "all-linear"
"""The ``lora_target`` entry for every linear layer but the output layer (ROLL's and
peft's ``all-linear``)."""

UNBUILT_LORA_TARGETS = {
    "all-embedding": "LoRA on embeddings is not built (the merged export of a tied "
    "embedding would change the output layer too)",
    "all-router": "LoRA on MoE routers is not built (no MoE model trains here)",
}
"""ROLL's other ``lora_target`` shorthands, with why they are refused."""

LORA_REGEX_CHARACTERS = ("*", "$", "|", "(")
"""A ``lora_target`` string with one of these is a regular expression (ROLL's rule),
matched against whole module names; otherwise a comma-separated list of names."""


def parse_lora_target(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...] | str:
    """ROLL's ``lora_target``: a regular expression (a string with any of
    :data:`LORA_REGEX_CHARACTERS`) as it is, else the names of a comma-separated
    string or a list.

    Raises:
        ValueError: On no name, a bad regular expression, or a shorthand of
            :data:`UNBUILT_LORA_TARGETS`.
    """
    import re

    if isinstance(value, str) and any(char in value for char in LORA_REGEX_CHARACTERS):
        try:
            re.compile(value)
        except re.error as error:
            raise ValueError(
                f"lora_target={value!r} is not a regular expression: {error}"
            ) from None
        return value
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(dict.fromkeys(str(item).strip() for item in items if str(item).strip()))
    if not names:
        raise ValueError(
            f"lora_target={value!r} names no module; give module names (q_proj,v_proj), "
            f"{ALL_LINEAR!r}, or a regular expression"
        )
    for name in names:
        if name in UNBUILT_LORA_TARGETS:
            raise ValueError(
                f"lora_target={value!r}: {name!r}: {UNBUILT_LORA_TARGETS[name]}; use "
                f"{ALL_LINEAR!r} or module names"
            )
    return names


MODES = ("both", "explore", "train", "serve", "bench")
"""``mode`` (Trinity-RFT's key): one process that explores and trains, the explorer's
or the trainer's half of a decoupled job (docs/explorer_trainer.md), an explorer that
serves the OpenAI API to agents started by someone else (docs/agents.md), or the
evaluation of a finished run's checkpoints (docs/bench.md)."""

UNBUILT_MODES = {
    "colocate": "mode=colocate is not built; use mode=both (explorer and trainer in one process)",
}
"""Trinity-RFT's other modes, with what to use instead."""

BUFFER_STORAGE = ("sql", "queue", "file")
"""``buffer.storage_type``: the experience buffer's storage: a SQLite file (WAL mode) that
every process opens, one that the job's Ray actor serves (no shared filesystem), or
``sql`` plus a JSONL copy of every group stored (``file``, for inspection)."""

UNBUILT_BUFFER_STORAGE: dict[str, str] = {}
"""Trinity-RFT's other storage types, with what to use instead (none left)."""

SYNC_METHODS = ("checkpoint", "memory", "nccl")
"""``synchronizer.sync_method``: how explorers get the trainer's weights: versioned
folders in the job folder, the job's Ray actor (no shared filesystem), or from the
trainer's GPU to each explorer's over a process group per transfer."""

UNBUILT_SYNC_METHODS: dict[str, str] = {}
"""Trinity-RFT's other sync methods, with what to use instead."""


def check_reward_options(
    *,
    use_reward_scaling: bool = False,
    use_reward_norm: bool = False,
    reward_norm: str | None = None,
    reward_shift: bool = False,
    reward_scale: bool = False,
) -> None:
    """Raise when ROLL's reward keys are set inconsistently (the config check uses it too).

    Raises:
        ValueError: On ``use_reward_norm`` without ``use_reward_scaling``, an unknown
            ``reward_norm``, ``reward_shift``/``reward_scale`` without ``reward_norm`` or
            both of them, or both ``use_reward_scaling`` and ``reward_norm='running'``
            (two spellings of one running normalization).
    """
    if use_reward_norm and not use_reward_scaling:
        raise ValueError(
            "use_reward_norm only applies with use_reward_scaling=True (as in ROLL); "
            "set both, or use reward_norm='running'"
        )
    if (reward_shift or reward_scale) and reward_norm is None:
        raise ValueError(
            "reward_shift and reward_scale choose how reward_norm normalizes; "
            f"set reward_norm to one of {list(REWARD_NORMS)}"
        )
    if reward_norm is not None:
        check_choice("reward_norm", reward_norm, REWARD_NORMS)
    if reward_shift and reward_scale:
        raise ValueError(
            "reward_shift (only subtract the mean) and reward_scale (only divide by the std) "
            "exclude each other; set neither for both"
        )
    if use_reward_scaling and reward_norm == "running":
        raise ValueError(
            "use_reward_scaling and reward_norm='running' both normalize by the running "
            "moments; set one of them"
        )
