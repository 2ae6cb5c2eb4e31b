"""The env registry: short names, Gymnasium ids and third-party plugins.

Every env has a short name for configs (``sokoban``) and a Gymnasium id in
the ``agentgym/`` namespace (``agentgym/Sokoban-v0``), so both
``agentgym.make("sokoban")`` and ``gymnasium.make("agentgym/Sokoban-v0")``
work after ``import agentgym``. Entry points are ``"module:Class"`` strings,
imported only when an env is made.

Third-party packages add envs through the ``agentgym.envs`` entry-point
group: the entry point's name is the short name and its value the
``"module:Class"``. They are discovered on import and again whenever a name
is not found; a plugin that fails to load raises :class:`PluginError` naming
it, never silently. Any other Gymnasium id (``"my_pkg/Coin-v0"``, or
``"my_pkg.envs:Coin-v0"`` to import the registering module first) is made
through Gymnasium's own registry.

An id's version (``-v1``) changes whenever the env's rules change; the short
name always points to the newest. :func:`env_versions` gives, for a run's
records, each env's full id and its generator version.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import gymnasium
from gymnasium.envs.registration import load_env_creator

from agentgym.errors import did_you_mean

NAMESPACE = "agentgym"
ENTRY_POINT_GROUP = "agentgym.envs"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


class UnknownEnvError(ValueError):
    """No env is registered under the requested name or id."""


class UnknownEnvArgumentError(TypeError):
    """An env was given a constructor argument it does not take.

    Attributes:
        argument: The argument's name.
        valid: The arguments the env takes.
        hint: A close match, as a sentence (empty without one).
    """

    def __init__(self, message: str, argument: str, valid: list[str], hint: str) -> None:
        super().__init__(message)
        self.argument = argument
        self.valid = valid
        self.hint = hint


class PluginError(RuntimeError):
    """A third-party env plugin could not be loaded or registered."""


@dataclass(frozen=True)
class EnvSpec:
    """A registered env.

    Attributes:
        name: Short name used in configs (``sokoban``).
        id: Gymnasium id (``agentgym/Sokoban-v0``).
        entry_point: ``"module:Class"``, or a callable returning the env.
        kwargs: Default constructor arguments.
        plugin: ``"distribution (entry point value)"`` for plugins; None for
            envs registered in code.
    """

    name: str
    id: str
    entry_point: str | Callable[..., gymnasium.Env[Any, Any]]
    kwargs: dict[str, Any] = field(default_factory=dict)
    plugin: str | None = None


_SPECS: dict[str, EnvSpec] = {}
_BY_ID: dict[str, str] = {}
_PLUGIN_CONFLICTS: dict[str, str] = {}


def default_id(name: str) -> str:
    """The Gymnasium id given to a short name: ``frozen_lake`` -> ``agentgym/FrozenLake-v0``."""
    camel = "".join(part[:1].upper() + part[1:] for part in re.split(r"[_\-.]", name) if part)
    return f"{NAMESPACE}/{camel}-v0"


def register(
    name: str,
    entry_point: str | Callable[..., gymnasium.Env[Any, Any]],
    *,
    id: str | None = None,
    kwargs: dict[str, Any] | None = None,
    plugin: str | None = None,
) -> EnvSpec:
    """Register an env under a short name and a Gymnasium id.

    Args:
        name: Short name for configs; letters, digits, ``_``, ``-``, ``.``.
        entry_point: ``"module:Class"`` (imported when the env is made) or a
            callable that builds the env from keyword arguments.
        id: Gymnasium id; default :func:`default_id` of ``name``. Must be in
            the ``agentgym/`` namespace.
        kwargs: Default constructor arguments; ``make``'s keyword arguments
            override them.
        plugin: Where a plugin came from, for error messages.

    Returns:
        The new spec.

    Raises:
        ValueError: If the name or id is malformed or already taken.
    """
    if not _NAME.match(name):
        raise ValueError(
            f"Invalid env name {name!r}: use letters, digits, '_', '-' or '.', "
            "starting with a letter"
        )
    env_id = id if id is not None else default_id(name)
    if not env_id.startswith(f"{NAMESPACE}/"):
        raise ValueError(f"Env id {env_id!r} must be in the {NAMESPACE!r} namespace")
    if name in _SPECS or env_id in _BY_ID:
        taken = _SPECS.get(name) or _SPECS[_BY_ID[env_id]]
        raise ValueError(
            f"Env {name!r} ({env_id}) clashes with the registered {taken.name!r} ({taken.id}); "
            "choose another name"
        )
    spec = EnvSpec(name, env_id, entry_point, dict(kwargs or {}), plugin)
    gymnasium.register(id=env_id, entry_point=entry_point, kwargs=spec.kwargs)
    _SPECS[name] = spec
    _BY_ID[env_id] = name
    return spec


def unregister(name: str) -> None:
    """Remove an env registered under ``name`` (from Gymnasium's registry too).

    Raises:
        UnknownEnvError: If ``name`` is not registered.
    """
    if name not in _SPECS:
        raise UnknownEnvError(f"Cannot unregister {name!r}: not registered")
    removed = _SPECS.pop(name)
    del _BY_ID[removed.id]
    gymnasium.registry.pop(removed.id, None)


class _PluginEntryPoint:
    """Loads a plugin's env class on first use, and names the plugin if that fails."""

    def __init__(self, entry_point: importlib.metadata.EntryPoint) -> None:
        self.entry_point = entry_point
        dist = entry_point.dist.name if entry_point.dist is not None else "unknown distribution"
        self.origin = f"{dist} ({entry_point.name} = {entry_point.value!r})"

    def load(self) -> Callable[..., gymnasium.Env[Any, Any]]:
        try:
            env_cls = self.entry_point.load()
        except Exception as exc:
            raise PluginError(
                f"agentgym env plugin {self.origin} failed to load: {type(exc).__name__}: {exc}"
            ) from exc
        if not (isinstance(env_cls, type) and issubclass(env_cls, gymnasium.Env)):
            raise PluginError(
                f"agentgym env plugin {self.origin} must point to a gymnasium.Env subclass "
                f"(usually an agentgym TextEnv), got {env_cls!r}"
            )
        return env_cls

    def __call__(self, **kwargs: Any) -> gymnasium.Env[Any, Any]:
        return self.load()(**kwargs)


def discover_plugins() -> None:
    """Register envs of installed packages' ``agentgym.envs`` entry points.

    Nothing is imported here; a plugin's module is imported when its env is
    made. A plugin whose name clashes with a registered env is remembered and
    reported when that name is used.
    """
    _PLUGIN_CONFLICTS.clear()
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        loader = _PluginEntryPoint(entry_point)
        known = _SPECS.get(entry_point.name)
        if known is not None:
            if known.plugin != loader.origin:
                _PLUGIN_CONFLICTS[entry_point.name] = (
                    f"agentgym env plugin {loader.origin} uses the name {entry_point.name!r}, "
                    f"which is already registered ({known.id}); rename or uninstall the plugin"
                )
            continue
        try:
            register(entry_point.name, loader, plugin=loader.origin)
        except ValueError as exc:
            _PLUGIN_CONFLICTS[entry_point.name] = f"agentgym env plugin {loader.origin}: {exc}"


def spec(name_or_id: str) -> EnvSpec:
    """Look up an env by short name or Gymnasium id.

    Raises:
        UnknownEnvError: If nothing matches; the message lists close matches.
        PluginError: If the name belongs to a plugin that clashes with
            another env.
    """
    found = _lookup(name_or_id)
    if found is None:
        discover_plugins()
        found = _lookup(name_or_id)
    if name_or_id in _PLUGIN_CONFLICTS:
        raise PluginError(_PLUGIN_CONFLICTS[name_or_id])
    if found is None:
        found = _gymnasium_spec(name_or_id)
    if found is None:
        candidates = sorted(_SPECS) + sorted(_BY_ID)
        hint = did_you_mean(name_or_id, candidates, n=3)
        raise UnknownEnvError(
            f"Unknown env {name_or_id!r}.{hint} Registered envs: {sorted(_SPECS)}. "
            f"Third-party envs are added through the {ENTRY_POINT_GROUP!r} entry-point group."
        )
    return found


def _lookup(name_or_id: str) -> EnvSpec | None:
    name = _BY_ID.get(name_or_id, name_or_id)
    return _SPECS.get(name)


def _gymnasium_spec(env_id: str) -> EnvSpec | None:
    """A Gymnasium id outside agentgym's namespace, as a spec; None if Gymnasium lacks it.

    ``"module:Id"`` imports ``module`` first (where such envs register themselves).
    """
    module, _, bare_id = env_id.rpartition(":")
    if bare_id.startswith(f"{NAMESPACE}/"):
        return None  # agentgym's namespace is ours alone
    if module:
        importlib.import_module(module)
    found = gymnasium.registry.get(bare_id)
    if found is None:
        return None
    return EnvSpec(bare_id, found.id, found.entry_point or "", dict(found.kwargs))


def make(name_or_id: str, **kwargs: Any) -> gymnasium.Env[str, str]:
    """Build an env by short name (``sokoban``) or Gymnasium id (``agentgym/Sokoban-v0``).

    Args:
        name_or_id: A registered short name or id, or any other Gymnasium id
            (``"my_pkg.envs:Coin-v0"`` imports ``my_pkg.envs`` first).
        **kwargs: Constructor arguments, overriding the registered defaults.

    Returns:
        The env, wrapped as ``gymnasium.make`` wraps it; ``env.unwrapped`` is
        the env class's instance (:func:`agentgym.envs.adapter.make_text_env`
        gives a :class:`~agentgym.envs.text_env.TextEnv` for any text env).

    Raises:
        UnknownEnvError: If the name is not registered (with close matches).
        PluginError: If the env comes from a plugin that fails to load.
        UnknownEnvArgumentError: If a keyword is not one of the env's arguments.
    """
    found = spec(name_or_id)
    if isinstance(found.entry_point, _PluginEntryPoint):
        found.entry_point.load()  # fail here, naming the plugin, before gymnasium wraps it
    try:
        env: gymnasium.Env[str, str] = gymnasium.make(found.id, **kwargs)
    except TypeError as exc:
        unexpected = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if unexpected is None:
            raise
        bad, valid = unexpected.group(1), constructor_arguments(found)
        if bad in valid:  # raised inside the constructor, not about make()'s arguments
            raise
        hint = did_you_mean(bad, valid, n=2)
        message = f"Env {found.name!r} got an unexpected argument {bad!r}.{hint}"
        message += f" Valid arguments: {valid}"
        raise UnknownEnvArgumentError(message, bad, valid, hint) from exc
    return env


def env_creator(env_spec: EnvSpec) -> Callable[..., gymnasium.Env[Any, Any]]:
    """The class (or factory) behind a spec, imported now.

    Raises:
        PluginError: If the env comes from a plugin that fails to load.
    """
    entry_point = env_spec.entry_point
    if isinstance(entry_point, _PluginEntryPoint):
        return entry_point.load()
    if isinstance(entry_point, str):
        creator: Any = load_env_creator(entry_point)
        return creator
    return entry_point


def constructor_arguments(env_spec: EnvSpec) -> list[str]:
    """Keyword arguments the env's constructor accepts, base classes included (sorted)."""
    creator = env_creator(env_spec)
    targets: list[Any] = (
        [vars(c).get("__init__") for c in creator.__mro__]
        if isinstance(creator, type)
        else [creator]
    )
    names: set[str] = set()
    for target in targets:
        if target is None or target is object.__init__ or target is gymnasium.Env.__init__:
            continue
        parameters = inspect.signature(target).parameters.values()
        names.update(
            p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        )
    names.discard("self")
    return sorted(names)


def list_envs() -> list[str]:
    """Short names of all registered envs, installed plugins included, sorted."""
    discover_plugins()
    return sorted(_SPECS)


def env_versions(names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each env's full Gymnasium id and generator version, for a run's records.

    Args:
        names: Short names or Gymnasium ids (a run's env tags).

    Returns:
        ``{name: {"id": "agentgym/WebShop-v1", "generator_version": 3, "plugin": None}}``;
        ``generator_version`` is the env class's attribute of that name (None
        where it has none), ``plugin`` the distribution of a plugin env.

    Raises:
        UnknownEnvError: If a name is not registered.
    """
    versions: dict[str, dict[str, Any]] = {}
    for name in names:
        found = spec(name)
        creator = env_creator(found)
        versions[name] = {
            "id": found.id,
            "generator_version": getattr(creator, "generator_version", None),
            "plugin": found.plugin,
        }
    return versions
