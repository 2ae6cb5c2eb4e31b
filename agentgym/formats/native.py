"""agentgym's own config files, outside the package: a YAML of agentgym's keys,
given with ``agentgym run --config FILE`` or ``--config-path DIR --config-name NAME``.

The file is read as command-line arguments placed before the command line's own: a
config group given a name picks that option (``env: frozen_lake`` is ``env=frozen_lake``),
any other key sets its value (``generation: {max_new_tokens: 64}`` is
``generation.max_new_tokens=64``). So the file needs nothing but the keys it changes,
every key is checked as a command-line key is (a misspelling gets its close match), and
the rest of the defaults are agentgym's. A file with its own Hydra ``defaults`` list is
left to Hydra.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CONFIG_GROUPS = ("env", "generation", "model", "strategy", "tracker", "agent")
"""Keys that are config groups: a name given to one picks that option."""


def override_value(value: Any) -> str:
    """``value`` written as a Hydra override's value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(override_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def file_arguments(raw: Mapping[str, Any]) -> list[str]:
    """The command-line arguments that the file ``raw`` stands for (see the module)."""
    arguments = [
        f"{key}={value}"
        for key, value in raw.items()
        if key in CONFIG_GROUPS and isinstance(value, str)
    ]
    for key, value in raw.items():
        if not (key in CONFIG_GROUPS and isinstance(value, str)):
            arguments += _leaves(str(key), value)
    return arguments


def _leaves(path: str, value: Any) -> list[str]:
    if isinstance(value, Mapping) and value:
        return [item for key, inner in value.items() for item in _leaves(f"{path}.{key}", inner)]
    return [f"{path}={override_value(value)}"]


def is_native_file(raw: Mapping[str, Any]) -> bool:
    """Whether ``raw`` is one of agentgym's own config files: not ROLL's or
    Trinity-RFT's, and no Hydra ``defaults`` list of its own."""
    # both formats import this module's helpers: imported at the top, they would be a cycle
    from agentgym.formats.roll import is_roll_config
    from agentgym.formats.trinity import is_trinity_config

    return "defaults" not in raw and not is_roll_config(raw) and not is_trinity_config(raw)
