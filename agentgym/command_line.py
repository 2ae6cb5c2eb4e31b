"""The command line of ``agentgym train`` and ``agentgym eval``: ``key=value`` overrides
checked against the schema before Hydra composes anything, free-form keys opened,
and plugin envs given a config entry."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

import agentgym
from agentgym.errors import ConfigError, did_you_mean
from agentgym.fileio import new_folder
from agentgym.formats.native import CONFIG_GROUPS, file_arguments, is_native_file
from agentgym.schema import OPEN_MAPPINGS, known_paths
from agentgym.trainers.tracking import CONSOLE_LOG_FILE


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """A :class:`ConfigError` inside ends the process with one line on stderr and exit
    code 2 (the key named, no traceback)."""
    try:
        yield
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        _write_into_run_folder(f"config error: {error}")
        sys.exit(2)


def run_hydra(run: Callable[[DictConfig], None], config: str, arguments: Sequence[str]) -> None:
    """Compose ``configs/<config>.yaml`` with ``arguments`` (Hydra's command line:
    ``key=value`` overrides, ``--help``, ...) and call ``run`` on it, a config error
    ending the process as :func:`config_errors` says.

    Hydra unwraps the function it is given (``__wrapped__``): the job is named after
    ``run``'s module (the run folder's ``train.log``, ``eval.log``), as if ``run`` itself
    were decorated.
    """

    @functools.wraps(run)
    def checked(cfg: DictConfig) -> None:
        with config_errors():
            run(cfg)

    register_resolvers()
    sys.argv[1:] = list(arguments)  # Hydra reads its command line from sys.argv
    hydra.main(version_base=None, config_path="configs", config_name=config)(checked)()


def register_resolvers() -> None:
    """The interpolations the command line writes beyond Hydra's own: ``new_folder``
    (:func:`~agentgym.fileio.new_folder`, for :func:`own_run_folder`)."""
    OmegaConf.register_new_resolver("new_folder", new_folder, replace=True)


def _write_into_run_folder(line: str) -> None:
    """Append ``line`` to the console log of the run folder Hydra made for this run, if
    it made one: a folder a config error stopped says why."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    folder = Path(HydraConfig.get().runtime.output_dir)
    if folder.is_dir():
        with (folder / CONSOLE_LOG_FILE).open("a", encoding="utf-8") as log:
            log.write(line + "\n")


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


CONFIG_FLAGS = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name"}
"""Hydra's flags that name a config file's folder and name."""


def config_file_arguments(arguments: Sequence[str]) -> list[str]:
    """``arguments`` with a relative ``--config-path`` made absolute from the current
    folder (Hydra would take it from the package's), after checking that the file it
    names with ``--config-name`` exists. One of agentgym's own files (not ROLL's or
    Trinity-RFT's) becomes the arguments it stands for, before the command line's
    (:mod:`agentgym.formats.native`).

    Raises:
        ConfigError: When the folder or the file does not exist, naming what was looked for.
    """
    items, given, rest = list(arguments), {}, []
    while items:
        item = items.pop(0)
        flag, equals, value = item.partition("=")
        if flag in CONFIG_FLAGS:
            given[CONFIG_FLAGS[flag]] = value if equals else (items.pop(0) if items else "")
        else:
            rest.append(item)
    if "path" not in given:
        return list(arguments)
    folder = Path(given["path"]).expanduser().absolute()
    if not folder.is_dir():
        raise ConfigError(
            f"--config-path {given['path']}: no such folder ({folder}); give the folder that "
            "holds the config file, absolute or relative to where you run the command"
        )
    flags = ["--config-path", str(folder)]
    name = given.get("name")
    if name is None:
        return [*flags, *rest]
    file = folder / name
    if not file.suffix:
        file = file.with_suffix(".yaml")
    if not file.is_file():
        found = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError(
            f"--config-name {name}: no {file.name} in {folder}."
            f"{did_you_mean(name, found)} Config files there: {', '.join(found) or 'none'}"
        )
    loaded = OmegaConf.to_container(OmegaConf.load(file))
    raw = {str(k): v for k, v in loaded.items()} if isinstance(loaded, dict) else {}
    if raw and is_native_file(raw):  # agentgym's keys: the arguments they stand for
        return open_mapping_overrides([*file_arguments(raw), *rest])
    return [*flags, "--config-name", name, *rest]


RUN_FOLDER = "outputs/train/${exp_name}/${now:%Y-%m-%d_%H-%M-%S}"
"""``output_dir``'s default (configs/config.yaml), the stem of the run folder a process
of ``agentgym train`` makes when it is given none (:func:`own_run_folder`)."""


PRINTS_ONLY = frozenset({"--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i"})
"""Hydra's flags that print and run nothing: no run folder is made for them."""


def own_run_folder(arguments: Sequence[str]) -> list[str]:
    """``arguments``, with an ``output_dir`` that this process makes new when they name
    none: the default run folder, for a decoupled job's process with ``-train``,
    ``-explore-<explorer name>`` or ``-serve-<explorer name>`` appended, and ``-2``,
    ``-3``, ... appended when another process made it first
    (:func:`~agentgym.fileio.new_folder`): two processes started in the same second
    from one folder (an explorer and a trainer that one command line starts, or one
    job's command run twice) never write into one folder."""
    given = {}
    for argument in arguments:
        key, equals, value = argument.partition("=")
        if equals and not argument.startswith("-"):
            given[key.lstrip("+~")] = value.strip("'\"")
    if "output_dir" in given or any(a.split("=")[0] in PRINTS_ONLY for a in arguments):
        return list(arguments)
    mode = given.get("mode", "both")
    name = given.get("explorer.name", "explorer")
    suffix = {"both": "", "bench": "", "train": "-train"}.get(mode, f"-{mode}-{name}")
    own = f"output_dir='${{new_folder:{RUN_FOLDER}{suffix}}}'"  # quoted: Hydra's grammar
    # beside the other overrides: Hydra's parser takes them as one run of arguments
    at = next((i for i, a in enumerate(arguments) if "=" in a and not a.startswith("-")), 0)
    return [*arguments[:at], own, *arguments[at:]]
