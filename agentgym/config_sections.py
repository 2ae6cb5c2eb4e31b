"""The sections of the training config (:mod:`agentgym.schema`): one pydantic model per
section or group, each key with its type, range and default, and the helpers that
give a choice key its options and a close match.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    model_validator,
)

from agentgym.choices import (
    AGENT_KINDS,
    GROUPINGS,
    LR_SCHEDULER_TYPES,
    NORM_SCOPES,
    NORMALIZATIONS,
    WEIGHT_TYPES,
)
from agentgym.errors import check_choice
from agentgym.models.tiny import TinyModelSpec
from agentgym.models.warmstart import WarmStartSpec
from agentgym.rollout.backends import BACKENDS

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
    (``max_new_tokens`` by ``generation.max_new_tokens``, ``learning_rate`` by
    ``actor_train.training_args.learning_rate``) and by ``model.warm_start``
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
    learning_rate: NonNegativeFloat | None = None
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
    lora_target: str | list[str] | None = None  # LoRA: trainers/strategies/lora.py
    lora_rank: PositiveInt = 8
    lora_alpha: PositiveInt | None = None  # None: 2 × lora_rank (ROLL's)


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
    # ROLL's and vLLM's -1 (GEM's files) is "off", as 0 is here
    top_k: Annotated[int, BeforeValidator(lambda k: 0 if k == -1 else k), Field(ge=0)] = 0
    num_beams: PositiveInt = 1
    num_return_sequences: PositiveInt = 1
    stop_strings: list[str] = Field(default_factory=list)  # a response ends with the first


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
    # ROLL's dynamic batching: micro-batches by token budget (trainers/strategies/batching.py)
    use_dynamic_batching_in_train: Bool = False
    max_tokens_per_microbatch_in_train: NonNegativeInt = 0
    sequence_length_round_in_train: PositiveInt = 4
    use_dynamic_batching_in_infer: Bool = False
    max_tokens_per_microbatch_in_infer: PositiveInt | None = None
    sequence_length_round_in_infer: PositiveInt = 4

    @model_validator(mode="before")
    @classmethod
    def _engine_devices(cls, data: Any) -> Any:
        # ROLL's rule (WorkerConfig): a vLLM worker's devices are its strategy_config's
        # tensor_parallel_size × pipeline_parallel_size, whatever num_gpus_per_worker says
        if not isinstance(data, dict):
            return data
        args = data.get("strategy_args") or {}
        if not isinstance(args, dict) or args.get("strategy_name") not in ("vllm", "auto"):
            return data
        engine = args.get("strategy_config") or {}
        if "tensor_parallel_size" not in engine and "pipeline_parallel_size" not in engine:
            return data
        devices = int(engine.get("tensor_parallel_size") or 1) * int(
            engine.get("pipeline_parallel_size") or 1
        )
        return {**data, "num_gpus_per_worker": devices}


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
    # ROLL's: either set, the two decide (each unset one derived from method, as ROLL)
    norm_mean_type: Choice("reward_normalization.norm_mean_type", NORM_SCOPES) | None = None  # type: ignore[valid-type]
    norm_std_type: Choice("reward_normalization.norm_std_type", NORM_SCOPES) | None = None  # type: ignore[valid-type]


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
    """``validation``: how validation episodes sample, how many are rendered, and
    whether the run validates its starting weights (Trinity's ``eval_on_startup``)."""

    temperature: NonNegativeFloat = 1.0
    renders: NonNegativeInt = 4
    on_startup: Bool = True


class Agent(Section):
    """``agent``: who plays the episodes (``agent=env``, ``agent=proxy`` or ``agent=native``).

    ``env`` is the env manager's own loop. ``native`` lets an env that owns its
    conversation hand the model each prompt (docs/native_envs.md). ``proxy`` hands each
    episode to an agent runner that plays through the OpenAI-compatible proxy, which
    records the policy's tokens exactly (docs/agents.md): ``runner`` is ``env`` (the
    built-in runner that plays the registered env) or an import path
    ``package.module:Class``.

    ``mode: serve`` serves agents started by someone else on ``host:port`` (Trinity-RFT's
    ``explorer.listen_address`` and ``proxy_port``); they send ``api_key`` (unset: a
    new key, written with the address to ``<job folder>/serve/<explorer>.json``).
    """

    kind: Choice("agent.kind", AGENT_KINDS) = "env"  # type: ignore[valid-type]
    runner: str = "env"
    timeout: PositiveFloat = 600.0
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    api_key: str | None = None


ROLLOUT_MOCK_MODES = ("dump", "mock")
"""``rollout_mock.mode`` (ROLL's): write each step's batch, or train on written ones."""


class RolloutMock(Section):
    """``rollout_mock`` (ROLL's keys): ``dump`` writes each step's batch as the trainer
    receives it to ``dump_dir``; ``mock`` skips generation and trains on those batches,
    so two runs that differ only in batching, strategy or layout compare step by step
    (docs/dump_replay.md)."""

    enable: bool = False
    mode: Choice("rollout_mock.mode", ROLLOUT_MOCK_MODES) = "dump"  # type: ignore[valid-type]
    dump_dir: str | None = None


class Buffer(Section):
    """``buffer``: the experience buffer of a decoupled job (``mode: explore | train``)."""

    storage_type: str = "sql"
    path: str | None = None
    max_read_timeout: PositiveFloat = 1800.0
    explorer_timeout: PositiveFloat = 120.0


SYNC_STYLES = ("fixed", "trainer_driven", "explorer_driven")
"""``synchronizer.sync_style`` (Trinity-RFT's ``SyncStyle``): explorers sync every
``sync_interval`` of their batches after ``sync_offset`` and wait for the version
(fixed); or take the newest whenever the trainer publishes one, every
``sync_interval`` steps (trainer_driven); or ask for one after ``sync_interval`` of
their batches and go on without waiting (explorer_driven)."""

_SYNC_ALIASES = {
    # Trinity-RFT's older names
    "dynamic_by_trainer": "trainer_driven",
    "dynamic_by_explorer": "explorer_driven",
    "offline": "checkpoint",
    "online": "nccl",
}


def _sync_alias(value: Any) -> Any:
    """Trinity-RFT's names are case-insensitive and have aliases."""
    if not isinstance(value, str):
        return value
    return _SYNC_ALIASES.get(value.lower(), value.lower())


class Synchronizer(Section):
    """``synchronizer``: how explorers follow the trainer's weights (Trinity-RFT's keys;
    docs/explorer_trainer.md)."""

    sync_method: Annotated[str, BeforeValidator(_sync_alias)] = "checkpoint"
    sync_interval: PositiveInt = 1
    sync_offset: NonNegativeInt = 0
    sync_style: Annotated[
        str, BeforeValidator(_sync_alias), AfterValidator(_choice("sync_style", SYNC_STYLES))
    ] = "fixed"
    sync_timeout: PositiveFloat = 3600.0


class Explorer(Section):
    """``explorer``: this explorer process."""

    name: str = "explorer"
    bench_on_latest_checkpoint: Bool = False


# The whole config ----------------------------------------------------------------------
