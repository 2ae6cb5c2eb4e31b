"""Train a policy with GRPO: ``python -m agentgym.train env=sokoban``.

The entry point only: the command line is checked (a misspelled key gets a
close match before Hydra composes anything), the composed config is validated
by :mod:`agentgym.schema`, :mod:`agentgym.builders` makes the parts, and
:func:`agentgym.trainers.grpo.train` runs the recipe.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

import agentgym
from agentgym import stopping
from agentgym.errors import ConfigError, did_you_mean
from agentgym.formats.fit import fit_to_machine
from agentgym.formats.roll import from_roll, interpolated_keys, is_roll_config
from agentgym.formats.trinity import trinity_arguments
from agentgym.plan.auto import planned, strategy_block, wants_plan
from agentgym.plan.command import table
from agentgym.schema import OPEN_MAPPINGS, TrainConfig, known_paths, validate

CONFIG_GROUPS = ("env", "model", "generation", "strategy", "tracker")


def register_env_configs() -> None:
    """Give every registered env without a ``configs/env/*.yaml`` a default config
    entry, so that ``env=<plugin name>`` works for entry-point plugins too."""
    store = ConfigStore.instance()
    shipped = {p.stem for p in (Path(__file__).parent / "configs" / "env").glob("*.yaml")}
    for name in agentgym.list_envs():
        if name not in shipped:
            store.store(group="env", name=name, node={"name": name, "kwargs": {}})


def open_mapping_overrides(arguments: Sequence[str]) -> list[str]:
    """Keys under free-form mappings (``env.kwargs.*``, ``strategy_config.*``, ...)
    become ``++key=value``, so a new constructor argument needs no ``+``."""
    opened = []
    for argument in arguments:
        key, equals, value = argument.partition("=")
        bare = key.lstrip("+~")
        if equals and not key.startswith("~") and bare.startswith(OPEN_PREFIXES):
            opened.append(f"++{bare}={value}")
        else:
            opened.append(argument)
    return opened


OPEN_PREFIXES = tuple(f"{prefix}." for prefix in OPEN_MAPPINGS)


def check_overrides(arguments: Sequence[str]) -> list[str]:
    """Check the command line's ``key=value`` overrides against the schema.

    Keys under free-form mappings (``env.kwargs.*``, ``strategy_config.*``, ...)
    become ``++key=value``, so a new constructor argument needs no ``+``. With a
    config file of one's own (``--config-name``/``-cn``: one of ROLL's agentic
    files, say) the keys are that file's (``custom_envs.*``); they are checked
    once the file is translated and validated (:func:`check`), not here.

    Returns:
        The arguments to hand to Hydra.

    Raises:
        ConfigError: On an unknown key, with the closest known key.
    """
    if any(a in ("--config-name", "-cn") or a.startswith("--config-name=") for a in arguments):
        return open_mapping_overrides(arguments)
    known = set(known_paths())
    for argument in arguments:
        key, equals, _ = argument.partition("=")
        bare = key.lstrip("+~")
        if argument.startswith("-") or not equals or "@" in bare or bare.startswith("hydra"):
            continue
        if bare not in CONFIG_GROUPS and bare not in known and not bare.startswith(OPEN_PREFIXES):
            hint = did_you_mean(bare, known) or did_you_mean(bare.split(".")[-1], known)
            raise ConfigError(f"unknown key {bare!r} in {argument!r}.{hint}")
    return open_mapping_overrides(arguments)


def check(cfg: DictConfig) -> tuple[TrainConfig, dict[str, Any]]:
    """Validate the composed config; return it typed and as plain data.

    Raises:
        ConfigError: On the first invalid key or value.
    """
    missing = sorted(OmegaConf.missing_keys(cfg))
    if "env.name" in missing:  # env=gymnasium names no env by itself
        raise ConfigError(
            "env=gymnasium needs the env's id: add env.name=<module>:<namespace>/<Name>-v<N> "
            "(the module, imported first, registers the id), e.g. "
            "env.name=my_package.envs:my_ns/Coin-v0"
        )
    if missing:
        raise ConfigError(f"the config leaves {', '.join(missing)} unset ('???'): set each")
    try:
        resolved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    except Exception as error:  # an interpolation that does not resolve
        raise ConfigError(f"the config does not resolve: {error}") from None
    if is_roll_config(resolved):  # one of ROLL's agentic files (--config-path/--config-name)
        translation = from_roll(resolved, helpers=interpolated_keys(cfg))
        for note in translation.notes:
            print(f"ROLL config: {note}", flush=True)
        fitting = fit_to_machine(translation.config)  # pure translation, then this machine
        if fitting.changes:
            print(fitting.table(), flush=True)
        resolved = fitting.config
    if wants_plan(resolved):  # actor_train.strategy_args.strategy_config=auto
        resolved, plans = planned(resolved)
        print(table(plans, 5), flush=True)
        print(
            "strategy_config=auto: the first row ("
            + ", ".join(f"{k}={v}" for k, v in strategy_block(plans[0]).items())
            + f", micro-batch {plans[0].layout.micro_batch_size}, accumulation "
            f"{plans[0].gradient_accumulation_steps})",
            flush=True,
        )
    return validate(resolved), resolved


def resume_state(config: TrainConfig) -> dict[str, Any] | None:
    """The trainer state of the checkpoint a resume will load (None when not resuming).

    Raises:
        ConfigError: When resuming and there is no checkpoint, saying what to pass.
    """
    from agentgym.trainers.run_state import find_checkpoint

    if config.resume_from_checkpoint is False:
        return None
    try:
        return find_checkpoint(
            Path(config.output_dir) / "checkpoints", config.resume_from_checkpoint
        )[1]
    except FileNotFoundError as error:
        raise ConfigError(str(error)) from None


def run(cfg: DictConfig) -> None:
    """Check the config, build the parts, train, and print the end-of-run summary.

    Ctrl-C or SIGTERM, in any phase, ends it with one line on stderr (where it
    stopped, how to go on: :mod:`agentgym.stopping`) and exit code 130 or 143.
    """
    from agentgym.build.model import apply_system_envs
    from agentgym.build.train import build_train
    from agentgym.console import LIBRARY_LOG_FILE, echo, library_logs
    from agentgym.plot import plot_validation, read_metrics
    from agentgym.trainers.grpo import train
    from agentgym.trainers.tracking import CONSOLE_LOG_FILE, METRICS_FILE

    started = time.perf_counter()
    config, resolved = check(cfg)
    apply_system_envs(config)
    if config.mode == "explore":
        run_explorer(config, resolved, started)
        return
    if config.mode == "bench":  # evaluate a finished run's checkpoints (docs/bench.md)
        from agentgym.bench import run_bench
        from agentgym.eval import given_keys

        run_bench(config, given_keys(), started)
        return
    state = resume_state(config)
    output_dir = Path(config.output_dir)
    stopping.describe(
        stopping.Run(
            output_dir=str(config.output_dir),
            arguments=tuple(sys.argv[1:]),
            start_step=int(state["step"]) if state else 0,
            console_log=output_dir / CONSOLE_LOG_FILE,
        )
    )
    try:
        with library_logs(output_dir / LIBRARY_LOG_FILE) as library:
            grpo, parts = build_train(
                config,
                resolved,
                resume_run_id=state.get("tracker_run_id") if state else None,
                resume_step=int(state["step"]) if state else None,
            )
            train(grpo, parts, resume=config.resume_from_checkpoint)
    except KeyboardInterrupt as interrupt:  # TrainingInterruptedError, or before train()
        sys.exit(stopping.report(interrupt))
    log = output_dir / CONSOLE_LOG_FILE
    metrics_file = Path(config.logging_dir) / METRICS_FILE
    success = read_metrics(metrics_file, ["val/all/success"])["val/all/success"]
    if success:
        (first_step, first), (last_step, last) = success[0], success[-1]
        echo(
            f"validation success: {first:.3f} at step {first_step:g} -> "
            f"{last:.3f} at step {last_step:g} ({(last - first) * 100:+.1f} points)",
            log,
        )
    echo(f"finished in {time.perf_counter() - started:.0f} s; output: {output_dir}", log)
    echo(f"metrics: {metrics_file}", log)
    plot = plot_validation(metrics_file, output_dir / "validation.png")
    if plot is not None:
        echo(f"plot: {plot}", log)
    echo(f"checkpoints: {parts.checkpoint_dir}", log)
    if parts.render_dir is not None:
        echo(f"renders: {parts.render_dir / 'index.html'}", log)
    echo(library.summary(), log)


def run_explorer(config: TrainConfig, resolved: dict[str, Any], started: float) -> None:
    """``mode: explore``: build the envs and engines, explore until the trainer finishes."""
    from agentgym.build.explore import build_explorer
    from agentgym.console import LIBRARY_LOG_FILE, echo, library_logs
    from agentgym.job.explore import explore
    from agentgym.trainers.tracking import CONSOLE_LOG_FILE, METRICS_FILE

    output_dir = Path(config.output_dir)
    log = output_dir / CONSOLE_LOG_FILE
    stopping.describe(
        stopping.Run(
            output_dir=str(output_dir),
            arguments=tuple(sys.argv[1:]),
            start_step=0,
            console_log=log,
        )
    )
    try:
        with library_logs(output_dir / LIBRARY_LOG_FILE) as library:
            batches = explore(build_explorer(config, resolved))
    except KeyboardInterrupt as interrupt:
        sys.exit(stopping.report(interrupt))
    echo(
        f"explorer {config.explorer.name}: {batches} batches in "
        f"{time.perf_counter() - started:.0f} s; output: {output_dir}",
        log,
    )
    echo(f"metrics: {Path(config.logging_dir) / METRICS_FILE}", log)
    echo(library.summary(), log)


@hydra.main(version_base=None, config_path="configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    from agentgym.trainers.batch_prep import RolloutFailedError

    try:
        run(cfg)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        sys.exit(2)
    except RolloutFailedError as error:
        print(f"run stopped: {error}", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    """``python -m agentgym.train [key=value ...]``: see ``configs/config.yaml``."""
    # SIGTERM unwinds like Ctrl-C, so the generation engine's process is shut down too
    stopping.install()
    try:
        register_env_configs()
        try:
            trinity = trinity_arguments(sys.argv[1:])
            if trinity is not None:  # one of Trinity-RFT's files: agentgym's arguments
                arguments, translation = trinity
                for note in translation.notes:
                    print(f"Trinity config: {note}", flush=True)
                if translation.changes:
                    print(translation.table(), flush=True)
                sys.argv[1:] = arguments
            sys.argv[1:] = check_overrides(sys.argv[1:])
        except ConfigError as error:
            print(f"config error: {error}", file=sys.stderr)
            sys.exit(2)
        _hydra_main()
    except KeyboardInterrupt as interrupt:  # before run() knew the run
        sys.exit(stopping.report(interrupt))


if __name__ == "__main__":
    main()
