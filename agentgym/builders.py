"""Builders: the recipe's parts from a checked config, shared by train and eval.

Each builder takes the typed :class:`~agentgym.schema.TrainConfig` (or the
pieces of it it needs) and returns one part; nothing here runs the recipe.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml

from agentgym.cluster import Cluster, PlacementPlan, plan_placement, start_cluster
from agentgym.config_checks import data_parallel_size, device_mappings, device_type
from agentgym.config_sections import EnvManagerSection, GeneratingArgs
from agentgym.console import LIBRARY_LOG_FILE, redirect_output
from agentgym.errors import ConfigError
from agentgym.fileio import write_atomic, write_json_atomic
from agentgym.job import buffer_source, job_dir, weight_channel
from agentgym.recipe_settings import grpo_config
from agentgym.registry import env_versions
from agentgym.rollout.backends import GenerationBackend, SamplingParams, make_backend
from agentgym.rollout.backends import resolve_backend as _resolve_backend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.engines import spawn_engines
from agentgym.rollout.env_manager import EnvConfig, EnvManager
from agentgym.rollout.limits import RequestCap
from agentgym.rollout.loop import RolloutConfig
from agentgym.rollout.published_weights import WeightPublisher
from agentgym.rollout.router import Router
from agentgym.rollout.source import RolloutSource
from agentgym.schema import TrainConfig
from agentgym.trainers.grpo import TrainParts, kl_controller
from agentgym.trainers.ranks import start_rank_group
from agentgym.trainers.recipe_config import GRPOConfig
from agentgym.trainers.rewards import RunningMoments
from agentgym.trainers.run_state import RUN_CONFIG
from agentgym.trainers.strategies import Critic, Strategy, build_critic, build_strategy
from agentgym.trainers.strategies.lora import lora_settings
from agentgym.trainers.strategies.optim import OptimizerConfig, optimizer_steps
from agentgym.trainers.tracking import CONSOLE_LOG_FILE, make_tracker


def _version(package: str) -> str:
    """``package``'s installed version, or where it runs from when not installed (a
    checkout on ``PYTHONPATH``)."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed (run from a checkout)"


def model_path(config: TrainConfig) -> Path:
    """The policy's folder: ``pretrain`` (ROLL's key; ``model.path`` feeds it), or the
    tiny model built once from ``model.tiny`` and warm-started per ``model.warm_start``.

    Raises:
        ConfigError: If ``pretrain`` is not a local model folder.
    """
    if config.pretrain:
        path = Path(config.pretrain).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"pretrain={config.pretrain!r} is not a model folder (no config.json); "
                "models are loaded from local folders, never downloaded"
            )
        return path
    from agentgym.models.tiny import ensure_tiny_model

    model = config.model
    return ensure_tiny_model(model.tiny, model.cache_dir, warm_start=model.warm_start)


def sampling_params(args: GeneratingArgs, *, temperature: float, seed: int) -> SamplingParams:
    """The engine's sampling parameters from ROLL's ``generating_args``."""
    return SamplingParams(
        temperature=temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        seed=seed,
    )


def rollout_config(config: TrainConfig, *, validation: bool = False) -> RolloutConfig:
    """How the train (or validation) episodes are collected."""
    args = config.actor_infer.generating_args
    temperature = config.validation.temperature if validation else args.temperature
    return RolloutConfig(
        mode=config.rollout_mode,
        max_turns=config.max_turns,
        sequence_length=config.sequence_length,
        sampling=sampling_params(args, temperature=temperature, seed=config.seed + validation),
        history_length=config.history_length,
        prefix_check=config.prefix_check,
        record_frames=validation and bool(config.render_save_dir),
        generate_opt_level=config.generate_opt_level,
    )


def env_manager(
    section: EnvManagerSection,
    config: TrainConfig,
    *,
    cluster: Cluster | None = None,
    **kwargs: Any,
) -> EnvManager:
    """An :class:`EnvManager` from a ``*_env_manager`` section (ROLL's keys).

    On a Ray cluster the envs live in env-worker actors (``max_env_num_per_worker``
    each; unset: one worker per node); in this process they are stepped in
    threads, or, with ``max_env_num_per_worker`` set, by env workers behind
    local handles (the same classes, for debugging).
    """
    env_configs: dict[str, EnvConfig | Any] = dict(section.env_configs)
    for tag in section.tags:
        env_configs.setdefault(tag, EnvConfig(tag, dict(config.env.kwargs)))
    if cluster is not None and cluster.kind == "local" and not section.max_env_num_per_worker:
        cluster = None
    if cluster is not None:
        kwargs |= {"cluster": cluster, "max_env_num_per_worker": section.max_env_num_per_worker}
    return EnvManager(
        tags=section.tags,
        env_groups=section.env_groups,
        group_size=section.group_size,
        n_groups=section.n_groups,
        env_configs=env_configs,
        seed=config.seed,
        max_traj_per_env=section.max_traj_per_env,
        format_penalty=section.format_penalty,
        **kwargs,
    )


def backend_name(config: TrainConfig) -> str:
    """The generation backend: ``actor_infer.strategy_args.strategy_name`` (``auto`` resolved)."""
    return _resolve_backend(str(config.actor_infer.strategy_args.strategy_name))


def generation_backend(
    config: TrainConfig,
    path: Path,
    *,
    dtype: str,
    device: str,
    sync_dir: Path | None = None,
    cluster: Cluster | None = None,
) -> GenerationBackend:
    """The generation backend for the policy at ``path`` (``sync_dir``: where weights
    for a server are written, which it must be able to read).

    On a Ray cluster, ``actor_infer``'s engines (one per ``num_gpus_per_worker``
    devices of its ``device_mapping``) run as actors behind a :class:`Router`; an
    OpenAI-compatible server is reached from the driver. ``max_running_requests``
    caps the requests in flight to each engine.
    """
    generation = config.generation
    per_request_seed = generation.per_request_seed
    if per_request_seed is None:
        import torch

        per_request_seed = torch.cuda.is_available()
    name = backend_name(config)
    settings: dict[str, Any] = {
        "dtype": dtype,
        "device": device,
        "max_model_len": config.sequence_length,
        "max_batch_size": generation.max_batch_size,
    }
    if name == "vllm":
        settings["engine_options"] = vllm_options(config)
    cap = config.max_running_requests
    if cluster is None or cluster.kind == "local" or name == "openai":
        if device_type(device) == "cuda":  # the engine's GPUs: those this process sees
            settings["tensor_parallel_size"] = config.actor_infer.num_gpus_per_worker
        backend = make_backend(
            name,
            str(path),
            **settings,
            seed=config.seed,
            base_url=generation.base_url,
            served_model_name=generation.served_model_name,
            per_request_seed=per_request_seed,
            weight_sync_dir=str(sync_dir) if sync_dir is not None else None,
        )
        return backend if cap is None else RequestCap(backend, cap)
    engines = placement_plan(config).workers["actor_infer"]
    if engines[0].gpu:  # each engine's GPUs: one model split over them
        settings["tensor_parallel_size"] = config.actor_infer.num_gpus_per_worker
    clients = spawn_engines(
        cluster,
        len(engines),
        name,
        str(path),
        nodes=[engine.node for engine in engines],
        visible_devices=[engine.visible_devices if engine.gpu else None for engine in engines],
        gpu=engines[0].gpu,
        seeds=[config.seed + 1000 * engine.rank for engine in engines],
        **settings,
    )
    return Router(clients, share=cluster.share, max_running_requests=cap)


def vllm_options(config: TrainConfig) -> dict[str, Any]:
    """``actor_infer.strategy_args.strategy_config``: vLLM's engine arguments (ROLL's
    ``gpu_memory_utilization``, ``block_size``, ``load_format``, ...; each engine keeps
    those vLLM takes, :func:`~agentgym.rollout.backends.vllm.engine_arguments`). An
    engine that shares its GPUs with the trainer takes at most half of each (ROLL's
    share assumes its engines sleep while the trainer works; these stay resident)."""
    options = dict(config.actor_infer.strategy_args.strategy_config or {})
    share = options.get("gpu_memory_utilization")
    if share is not None and float(share) > COLOCATED_SHARE and colocated(config):
        print(
            f"actor_infer.strategy_args.strategy_config.gpu_memory_utilization={share}: the "
            "engines share their GPUs with the trainer and stay resident (nothing sleeps "
            f"here); they take {COLOCATED_SHARE}",
            flush=True,
        )
        options["gpu_memory_utilization"] = COLOCATED_SHARE
    return options


COLOCATED_SHARE = 0.5
"""The GPU memory share of an engine beside the trainer (nothing is offloaded)."""


def colocated(config: TrainConfig) -> bool:
    """Whether the engines share devices with the trainer (one process, or overlapping
    ``device_mapping``s)."""
    mappings = device_mappings(config)
    return config.distributed == "local" or bool(
        set(mappings["actor_train"]) & set(mappings["actor_infer"])
    )


def run_engines(
    config: TrainConfig, path: Path, output_dir: Path, workers: Cluster
) -> GenerationBackend:
    """The run's generation backend for ``path``, an engine process's own output in the
    run's library log."""
    with redirect_output(output_dir / LIBRARY_LOG_FILE):
        return generation_backend(
            config,
            path,
            dtype=config.actor_infer.model_args.dtype,
            device=config.model.device,
            sync_dir=output_dir,
            cluster=workers,
        )


def _training_settings(config: TrainConfig, role_name: str, *, passes: int) -> dict[str, Any]:
    """What a training role (``actor_train``, ``critic``) gives its strategy: model,
    optimizer and schedule settings; ``passes`` over each rollout batch (``ppo_epochs``
    for the policy; ROLL's critic makes one) set the optimizer steps of the run."""
    role = getattr(config, role_name)
    args = role.training_args
    optimizer = OptimizerConfig(
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        betas=OptimizerConfig.betas,
        lr_scheduler_type=args.lr_scheduler_type,
        warmup_steps=args.warmup_steps,
        warmup_ratio=args.warmup_ratio,
        total_steps=optimizer_steps(
            max_steps=config.max_steps,
            rollout_batch_size=config.rollout_batch_size,
            ppo_epochs=passes,
            mini_batch_size=args.per_device_train_batch_size
            * args.gradient_accumulation_steps
            * data_parallel_size(config, role_name),
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
    role = config.actor_train
    settings = strategy_settings(config, path, needs_reference=needs_reference)
    name = str(role.strategy_args.strategy_name)
    if cluster is None or cluster.kind == "local":
        return build_strategy(name, path, role.strategy_args.strategy_config, **settings)
    plan = placement_plan(config)
    return start_rank_group(
        cluster,
        "actor_train",
        plan.workers["actor_train"],
        strategy_name=name,
        model_path=path,
        strategy_config=role.strategy_args.strategy_config,
        settings=settings,
        rpc_timeout=config.rpc_timeout,
    )


def critic_strategy(config: TrainConfig, path: Path, cluster: Cluster | None = None) -> Critic:
    """GAE's critic (``critic.strategy_args.strategy_name``, torch by default): the value
    model starts from ``critic.model_args.model_name_or_path`` or else the policy at
    ``path``, trains with ``critic.training_args``, on ``model.device`` in this process
    (``distributed=local``) or on a critic group of one rank per ``critic.device_mapping``
    device (default: ``actor_train``'s) on ``cluster``."""
    role = config.critic
    source = role.model_args.model_name_or_path
    name = role.strategy_args.strategy_name or "torch"
    model_path = Path(source).expanduser() if source else path
    settings = {**_training_settings(config, "critic", passes=1), "seed": config.seed}
    if cluster is None or cluster.kind == "local":
        return build_critic(name, model_path, role.strategy_args.strategy_config, **settings)
    return start_rank_group(
        cluster,
        "critic",
        placement_plan(config).workers["critic"],
        strategy_name=name,
        model_path=model_path,
        strategy_config=role.strategy_args.strategy_config,
        settings=settings,
        rpc_timeout=config.rpc_timeout,
    )


def placement_plan(config: TrainConfig) -> PlacementPlan:
    """Where the device roles' workers run (checked at validation already)."""
    return plan_placement(
        device_mappings(config),
        num_nodes=config.num_nodes,
        num_gpus_per_node=config.num_gpus_per_node,
        devices_per_worker={"actor_infer": config.actor_infer.num_gpus_per_worker},
    )


def cluster(config: TrainConfig) -> Cluster:
    """The local process or the Ray cluster the roles run on (``distributed``)."""
    return start_cluster(
        config.distributed,
        address=config.ray_address,
        num_nodes=config.num_nodes,
        num_gpus_per_node=config.num_gpus_per_node,
        env_vars=config.system_envs,
        rpc_timeout=config.rpc_timeout,
    )


def apply_system_envs(config: TrainConfig) -> None:
    """Set ``system_envs`` in this process's environment (its workers inherit them)."""
    os.environ.update({key: str(value) for key, value in config.system_envs.items()})


def check_envs(config: TrainConfig) -> None:
    """Build each env the run will play (every tag of both env managers, with its
    arguments) and reset it once, so that arguments an env rejects fail in seconds,
    before any model work, instead of as failed episodes.

    Raises:
        ConfigError: Naming the env, the arguments its message mentions (all of
            them when it mentions none) and the env's own message.
    """
    import re
    import traceback

    from agentgym.envs.adapter import make_text_env

    checked: set[str] = set()
    for key, section in (
        ("train_env_manager", config.train_env_manager),
        ("val_env_manager", config.val_env_manager),
    ):
        for tag in section.tags:
            entry = section.env_configs.get(tag)
            name, kwargs = tag, dict(config.env.kwargs)
            where = "env.kwargs"
            if entry is not None:
                name = entry.get("name", tag)
                kwargs = dict(entry.get("kwargs") or {})
                where = f"{key}.env_configs.{tag}.kwargs"
            if section.format_penalty is not None:
                kwargs["format_penalty"] = section.format_penalty
            fingerprint = repr((name, sorted(kwargs.items(), key=str)))
            if fingerprint in checked:
                continue
            checked.add(fingerprint)
            try:
                env = make_text_env(name, kwargs)
                try:
                    env.reset(seed=config.seed)
                finally:
                    env.close()
            except Exception as error:
                message = str(error) or type(error).__name__
                named = [k for k in kwargs if re.search(rf"\b{re.escape(str(k))}\b", message)]
                given = ", ".join(f"{where}.{k}={kwargs[k]!r}" for k in named or kwargs)
                where_raised = "".join(traceback.format_exception(error, limit=-3))
                raise ConfigError(
                    f"env {name!r} rejects its arguments ({given or 'none given'}): "
                    f"{type(error).__name__}: {message}\n{where_raised.rstrip()}"
                ) from None


def build_train(
    config: TrainConfig,
    resolved: dict[str, Any],
    *,
    resume_run_id: str | None = None,
    resume_step: int | None = None,
) -> tuple[GRPOConfig, TrainParts]:
    """The recipe's settings and parts from a checked config.

    Args:
        config: The checked config.
        resolved: The same config as plain data (saved with the run, given to trackers).
        resume_run_id: The tracker run to continue (from the checkpoint resumed).
        resume_step: The step resumed from (later metrics lines are dropped).
    """
    check_envs(config)
    grpo = grpo_config(config)
    path = model_path(config)
    workers = cluster(config)
    try:
        return grpo, _build_parts(config, resolved, grpo, path, workers, resume_run_id, resume_step)
    except BaseException:
        workers.shutdown()
        raise


def _build_parts(
    config: TrainConfig,
    resolved: dict[str, Any],
    grpo: GRPOConfig,
    path: Path,
    workers: Cluster,
    resume_run_id: str | None,
    resume_step: int | None,
) -> TrainParts:
    from transformers import AutoTokenizer

    tags = dict.fromkeys([*config.train_env_manager.tags, *config.val_env_manager.tags])
    configs = {**config.val_env_manager.env_configs, **config.train_env_manager.env_configs}
    envs = env_versions([configs.get(tag, {}).get("name", tag) for tag in tags])
    strategy = policy_strategy(config, path, needs_reference=grpo.needs_reference, cluster=workers)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    source: RolloutSource | None = None
    if config.mode == "train":  # the explorers generate: weights go to the job folder
        publisher = WeightPublisher(
            weight_channel(config),
            groups_per_step=config.train_env_manager.env_groups,
            version=(resume_step or 0) - 1,
        )
        if resume_step is None:  # explorers start from the trainer's weights: version 0
            publisher.publish(0, strategy.export_weights())
        backend: GenerationBackend = publisher
        source = buffer_source(config, publisher)
        print(f"mode=train: job folder {job_dir(config)}; model: {path}", flush=True)
    else:
        backend = run_engines(config, path, output_dir, workers)
        print(f"generation backend: {backend_name(config)}; model: {path}", flush=True)
    write_atomic(output_dir / RUN_CONFIG, yaml.safe_dump(resolved, sort_keys=False))
    write_json_atomic(
        output_dir / "meta.json",
        {"envs": envs, "model": str(path), "agentgym": _version("agentgym"), "config": resolved},
    )
    tracker = make_tracker(
        ["stdout", *(kind for kind in config.track_with if kind != "stdout")],  # always our lines
        logging_dir=config.logging_dir,
        exp_name=config.exp_name,
        config=resolved,
        tracker_kwargs=config.tracker_kwargs,
        run_id=resume_run_id,
        resume_step=resume_step,
        total_steps=config.max_steps,
        console_log=output_dir / CONSOLE_LOG_FILE,
        header={"envs": envs},
    )
    return TrainParts(
        strategy=strategy,
        backend=backend,
        chat=ChatTokenizer(tokenizer),
        train_manager=env_manager(
            config.train_env_manager,
            config,
            cluster=workers,
            additional_groups=(
                config.max_additional_running_prompts if config.is_use_additional_prompts else 0
            ),
        ),
        val_manager=env_manager(
            config.val_env_manager,
            config,
            cluster=workers,
            fixed_seeds=True,
            render_mode="rgb_array" if config.render_save_dir else None,
        ),
        train_rollout=rollout_config(config),
        val_rollout=rollout_config(config, validation=True),
        tracker=tracker,
        checkpoint_dir=output_dir / "checkpoints",
        render_dir=Path(config.render_save_dir) if config.render_save_dir else None,
        dump_dir=Path(config.rollout_dump_dir) if config.rollout_dump_dir else None,
        meta={"config": resolved, "tokenizer": str(path), "envs": envs},
        pad_token_id=pad,
        cluster=workers,
        critic=critic_strategy(config, path, workers) if config.adv_estimator == "gae" else None,
        kl_controller=kl_controller(grpo),
        reward_moments=RunningMoments(),
        source=source,
    )
