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

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    model_validator,
)

from agentgym.choices import (
    ADVANTAGE_ESTIMATORS,
    KL_PENALTIES,
    LOSS_AGG_MODES,
    OPMD_BASELINES,
    PG_VARIANTS,
    REWARD_NORMS,
    SAMPLE_MODES,
    STEP_SCORES,
)
from agentgym.cluster import DISTRIBUTED, PlacementPlan, plan_placement
from agentgym.config_checks import (
    check_not_yet,
    check_placement,
    check_relations,
    check_training,
)
from agentgym.config_sections import (
    MANAGER_ALIASES,
    OLD_LOGPROBS,
    Agent,
    Bool,
    Buffer,
    Choice,
    EnvGroup,
    EnvManagerSection,
    Explorer,
    GenerationGroup,
    ModelGroup,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
    RewardNormalization,
    Role,
    RolloutMock,
    Section,
    StrategyArgs,
    StrategyGroup,
    Synchronizer,
    TrainInferCorrection,
    Validation,
)
from agentgym.errors import ConfigError, did_you_mean
from agentgym.job.schedule import SyncSchedule
from agentgym.rollout.backends import resolve_backend
from agentgym.rollout.chat import PREFIX_CHECK_MODES
from agentgym.trainers.tracking import TRACKERS


class TrainConfig(Section):
    """The composed training config (``configs/config.yaml``), checked."""

    env: EnvGroup = EnvGroup()
    model: ModelGroup = ModelGroup()
    generation: GenerationGroup = GenerationGroup()
    strategy: StrategyGroup = StrategyGroup()

    # run
    exp_name: str = "sokoban_grpo"
    mode: str = "both"
    project: str = "agentgym"
    name: str | None = None
    checkpoint_root_dir: str = "checkpoints"
    buffer: Buffer = Buffer()
    agent: Agent = Agent()
    rollout_mock: RolloutMock = RolloutMock()
    synchronizer: Synchronizer = Synchronizer()
    explorer: Explorer = Explorer()
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
    partial_rollout: NonNegativeInt = 0

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
    opmd_baseline: Choice("opmd_baseline", OPMD_BASELINES) = "mean"  # type: ignore[valid-type]
    opmd_baseline_tau: PositiveFloat = 1.0
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
    pg_variant: Choice("pg_variant", PG_VARIANTS) = "ppo"  # type: ignore[valid-type]
    topr_positive_weight: NonNegativeFloat = 1.0
    topr_negative_weight: NonNegativeFloat = 1.0
    topr_advantage_threshold: float | None = None
    tis_lower_bound: NonNegativeFloat = 0.0
    tis_upper_bound: NonNegativeFloat = 1.0
    cispo_epsilon_low: NonNegativeFloat = 0.1
    cispo_epsilon_high: NonNegativeFloat = 0.1
    cispo_use_unified_mask: Bool = False
    kimi15_tau: NonNegativeFloat = 0.1
    opmd_tau: NonNegativeFloat = 1.0

    # envs and roles
    train_env_manager: EnvManagerSection = EnvManagerSection()
    val_env_manager: EnvManagerSection = EnvManagerSection(env_groups=512, group_size=1)
    actor_train: Role = Role(strategy_args=StrategyArgs(strategy_name="torch"))
    actor_infer: Role = Role(strategy_args=StrategyArgs(strategy_name="auto"))
    critic: Role = Role()
    reference: Role = Role()
    validation: Validation = Validation()

    # What the keys imply: derived here, once, for the checks and the builders alike.

    @property
    def device_mappings(self) -> dict[str, list[int]]:
        """Each device role's ``device_mapping``, with the defaults filled in: one device
        (rank 0) for ``actor_train`` and for ``actor_infer`` (colocated), the reference
        inside the ``actor_train`` ranks (the torch strategy holds it), and GAE's critic
        on ``actor_train``'s devices unless ``critic.device_mapping`` says."""
        train = self.actor_train.device_mapping or [0]
        infer = self.actor_infer.device_mapping or range(self.actor_infer.num_gpus_per_worker)
        mappings = {"actor_train": list(train), "actor_infer": list(infer)}
        if self.adv_estimator == "gae":
            mappings["critic"] = list(self.critic.device_mapping or train)
        return mappings

    @property
    def placement(self) -> PlacementPlan:
        """Where the device roles' workers run: (node, device) slots for each role's
        ``device_mapping`` (:func:`~agentgym.cluster.plan_placement`)."""
        return plan_placement(
            self.device_mappings,
            num_nodes=self.num_nodes,
            num_gpus_per_node=self.num_gpus_per_node,
            devices_per_worker={"actor_infer": self.actor_infer.num_gpus_per_worker},
        )

    @property
    def colocated(self) -> bool:
        """Whether the engines share devices with the trainer (one process, or
        overlapping ``device_mapping``s)."""
        mappings = self.device_mappings
        return self.distributed == "local" or bool(
            set(mappings["actor_train"]) & set(mappings["actor_infer"])
        )

    @property
    def data_parallel(self) -> dict[str, int]:
        """Data-parallel replicas of each training role (``actor_train``, ``critic``): its
        ranks (one per device of its ``device_mapping`` on Ray, one in process) over
        ROLL's TP × PP × CP.

        Raises:
            ConfigError: When a role's ranks do not split into whole replicas.
        """
        return {role: self._replicas(role) for role in ("actor_train", "critic")}

    def _replicas(self, role: str) -> int:
        mapping = self.device_mappings.get(role)
        if self.distributed == "local" or mapping is None:  # one process, or no such role
            return 1
        options = getattr(self, role).strategy_args.strategy_config
        parallel = math.prod(int(options.get(key) or 1) for key in MODEL_PARALLEL_KEYS)
        if len(mapping) % parallel:
            raise ConfigError(
                f"{role} has {len(mapping)} ranks (device_mapping), which TP × PP × CP = "
                f"{parallel} does not divide into whole model replicas; change the mapping "
                "or the parallel sizes"
            )
        return len(mapping) // parallel

    @property
    def dual_clip_c(self) -> float | None:
        """The dual-clip bound ``c``: ``dual_clip_ratio_c`` (verl's ``clip_ratio_c``), or
        with ROLL's ``dual_clip_loss`` ROLL's ``1 + 2 × pg_clip`` (1.4 at the default
        clip of 0.2)."""
        if self.dual_clip_loss:
            return 1.0 + 2.0 * self.clip_ratio_low
        return self.dual_clip_ratio_c

    @property
    def backend_name(self) -> str:
        """The generation backend: ``actor_infer.strategy_args.strategy_name`` (``auto``
        resolved)."""
        return resolve_backend(str(self.actor_infer.strategy_args.strategy_name))

    @property
    def sync_schedule(self) -> SyncSchedule:
        """The decoupled job's sync schedule (``synchronizer.sync_interval``,
        ``sync_offset``, ``sync_style``)."""
        sync = self.synchronizer
        return SyncSchedule(sync.sync_interval, sync.sync_offset, sync.sync_style)

    @property
    def staleness_versions(self) -> float:
        """How many versions behind the weights it updates a trained sample may be in a
        decoupled job: ``async_generation_ratio`` where set, else what the sync schedule
        implies (``sync_interval + sync_offset - 1``: 0 for Trinity-RFT's defaults, where
        the explorer waits for each version)."""
        return self.async_generation_ratio or float(self.sync_schedule.implied_bound)

    @property
    def job_dir(self) -> Path:
        """A decoupled job's folder, where its processes meet:
        ``checkpoint_root_dir/project/name`` (``name`` defaults to ``exp_name``)."""
        name = self.name or self.exp_name
        return Path(self.checkpoint_root_dir).expanduser() / self.project / name

    @property
    def checkpoint_dir(self) -> Path:
        """Where the trainer's checkpoints go: ``output_dir/checkpoints``, and for a
        decoupled job's trainer (``mode: train``) the job folder's ``checkpoints``
        (Trinity-RFT's ``checkpoint_job_dir``), so that a trainer restarted with the
        command that started it finds them whatever its run folder."""
        if self.mode == "train":
            return self.job_dir / "checkpoints"
        return Path(self.output_dir) / "checkpoints"

    @property
    def job_name(self) -> str:
        """The job's name among a Ray cluster's jobs: ``project/name``."""
        return f"{self.project}/{self.name or self.exp_name}"

    @model_validator(mode="before")
    @classmethod
    def _scalar_forms(cls, data: Any) -> Any:
        # ROLL writes track_with as one name
        if isinstance(data, dict) and isinstance(data.get("track_with"), str):
            data = {**data, "track_with": [data["track_with"]]}
        return _group_size_from_rlvr(data)


MODEL_PARALLEL_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
)
"""``strategy_config`` keys whose product is a model replica's ranks (ROLL's TP × PP × CP)."""


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
    check_not_yet(config)
    check_relations(config)
    check_placement(config)
    if training:
        check_training(config)
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
