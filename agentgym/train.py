"""Train a policy with GRPO: ``python -m agentgym.train env=sokoban``.

The entry point only: the command line is checked (:mod:`agentgym.command_line`: a
misspelled key gets a close match before Hydra composes anything), the composed config
is translated (ROLL's and Trinity-RFT's files, the machine, the planner) and validated
by :mod:`agentgym.schema`, and :mod:`agentgym.runs` runs its mode.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentgym import stopping
from agentgym.command_line import (
    check_overrides,
    config_errors,
    config_file_arguments,
    own_run_folder,
    register_env_configs,
    run_hydra,
)
from agentgym.console import announce
from agentgym.errors import ConfigError
from agentgym.formats.fit import fit_to_machine
from agentgym.formats.roll import from_roll, interpolated_keys, is_roll_config
from agentgym.formats.roll_native import refuse_service_envs
from agentgym.formats.trinity import trinity_arguments
from agentgym.plan.auto import planned, strategy_block, wants_plan
from agentgym.plan.command import table
from agentgym.schema import TrainConfig, validate


def check(cfg: DictConfig) -> tuple[TrainConfig, dict[str, Any]]:
    """Validate the composed config; return it typed and as plain data.

    Raises:
        ConfigError: On the first invalid key or value.
    """
    if is_roll_config(cfg):  # a service ROLL's file needs is named before anything resolves
        refuse_service_envs(cfg)
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
            announce(f"ROLL config: {note}")
        fitting = fit_to_machine(translation.config)  # pure translation, then this machine
        if fitting.changes:
            announce(fitting.table())
        resolved = fitting.config
    if wants_plan(resolved):  # actor_train.strategy_args.strategy_config=auto
        resolved, plans = planned(resolved)
        announce(table(plans, 5))
        announce(
            "strategy_config=auto: the first row ("
            + ", ".join(f"{k}={v}" for k, v in strategy_block(plans[0]).items())
            + f", micro-batch {plans[0].layout.micro_batch_size}, accumulation "
            f"{plans[0].gradient_accumulation_steps})"
        )
    return validate(resolved), resolved


def run(cfg: DictConfig) -> None:
    """Check the config, then run its mode (:func:`agentgym.runs.run_mode`)."""
    started = time.perf_counter()
    config, resolved = check(cfg)
    # the training stack (torch, transformers, the engines) loads once the config is
    # checked, so that a config error comes in seconds
    from agentgym.runs import run_mode

    run_mode(config, resolved, started)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m agentgym.train [key=value ...]`` (``agentgym train``): see
    ``configs/config.yaml``; ``argv`` replaces the command line's arguments."""
    arguments = sys.argv[1:] if argv is None else list(argv)
    # SIGTERM unwinds like Ctrl-C, so the generation engine's process is shut down too
    stopping.install()
    try:
        register_env_configs()
        with config_errors():
            arguments = config_file_arguments(arguments)
            trinity = trinity_arguments(arguments)
            if trinity is not None:  # one of Trinity-RFT's files: agentgym's arguments
                arguments, translation = trinity
                for note in translation.notes:
                    announce(f"Trinity config: {note}")
                if translation.changes:
                    announce(translation.table())
            arguments = check_overrides(own_run_folder(arguments))
        run_hydra(run, "config", arguments)
    except KeyboardInterrupt as interrupt:  # before run() knew the run
        sys.exit(stopping.report(interrupt))


if __name__ == "__main__":
    main()
