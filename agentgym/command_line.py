"""The command line of ``agentgym train`` and ``agentgym eval``: ``key=value`` overrides
checked against the schema before Hydra composes anything, free-form keys opened,
and plugin envs given a config entry."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from hydra.core.config_store import ConfigStore

import agentgym
from agentgym.errors import ConfigError, did_you_mean
from agentgym.schema import OPEN_MAPPINGS, known_paths

CONFIG_GROUPS = ("env", "model", "generation", "strategy", "tracker")


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """A :class:`ConfigError` inside ends the process with one line on stderr and exit
    code 2 (the key named, no traceback)."""
    try:
        yield
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        sys.exit(2)


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
