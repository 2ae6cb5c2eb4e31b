"""The training config's schema: every key, its type, its range and its default.

``configs/config.yaml`` (with its groups) is what Hydra composes; this schema
validates the composed config before anything is built, so a bad value fails
in seconds naming the key, the value, the valid range or options, and a close
match for a misspelled key. It is the single source of the defaults: the
shipped YAML is tested to agree with it, and the recipe's dataclasses are
built from it (:mod:`agentgym.builders`).

Keys follow ROLL's configuration guide. Keys that ROLL has and agentgym does
not implement yet are recognized: their neutral value is accepted, any other
value is rejected with what to use instead (:data:`NOT_YET`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    model_validator,
)

from agentgym.choices import (
    ADVANTAGE_ESTIMATORS,
    CRITIC_STRATEGY_NAMES,
    GROUPINGS,
    KL_PENALTIES,
    LOSS_AGG_MODES,
    LR_SCHEDULER_TYPES,
    NORMALIZATIONS,
    REWARD_NORMS,
    SAMPLE_MODES,
    STEP_SCORES,
    STRATEGY_NAMES,
    UNSUPPORTED_STRATEGIES,
    WEIGHT_TYPES,
    check_reward_options,
)
from agentgym.cluster import DISTRIBUTED, plan_placement
from agentgym.errors import ConfigError, check_choice, did_you_mean
from agentgym.models.tiny import TinyModelSpec
from agentgym.models.warmstart import WarmStartSpec
from agentgym.rollout.backends import BACKENDS, check_backend
from agentgym.rollout.chat import PREFIX_CHECK_MODES
from agentgym.trainers.tracking import TRACKERS

OLD_LOGPROBS = ("engine", "trainer")
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # ROLL's spellings


def _choice(key: str, options: Sequence[str]) -> Callable[[str], str]:
    def check(value: str) -> str:
        return check_choice(key, value, options)

    return check


def Choice(key: str, options: Sequence[str]) -> Any:  # noqa: N802 (a type factory)
    """A string that must be one of ``options`` (the error names a close match)."""
    return Annotated[str, AfterValidator(_choice(key, options))]


Bool = Annotated[bool, Strict()]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Probability = Annotated[float, Field(ge=0, le=1)]


def _dtype(value: Any) -> Any:
    return DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value


Dtype = Annotated[str, BeforeValidator(_dtype), AfterValidator(_choice("dtype", DTYPES))]


def _device_mapping(value: Any) -> Any:
    # ROLL writes device_mapping as a Python expression: "list(range(0,8))"
    if isinstance(value, str):
        tree = ast.parse(value, mode="eval").body
        if (
            isinstance(tree, ast.Call)
            and isinstance(tree.func, ast.Name)
            and tree.func.id == "list"
            and len(tree.args) == 1
            and isinstance(tree.args[0], ast.Call)
            and isinstance(tree.args[0].func, ast.Name)
            and tree.args[0].func.id == "range"
        ):
            return list(range(*(ast.literal_eval(arg) for arg in tree.args[0].args)))
        return ast.literal_eval(value)
    return value


class Section(BaseModel):
    """A config section: unknown keys are errors (with a close match)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)


# Groups -------------------------------------------------------------------------------


class EnvWarmStart(Section):
    """``env.warm_start``: the tiny default model's warm start for this env, read by
    ``model.warm_start``'s keys of the same names (None: the model group's value)."""

    envs: dict[str, dict[str, Any]] | None = None
    steps: NonNegativeInt | None = None
    batch_size: PositiveInt | None = None


class EnvGroup(Section):
    """``env/``: what to play, and the budgets that fit it.

    The budgets are read by the top-level keys of the same names
    (``max_new_tokens`` by ``generation.max_new_tokens``) and by ``model.warm_start``
    (``warm_start``: whose experts demonstrate, for how many steps); None leaves
    those keys at their defaults, and a key given on the command line wins over
    the env's value.
    """

    name: str = "sokoban"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    max_new_tokens: PositiveInt | None = None
    sequence_length: PositiveInt | None = None
    max_turns: PositiveInt | None = None
    history_length: NonNegativeInt | None = None
    warm_start: EnvWarmStart = EnvWarmStart()
    instructions: str | None = None


class ModelGroup(Section):
    """``model/``: the policy's folder, or the embedded tiny model."""

    path: str | None = None
    dtype: Dtype = "float32"
    device: str = "cpu"
    cache_dir: str = "~/.cache/agentgym/models"
    tiny: TinyModelSpec = TinyModelSpec(phrase_tokens=True)
    warm_start: WarmStartSpec | None = WarmStartSpec()


class GenerationGroup(Section):
    """``generation/``: the backend and how it samples (``actor_infer`` reads these)."""

    backend: Choice("generation.backend", BACKENDS) = "auto"  # type: ignore[valid-type]
    temperature: NonNegativeFloat = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: NonNegativeInt = 0
    max_new_tokens: PositiveInt = 64
    max_batch_size: PositiveInt = 64
    max_model_len: PositiveInt = 4096
    base_url: str | None = None
    served_model_name: str | None = None
    per_request_seed: Bool | None = None


class StrategyGroup(Section):
    """``strategy/``: how the policy is trained (``actor_train.strategy_args`` reads these)."""

    strategy_name: str = "torch"
    strategy_config: dict[str, Any] = Field(default_factory=dict)


# Roles (ROLL's actor_train, actor_infer, critic, reference) ---------------------------


class ModelArgs(Section):
    dtype: Dtype = "float32"
    disable_gradient_checkpointing: Bool = True
    attn_implementation: str | None = None
    model_name_or_path: str | None = None


class TrainingArgs(Section):
    learning_rate: NonNegativeFloat = 3.0e-4
    weight_decay: NonNegativeFloat = 0.0
    per_device_train_batch_size: PositiveInt = 128
    gradient_accumulation_steps: PositiveInt = 2
    warmup_steps: NonNegativeInt = 0
    warmup_ratio: Probability = 0.0
    lr_scheduler_type: Choice("lr_scheduler_type", LR_SCHEDULER_TYPES) = "constant"  # type: ignore[valid-type]


class DataArgs(Section):
    template: str | None = None
    file_name: str | list[str] | None = None
    prompt: str | None = None
    messages: str | None = None


class GeneratingArgs(Section):
    max_new_tokens: PositiveInt = 64
    temperature: NonNegativeFloat = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: NonNegativeInt = 0
    num_beams: PositiveInt = 1
    num_return_sequences: PositiveInt = 1


class StrategyArgs(Section):
    strategy_name: str | None = None
    strategy_config: dict[str, Any] = Field(default_factory=dict)


class Role(Section):
    """One of ROLL's worker roles; every role knows every key."""

    model_args: ModelArgs = ModelArgs()
    training_args: TrainingArgs = TrainingArgs()
    data_args: DataArgs = DataArgs()
    generating_args: GeneratingArgs = GeneratingArgs()
    strategy_args: StrategyArgs = StrategyArgs()
    device_mapping: Annotated[list[int] | None, BeforeValidator(_device_mapping)] = None
    world_size: PositiveInt | None = None
    num_gpus_per_worker: PositiveInt = 1
    model_update_frequency: PositiveInt = 1
    infer_batch_size: PositiveInt | None = None


# Env managers ---------------------------------------------------------------------------


MANAGER_ALIASES = {"num_env_groups": "env_groups", "num_groups_partition": "n_groups"}
"""ROLL's other spellings of env manager keys."""


class EnvManagerSection(Section):
    """``train_env_manager`` / ``val_env_manager`` (ROLL's keys and aliases)."""

    tags: list[str] = Field(default_factory=lambda: ["sokoban"])
    n_groups: list[PositiveInt] | None = None
    env_groups: PositiveInt = 16
    group_size: PositiveInt = 8
    max_traj_per_env: PositiveInt = 1
    format_penalty: float | None = None
    env_configs: dict[str, Any] = Field(default_factory=dict)
    worker_cls: str | None = None
    max_env_num_per_worker: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        # ROLL also spells env_groups num_env_groups and n_groups num_groups_partition
        if isinstance(data, dict):
            data = dict(data)
            for alias, key in MANAGER_ALIASES.items():
                if alias in data:
                    data[key] = data.pop(alias)
        return data


class RewardNormalization(Section):
    grouping: Choice("reward_normalization.grouping", GROUPINGS) = "state"  # type: ignore[valid-type]
    method: Choice("reward_normalization.method", NORMALIZATIONS) = "mean_std"  # type: ignore[valid-type]


class TrainInferISWeight(Section):
    """ROLL's ``train_infer_correction.is_weight``: weigh each token's policy loss by
    π_old/π_engine, truncated at ``upper_bound`` (docs/off_policy.md)."""

    enabled: Bool = False
    weight_type: Choice("train_infer_correction.is_weight.weight_type", WEIGHT_TYPES) = "token"  # type: ignore[valid-type]
    upper_bound: PositiveFloat | None = 1.2
    detach: Bool = True


class TrainInferFilter(Section):
    """One of ROLL's ``train_infer_correction.filters``: generated tokens (or whole
    turns/sequences, by ``agg_type``) whose ratio or probability difference leaves
    the bounds leave the loss mask."""

    enabled: Bool = False
    agg_type: Choice("train_infer_correction.filters.agg_type", WEIGHT_TYPES) = "token"  # type: ignore[valid-type]
    ratio_enabled: Bool = True
    ratio_low: NonNegativeFloat = 0.8
    ratio_high: PositiveFloat = 1.2
    diff_enabled: Bool = False
    diff_low: float = -0.2
    diff_high: float = 0.2


class TrainInferCorrection(Section):
    """ROLL's ``train_infer_correction`` (agentgym.trainers.correction)."""

    is_weight: TrainInferISWeight = TrainInferISWeight()
    filters: list[TrainInferFilter] = Field(default_factory=list)


class Validation(Section):
    temperature: NonNegativeFloat = 1.0
    renders: NonNegativeInt = 4


# The whole config ----------------------------------------------------------------------


class TrainConfig(Section):
    """The composed training config (``configs/config.yaml``), checked."""

    env: EnvGroup = EnvGroup()
    model: ModelGroup = ModelGroup()
    generation: GenerationGroup = GenerationGroup()
    strategy: StrategyGroup = StrategyGroup()

    # run
    exp_name: str = "sokoban_grpo"
    seed: int = 42
    rpc_timeout: PositiveFloat = 600.0
    output_dir: str = "outputs/train"
    logging_dir: str = "outputs/train/logs"
    render_save_dir: str | None = None
    rollout_dump_dir: str | None = None
    track_with: list[Choice("track_with", TRACKERS)] = Field(  # type: ignore[valid-type]
        default_factory=lambda: ["stdout"]
    )
    tracker_kwargs: dict[str, Any] = Field(default_factory=dict)
    max_steps: PositiveInt = 60
    save_steps: PositiveInt = 30
    logging_steps: PositiveInt = 1
    eval_steps: NonNegativeInt = 15
    resume_from_checkpoint: Bool | str = False
    fit_to_machine: Bool = True
    checkpoint_config: dict[str, Any] | None = None
    system_envs: dict[str, str] = Field(default_factory=dict)
    pretrain: str | None = None
    reward_pretrain: str | None = None
    max_failed_fraction: Probability = 0.5

    # batches and lengths
    rollout_batch_size: PositiveInt = 128
    val_batch_size: PositiveInt = 512
    prompt_length: PositiveInt | None = None
    response_length: PositiveInt | None = None
    sequence_length: PositiveInt = 512
    max_turns: PositiveInt = 10
    rollout_mode: Choice("rollout_mode", SAMPLE_MODES) = "step"  # type: ignore[valid-type]
    history_length: NonNegativeInt = 0
    step_score: Choice("step_score", STEP_SCORES) = "episode"  # type: ignore[valid-type]
    prefix_check: Choice("prefix_check", PREFIX_CHECK_MODES) = "warn"  # type: ignore[valid-type]

    # distribution and scheduling
    distributed: Choice("distributed", DISTRIBUTED) = "local"  # type: ignore[valid-type]
    ray_address: str | None = None
    local_rank: int = -1
    num_nodes: PositiveInt = 1
    num_gpus_per_node: NonNegativeInt = 0
    generate_opt_level: Annotated[int, Field(ge=0, le=1)] = 1
    # every group member is its own episode and request: always expanded, either value
    is_num_return_sequences_expand: Bool = False
    max_running_requests: PositiveInt | None = None
    is_use_additional_prompts: Bool = False
    max_additional_running_prompts: NonNegativeInt = 16
    num_return_sequences_in_group: PositiveInt = 1
    async_generation_ratio: NonNegativeFloat = 0.0

    # advantages and rewards
    ppo_epochs: PositiveInt = 1
    max_grad_norm: PositiveFloat | None = 1.0
    adv_estimator: Choice("adv_estimator", ADVANTAGE_ESTIMATORS) = "grpo"  # type: ignore[valid-type]
    gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    lambd: Annotated[float, Field(ge=0, le=1)] = 0.95
    whiten_advantages: Bool = False
    reward_clip: PositiveFloat | None = None
    advantage_clip: PositiveFloat | None = None
    reward_normalization: RewardNormalization = RewardNormalization()
    drop_zero_variance_groups: Bool = True
    step_advantage_weight: NonNegativeFloat = 1.0
    step_gamma: Annotated[float, Field(gt=0, le=1)] = 0.95
    use_reward_scaling: Bool = False
    add_len_reward: Bool = False
    use_reward_norm: Bool = False
    whiten_rewards: Bool = False
    reward_norm: Choice("reward_norm", REWARD_NORMS) | None = None  # type: ignore[valid-type]
    reward_shift: Bool = False
    reward_scale: Bool = False
    difficulty_loss_weight: Bool = False
    length_loss_weight: Bool = False
    critic_warmup: NonNegativeInt = 0
    value_clip: PositiveFloat | None = None

    # losses
    clip_ratio_low: NonNegativeFloat = 0.2
    clip_ratio_high: NonNegativeFloat = 0.2
    dual_clip_ratio_c: Annotated[float, Field(gt=1)] | None = None
    dual_clip_loss: Bool = False
    loss_agg_mode: Choice("loss_agg_mode", LOSS_AGG_MODES) = "token-mean"  # type: ignore[valid-type]
    loss_scale_factor: PositiveInt | None = None
    use_kl_loss: Bool = False
    kl_loss_coef: NonNegativeFloat = 0.001
    kl_penalty: Choice("kl_penalty", KL_PENALTIES) = "low_var_kl"  # type: ignore[valid-type]
    add_token_level_kl: Bool = False
    init_kl_coef: NonNegativeFloat = 0.001
    target_kl: PositiveFloat | None = None
    kl_horizon: PositiveInt = 10000
    entropy_loss_coef: float = 0.0
    tis_cap: PositiveFloat | None = None
    old_logprobs: Choice("old_logprobs", OLD_LOGPROBS) = "engine"  # type: ignore[valid-type]
    train_infer_correction: TrainInferCorrection = TrainInferCorrection()
    sft_loss_coef: NonNegativeFloat = 0.0
    rl_loss_coef: NonNegativeFloat = 1.0
    use_topr_loss: Bool = False
    l2: NonNegativeFloat = 0.0

    # envs and roles
    train_env_manager: EnvManagerSection = EnvManagerSection()
    val_env_manager: EnvManagerSection = EnvManagerSection(env_groups=512, group_size=1)
    actor_train: Role = Role(strategy_args=StrategyArgs(strategy_name="torch"))
    actor_infer: Role = Role(strategy_args=StrategyArgs(strategy_name="auto"))
    critic: Role = Role()
    reference: Role = Role()
    validation: Validation = Validation()

    @model_validator(mode="before")
    @classmethod
    def _scalar_forms(cls, data: Any) -> Any:
        # ROLL writes track_with as one name
        if isinstance(data, dict) and isinstance(data.get("track_with"), str):
            data = {**data, "track_with": [data["track_with"]]}
        return _group_size_from_rlvr(data)


def _group_size_from_rlvr(data: Any) -> Any:
    """``num_return_sequences_in_group`` (ROLL's RLVR name for the group size), when
    above 1, sets ``train_env_manager.group_size``, which must then be left at its
    default or agree."""
    size = data.get("num_return_sequences_in_group", 1) if isinstance(data, dict) else 1
    if not isinstance(size, int) or size <= 1:
        return data
    manager = data.get("train_env_manager") or {}
    if not isinstance(manager, dict):
        return data
    default = EnvManagerSection.model_fields["group_size"].default
    given = manager.get("group_size", default)
    if given not in (size, default):
        raise ConfigError(
            f"num_return_sequences_in_group={size} is the group size, but "
            f"train_env_manager.group_size={given}: set one of them"
        )
    return {**data, "train_env_manager": {**manager, "group_size": size}}


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


def _check_not_yet(config: TrainConfig) -> None:
    defaults = TrainConfig()
    for key, message in NOT_YET.items():
        path, _, bad = key.partition("=")
        value = _get(config, path)
        if (str(value) == bad) if bad else (value != _get(defaults, path)):
            raise ConfigError(f"{path}={value!r} is not supported yet: {message}")


def _check_training(config: TrainConfig) -> None:
    manager = config.train_env_manager
    per_step = manager.env_groups * manager.group_size * manager.max_traj_per_env
    if config.rollout_batch_size != per_step:
        raise ConfigError(
            f"rollout_batch_size={config.rollout_batch_size} must equal train_env_manager "
            f"env_groups × group_size × max_traj_per_env = {manager.env_groups} × "
            f"{manager.group_size} × {manager.max_traj_per_env} = {per_step}"
        )
    args = config.actor_train.training_args
    replicas = data_parallel_size(config)
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


def _check_scheduling(config: TrainConfig) -> None:
    if config.is_use_additional_prompts and not config.max_additional_running_prompts:
        raise ConfigError(
            "is_use_additional_prompts=true starts max_additional_running_prompts extra groups "
            "beyond the batch, but max_additional_running_prompts=0: set it >= 1"
        )
    if config.generate_opt_level == 0 and config.async_generation_ratio > 0:
        raise ConfigError(  # ROLL asserts the same
            f"generate_opt_level=0 (lockstep batches) cannot run ahead of the trainer: "
            f"async_generation_ratio={config.async_generation_ratio} needs generate_opt_level=1"
        )


def _check_relations(config: TrainConfig) -> None:
    _check_scheduling(config)
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
    _check_algorithm(config)
    if config.pretrain and not (Path(config.pretrain).expanduser() / "config.json").is_file():
        raise ConfigError(
            f"pretrain={config.pretrain!r} is not a model folder (no config.json); "
            "models are loaded from local folders, never downloaded"
        )
    name = config.actor_train.strategy_args.strategy_name
    if name in UNSUPPORTED_STRATEGIES:
        raise ConfigError(
            f"actor_train.strategy_args.strategy_name={name!r}: {UNSUPPORTED_STRATEGIES[name]}"
        )
    if name not in STRATEGY_NAMES:
        check_choice("actor_train.strategy_args.strategy_name", str(name), STRATEGY_NAMES)
    backend = config.actor_infer.strategy_args.strategy_name
    check_choice("actor_infer.strategy_args.strategy_name", str(backend), BACKENDS)
    try:
        check_backend(str(backend), config.generation.base_url)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def dual_clip_c(config: TrainConfig) -> float | None:
    """The dual-clip bound ``c``: ``dual_clip_ratio_c`` (verl's ``clip_ratio_c``), or with
    ROLL's ``dual_clip_loss`` ROLL's ``1 + 2 × pg_clip`` (1.4 at the default clip of 0.2)."""
    if config.dual_clip_loss:
        return 1.0 + 2.0 * config.clip_ratio_low
    return config.dual_clip_ratio_c


def _check_algorithm(config: TrainConfig) -> None:
    """Keys of issue 19 that only make sense together (each message names the fix)."""
    if config.dual_clip_loss:
        if config.clip_ratio_low != config.clip_ratio_high:
            raise ConfigError(
                f"dual_clip_loss=true bounds the loss at (1 + 2 × pg_clip) × |A| (ROLL), which "
                f"needs one clip: clip_ratio_low={config.clip_ratio_low} != clip_ratio_high="
                f"{config.clip_ratio_high}; make them equal, or set dual_clip_ratio_c instead"
            )
        if config.dual_clip_ratio_c not in (None, dual_clip_c(config)):
            raise ConfigError(
                f"dual_clip_loss=true means dual-clip with c = 1 + 2 × {config.clip_ratio_low} "
                f"= {dual_clip_c(config)} (ROLL), but dual_clip_ratio_c="
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
    if config.whiten_rewards and config.adv_estimator == "grpo":
        raise ConfigError(
            "whiten_rewards whitens the token-level rewards, which adv_estimator=grpo does not "
            "read (it spreads the normalized score): use adv_estimator=reinforce or gae, or "
            "whiten_advantages"
        )
    if config.use_topr_loss and not config.sft_loss_coef:
        raise ConfigError(
            "use_topr_loss adds TOPR's tapered term for negative samples to the sft_loss_coef "
            "term (ROLL): set sft_loss_coef > 0 (with rl_loss_coef=0 for pure TOPR)"
        )
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


def device_mappings(config: TrainConfig) -> dict[str, list[int]]:
    """Each device role's ``device_mapping``, with the defaults filled in: one device
    (rank 0) for ``actor_train`` and for ``actor_infer`` (colocated), the
    reference inside the ``actor_train`` ranks (the torch strategy holds it), and
    GAE's critic on ``actor_train``'s devices unless ``critic.device_mapping`` says."""
    train = config.actor_train.device_mapping or [0]
    infer = config.actor_infer.device_mapping or range(config.actor_infer.num_gpus_per_worker)
    mappings = {"actor_train": list(train), "actor_infer": list(infer)}
    if config.adv_estimator == "gae":
        mappings["critic"] = list(config.critic.device_mapping or train)
    return mappings


MODEL_PARALLEL_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
)
"""``strategy_config`` keys whose product is a model replica's ranks (ROLL's TP × PP × CP)."""


def data_parallel_size(config: TrainConfig, role: str = "actor_train") -> int:
    """Data-parallel replicas of ``role``: its ranks (one per device of its
    ``device_mapping`` on Ray, one in process) over TP × PP × CP.

    Raises:
        ConfigError: When the ranks do not split into whole replicas.
    """
    mapping = device_mappings(config).get(role)
    if config.distributed == "local" or mapping is None:  # one process, or no such role
        return 1
    section: Role = getattr(config, role)
    world = len(mapping)
    parallel = 1
    for key in MODEL_PARALLEL_KEYS:
        parallel *= int(section.strategy_args.strategy_config.get(key) or 1)
    if world % parallel:
        raise ConfigError(
            f"{role} has {world} ranks (device_mapping), which TP × PP × CP = {parallel} "
            "does not divide into whole model replicas; change the mapping or the parallel sizes"
        )
    return world // parallel


def _check_placement(config: TrainConfig) -> None:
    reference = config.reference.device_mapping
    mappings = device_mappings(config)
    if reference and reference != mappings["actor_train"]:
        raise ConfigError(
            f"reference.device_mapping={reference}: the reference model lives in the "
            f"actor_train ranks (device_mapping={mappings['actor_train']}); leave it null "
            "or give the same list"
        )
    plan = plan_placement(
        mappings,
        num_nodes=config.num_nodes,
        num_gpus_per_node=config.num_gpus_per_node,
        devices_per_worker={"actor_infer": config.actor_infer.num_gpus_per_worker},
    )
    if config.distributed == "local":
        sizes = {role: plan.world_size(role) for role in ("actor_train", "actor_infer")}
        if config.num_nodes != 1 or any(size != 1 for size in sizes.values()):
            raise ConfigError(
                f"distributed=local runs one trainer rank and one engine in this process, but "
                f"num_nodes={config.num_nodes}, actor_train has {sizes['actor_train']} rank(s) "
                f"and actor_infer {sizes['actor_infer']} engine(s): set distributed=ray"
            )


def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    model: Any = TrainConfig
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return None
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _message(error: Mapping[str, Any]) -> str:
    loc = [part for part in error["loc"] if not str(part).startswith(("function-", "constrained"))]
    key = ".".join(str(part) for part in loc)
    if error["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        options = _field_names(parent) if parent is not None else []
        hint = did_you_mean(loc[-1], options)
        return f"unknown key {key!r}.{hint}"
    if error["type"] == "value_error" and isinstance(
        error.get("ctx", {}).get("error"), ConfigError
    ):
        return str(error["ctx"]["error"])
    return f"{key}={error.get('input')!r}: {error['msg']}"


def validate(raw: Mapping[str, Any], *, training: bool = True) -> TrainConfig:
    """Check a composed, resolved config and return it typed.

    Args:
        raw: The composed, resolved config.
        training: Also check what only training needs (batch sizes that divide,
            GiGPO's step mode, ...); eval plays validation episodes only.

    Raises:
        ConfigError: Naming each bad key, its value and the valid range or
            options (a close match for a misspelled key), or a key ROLL has
            that agentgym does not implement yet, with what to use instead.
    """
    try:
        config = TrainConfig.model_validate(dict(raw))
    except ValidationError as error:
        messages = [_message(e) for e in error.errors()]
        raise ConfigError("invalid config:\n  " + "\n  ".join(messages)) from None
    _check_not_yet(config)
    _check_relations(config)
    _check_placement(config)
    if training:
        _check_training(config)
    return config


def known_paths() -> list[str]:
    """Every key path of the schema (``a.b.c``), for close matches on the command line."""
    paths: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            path = f"{prefix}{name}"
            paths.append(path)
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, path + ".")

    walk(TrainConfig, "")
    for manager in ("train_env_manager", "val_env_manager"):  # ROLL's spellings
        paths += [f"{manager}.{alias}" for alias in MANAGER_ALIASES]
    return paths


OPEN_MAPPINGS = (
    "env.kwargs",
    "tracker_kwargs",
    "system_envs",
    "strategy.strategy_config",
    "actor_train.strategy_args.strategy_config",
    "train_env_manager.env_configs",
    "val_env_manager.env_configs",
    "model.tiny",
    "model.warm_start",
)
"""Keys whose entries are free-form (constructor arguments and the like)."""
