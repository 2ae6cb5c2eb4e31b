"""Train a policy with GRPO: ``python -m agentgym.train env=sokoban``.

This module turns the Hydra config (``configs/config.yaml``) into the recipe's
parts, checks the config's values first (a bad value fails at start, naming
the key, the value and the valid options), then runs
:func:`agentgym.trainers.grpo.train`.
"""

from __future__ import annotations

import difflib
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

import agentgym
from agentgym.models.tiny import TinyModelSpec, ensure_tiny_model
from agentgym.models.warmstart import WarmStartSpec
from agentgym.plot import plot_validation, read_metrics
from agentgym.rollout.backends import BACKENDS, SamplingParams, make_backend, resolve_backend
from agentgym.rollout.backends.hf import HFBackend
from agentgym.rollout.chat import PREFIX_CHECK_MODES, ChatTokenizer
from agentgym.rollout.env_manager import EnvConfig, EnvManager
from agentgym.rollout.loop import RolloutConfig
from agentgym.trainers.advantages import ADVANTAGE_ESTIMATORS, GROUPINGS, NORMALIZATIONS
from agentgym.trainers.grpo import OLD_LOGPROBS, GRPOConfig, TrainParts, train
from agentgym.trainers.losses import KL_PENALTIES, LOSS_AGG_MODES
from agentgym.trainers.strategy import TorchStrategy
from agentgym.trainers.tracking import METRICS_FILE, TRACKERS, make_tracker
from agentgym.trajectory import SAMPLE_MODES, STEP_SCORES

STRATEGIES = ("torch",)


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, the value and the fix."""


def register_env_configs() -> None:
    """Give every registered env without a ``configs/env/*.yaml`` a default config
    entry, so that ``env=<plugin name>`` works for entry-point plugins too."""
    store = ConfigStore.instance()
    shipped = {p.stem for p in (Path(__file__).parent / "configs" / "env").glob("*.yaml")}
    for name in agentgym.list_envs():
        if name not in shipped:
            store.store(group="env", name=name, node={"name": name, "kwargs": {}})


def _choice(key: str, value: Any, options: Any) -> None:
    if value not in options:
        close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{key}={value!r} is not valid; valid options: {list(options)}.{hint}")


def _positive(cfg: DictConfig, *keys: str, allow_zero: bool = False) -> None:
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if not isinstance(value, int) or value < (0 if allow_zero else 1):
            bound = ">= 0" if allow_zero else ">= 1"
            raise ConfigError(f"{key}={value!r} must be an integer {bound}")


def check_config(cfg: DictConfig) -> None:
    """Fail fast on invalid values, naming the key, the value and the valid options.

    Raises:
        ConfigError: On the first invalid value.
    """
    _positive(
        cfg,
        "max_steps",
        "save_steps",
        "logging_steps",
        "rollout_batch_size",
        "val_batch_size",
        "sequence_length",
        "max_turns",
        "ppo_epochs",
        "train_env_manager.env_groups",
        "train_env_manager.group_size",
        "train_env_manager.max_traj_per_env",
        "val_env_manager.env_groups",
        "val_env_manager.group_size",
        "actor_train.training_args.per_device_train_batch_size",
        "actor_train.training_args.gradient_accumulation_steps",
    )
    _positive(cfg, "eval_steps", "actor_train.training_args.warmup_steps", allow_zero=True)
    _choice("reward_normalization.grouping", cfg.reward_normalization.grouping, GROUPINGS)
    _choice("reward_normalization.method", cfg.reward_normalization.method, NORMALIZATIONS)
    _choice("adv_estimator", cfg.adv_estimator, sorted(ADVANTAGE_ESTIMATORS))
    _choice("loss_agg_mode", cfg.loss_agg_mode, LOSS_AGG_MODES)
    _choice("kl_penalty", cfg.kl_penalty, KL_PENALTIES)
    _choice("rollout_mode", cfg.rollout_mode, SAMPLE_MODES)
    _choice("step_score", cfg.step_score, STEP_SCORES)
    _choice("prefix_check", cfg.prefix_check, PREFIX_CHECK_MODES)
    _choice("old_logprobs", cfg.old_logprobs, OLD_LOGPROBS)
    _choice("generation.backend", cfg.generation.backend, BACKENDS)
    _choice("actor_train.strategy_args.strategy_name", cfg.strategy.strategy_name, STRATEGIES)
    for kind in [cfg.track_with] if isinstance(cfg.track_with, str) else cfg.track_with:
        _choice("track_with", kind, TRACKERS)
    manager = cfg.train_env_manager
    per_step = manager.env_groups * manager.group_size * manager.max_traj_per_env
    if cfg.rollout_batch_size != per_step:
        raise ConfigError(
            f"rollout_batch_size={cfg.rollout_batch_size} must equal train_env_manager "
            f"env_groups × group_size × max_traj_per_env = {manager.env_groups} × "
            f"{manager.group_size} × {manager.max_traj_per_env} = {per_step}"
        )
    args = cfg.actor_train.training_args
    minibatch = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if cfg.rollout_mode == "trajectory" and cfg.rollout_batch_size % minibatch:
        raise ConfigError(
            f"rollout_batch_size={cfg.rollout_batch_size} is not divisible by "
            f"per_device_train_batch_size × gradient_accumulation_steps = {minibatch}"
        )
    if cfg.val_env_manager.env_groups * cfg.val_env_manager.group_size != cfg.val_batch_size:
        raise ConfigError(
            f"val_batch_size={cfg.val_batch_size} must equal val_env_manager env_groups × "
            f"group_size = {cfg.val_env_manager.env_groups} × {cfg.val_env_manager.group_size}"
        )
    if cfg.step_advantage_weight < 0 or not 0 < cfg.step_gamma <= 1:
        raise ConfigError(
            f"step_advantage_weight={cfg.step_advantage_weight} must be >= 0 and "
            f"step_gamma={cfg.step_gamma} in (0, 1]"
        )
    if cfg.step_advantage_weight and cfg.rollout_mode != "step":
        raise ConfigError(
            f"step_advantage_weight={cfg.step_advantage_weight} (GiGPO) needs one sample per "
            f"turn: set rollout_mode=step (it is {cfg.rollout_mode!r})"
        )
    if cfg.tis_cap is not None and cfg.old_logprobs != "trainer":
        raise ConfigError(
            f"tis_cap={cfg.tis_cap} reweights by the trainer/engine logprob gap, which needs π_old "
            f"recomputed by the trainer: set old_logprobs=trainer (it is {cfg.old_logprobs!r})"
        )
    if cfg.generation.max_new_tokens >= cfg.sequence_length:
        raise ConfigError(
            f"generation.max_new_tokens={cfg.generation.max_new_tokens} leaves no room for a "
            f"prompt in sequence_length={cfg.sequence_length}"
        )


def model_path(model: DictConfig) -> Path:
    """The model folder: ``model.path``, or the tiny model built (once) from ``model.tiny``
    and warm-started as ``model.warm_start`` says (null: random weights)."""
    if model.path:
        path = Path(str(model.path)).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"model.path={model.path!r} is not a model folder (no config.json); "
                "models are loaded from local folders, never downloaded"
            )
        return path
    spec = TinyModelSpec(**OmegaConf.to_container(model.tiny, resolve=True))  # type: ignore[arg-type]
    warm_start = None
    if model.warm_start is not None:
        warm = OmegaConf.to_container(model.warm_start, resolve=True)
        warm_start = WarmStartSpec(**warm)  # type: ignore[arg-type]
    return ensure_tiny_model(spec, str(model.cache_dir), warm_start=warm_start)


def env_manager(section: DictConfig, cfg: DictConfig, **kwargs: Any) -> EnvManager:
    """An :class:`EnvManager` from a ``*_env_manager`` section (ROLL's keys)."""
    listed = section.get("env_configs")
    configs: dict[str, Any] = (
        OmegaConf.to_container(listed, resolve=True) if listed else {}  # type: ignore[assignment]
    )
    env_configs: dict[str, EnvConfig | dict[str, Any]] = dict(configs)
    env_kwargs: dict[str, Any] = OmegaConf.to_container(cfg.env.kwargs, resolve=True)  # type: ignore[assignment]
    for tag in section.tags:
        env_configs.setdefault(str(tag), EnvConfig(str(tag), env_kwargs))
    return EnvManager(
        tags=[str(tag) for tag in section.tags],
        env_groups=section.env_groups,
        group_size=section.group_size,
        n_groups=list(section.n_groups) if section.n_groups is not None else None,
        env_configs=env_configs,
        seed=cfg.seed,
        max_traj_per_env=section.max_traj_per_env,
        format_penalty=section.format_penalty,
        **kwargs,
    )


def build(cfg: DictConfig) -> tuple[GRPOConfig, TrainParts]:
    """Build the recipe's config and parts from a checked config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(cfg.model)
    args = cfg.actor_train.training_args
    strategy = TorchStrategy(
        path,
        dtype=cfg.model.dtype,
        device=cfg.model.device,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        warmup_steps=args.warmup_steps,
        max_grad_norm=args.max_grad_norm,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    generation = cfg.generation
    backend_name = resolve_backend(generation.backend)
    if backend_name == "hf":
        backend: Any = HFBackend(
            strategy.model,
            pad_token_id=tokenizer.pad_token_id,
            max_batch_size=generation.max_batch_size,
        )
    else:
        backend = make_backend(
            backend_name,
            str(path),
            dtype=cfg.model.dtype,
            device=cfg.model.device,
            max_model_len=cfg.sequence_length,
            seed=cfg.seed,
            max_batch_size=generation.max_batch_size,
            base_url=generation.base_url,
            served_model_name=generation.served_model_name,
        )
    print(f"generation backend: {backend_name}; model: {path}")
    sampling = SamplingParams(
        temperature=generation.temperature,
        top_p=generation.top_p,
        top_k=generation.top_k,
        max_new_tokens=generation.max_new_tokens,
        seed=cfg.seed,
    )
    train_rollout = RolloutConfig(
        mode=cfg.rollout_mode,
        max_turns=cfg.max_turns,
        sequence_length=cfg.sequence_length,
        sampling=sampling,
        history_length=cfg.history_length,
        prefix_check=cfg.prefix_check,
    )
    val_rollout = RolloutConfig(
        mode=cfg.rollout_mode,
        max_turns=cfg.max_turns,
        sequence_length=cfg.sequence_length,
        sampling=SamplingParams(
            temperature=cfg.validation.temperature,
            top_p=generation.top_p,
            top_k=generation.top_k,
            max_new_tokens=generation.max_new_tokens,
            seed=cfg.seed + 1,
        ),
        history_length=cfg.history_length,
        prefix_check=cfg.prefix_check,
        record_frames=bool(cfg.render_save_dir),
    )
    grpo = GRPOConfig(
        max_steps=cfg.max_steps,
        save_steps=cfg.save_steps,
        logging_steps=cfg.logging_steps,
        eval_steps=cfg.eval_steps,
        ppo_epochs=cfg.ppo_epochs,
        micro_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        adv_estimator=cfg.adv_estimator,
        gamma=cfg.gamma,
        whiten_advantages=cfg.whiten_advantages,
        reward_clip=cfg.reward_clip,
        advantage_clip=cfg.advantage_clip,
        grouping=cfg.reward_normalization.grouping,
        normalization=cfg.reward_normalization.method,
        drop_zero_variance_groups=cfg.drop_zero_variance_groups,
        clip_ratio_low=cfg.clip_ratio_low,
        clip_ratio_high=cfg.clip_ratio_high,
        dual_clip_ratio_c=cfg.dual_clip_ratio_c,
        loss_agg_mode=cfg.loss_agg_mode,
        use_kl_loss=cfg.use_kl_loss,
        kl_loss_coef=cfg.kl_loss_coef,
        kl_penalty=cfg.kl_penalty,
        add_token_level_kl=cfg.add_token_level_kl,
        init_kl_coef=cfg.init_kl_coef,
        entropy_loss_coef=cfg.entropy_loss_coef,
        tis_cap=cfg.tis_cap,
        val_renders=cfg.validation.renders,
        seed=cfg.seed,
        step_score=cfg.step_score,
        step_advantage_weight=cfg.step_advantage_weight,
        step_gamma=cfg.step_gamma,
        old_logprobs=cfg.old_logprobs,
    )
    reference = None
    if grpo.needs_reference:
        reference = AutoModelForCausalLM.from_pretrained(str(path)).eval().requires_grad_(False)
    output_dir = Path(cfg.output_dir)
    run_id = _saved_run_id(output_dir / "checkpoints") if cfg.resume_from_checkpoint else None
    resolved = OmegaConf.to_container(cfg, resolve=True)
    tracker = make_tracker(
        list(cfg.track_with),
        logging_dir=cfg.logging_dir,
        exp_name=cfg.exp_name,
        config=resolved,  # type: ignore[arg-type]
        tracker_kwargs=OmegaConf.to_container(cfg.tracker_kwargs, resolve=True),  # type: ignore[arg-type]
        run_id=run_id,
        resume_step=_saved_step(output_dir / "checkpoints") if cfg.resume_from_checkpoint else None,
    )
    parts = TrainParts(
        strategy=strategy,
        reference=reference,
        backend=backend,
        chat=ChatTokenizer(tokenizer),
        train_manager=env_manager(cfg.train_env_manager, cfg),
        val_manager=env_manager(
            cfg.val_env_manager,
            cfg,
            fixed_seeds=True,
            render_mode="rgb_array" if cfg.render_save_dir else None,
        ),
        train_rollout=train_rollout,
        val_rollout=val_rollout,
        tracker=tracker,
        checkpoint_dir=output_dir / "checkpoints",
        render_dir=Path(cfg.render_save_dir) if cfg.render_save_dir else None,
        dump_dir=Path(cfg.rollout_dump_dir) if cfg.rollout_dump_dir else None,
        meta={"config": resolved, "tokenizer": str(path)},
        pad_token_id=tokenizer.pad_token_id,
    )
    return grpo, parts


def _trainer_state(root: Path) -> dict[str, Any] | None:
    from agentgym.trainers.checkpoint import latest_checkpoint

    latest = latest_checkpoint(root) if root.exists() else None
    if latest is None:
        return None
    state: dict[str, Any] = json.loads((latest / "trainer_state.json").read_text())
    return state


def _saved_run_id(root: Path) -> str | None:
    state = _trainer_state(root)
    return None if state is None else state.get("tracker_run_id")


def _saved_step(root: Path) -> int | None:
    state = _trainer_state(root)
    return None if state is None else int(state["step"])


register_env_configs()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    sys.exit(128 + signum)


@hydra.main(version_base=None, config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: see ``configs/config.yaml``."""
    started = time.perf_counter()
    # SIGTERM unwinds like Ctrl-C, so the generation engine's process is shut down too
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    check_config(cfg)
    grpo, parts = build(cfg)
    resume = cfg.resume_from_checkpoint
    train(grpo, parts, resume=str(resume) if isinstance(resume, str) else bool(resume))
    metrics_file = Path(cfg.logging_dir) / METRICS_FILE
    success = read_metrics(metrics_file, ["val/all/success"])["val/all/success"]
    if success:
        (first_step, first), (last_step, last) = success[0], success[-1]
        print(
            f"validation success: {first:.3f} at step {first_step:g} -> "
            f"{last:.3f} at step {last_step:g} ({(last - first) * 100:+.1f} points)"
        )
    print(f"finished in {time.perf_counter() - started:.0f} s; output: {cfg.output_dir}")
    print(f"metrics: {metrics_file}")
    plot = plot_validation(metrics_file, Path(cfg.output_dir) / "validation.png")
    if plot is not None:
        print(f"plot: {plot}")
    print(f"checkpoints: {parts.checkpoint_dir}")
    if parts.render_dir is not None:
        print(f"renders: {parts.render_dir / 'index.html'}")


if __name__ == "__main__":
    main()
