"""ROLL's GEM env entries (``examples/qwen3_agentic_gem/``) as ``env=gem`` configs.

A ``custom_envs`` entry whose ``env_type`` is a GEM id (``game:GuessTheNumber-v0``,
``rg:letter_counting``, ``math:GSM8K``, ...: a family prefix and a colon) or one of
ROLL's own GEM types (``roll_math``, ``roll_qa``, ``roll_code``) becomes
``{name: gem, kwargs: {env_id, **env_config}}``, with the entry's siblings that GEM's
side reads: ``tool_wrapper`` (GEM's tool wrapper, :mod:`agentgym.envs.gem.tools`),
``use_thread_lock``, ``agent_system_template`` (the system prompt) and
``agent_template`` (how each observation is shown). Hub datasets named by
``env_config.dataset_name`` must be local files or folders (or the env's
``hub_datasets``): that is checked when the env is built, before any model work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FILE_KEYS = ("gem_games", "gem_math", "gem_qa", "gem_rg", "gem_code")
"""Top-level keys of ROLL's GEM env files (``config/traj_envs_gem_*.yaml``): the env
sections that ``custom_envs`` entries copy (dropped with the other template keys)."""

GEM_ROLL_TYPES = ("roll_math", "roll_qa", "roll_code")
"""ROLL's env types that are GEM envs of its own (agentgym.envs.gem.roll_envs)."""

ENTRY_KEYS = {
    "tool_wrapper": "tool_wrapper",
    "use_thread_lock": "use_thread_lock",
    "agent_system_template": "instructions",
    "agent_template": "observation_template",
}
"""A ``custom_envs`` entry's keys that the GEM env takes → its argument."""


def unread_history_helper(
    data: dict[str, Any], custom: Mapping[str, Any], notes: list[str]
) -> None:
    """Drop ``default_history_length`` where no entry reads it (ROLL's
    ``gem_rg_letter_counting.yaml`` defines it beside an entry without
    ``history_length``; ROLL ignores it), with a note; one that is read is a helper
    variable, dropped before this runs."""
    if "default_history_length" in data and any(
        is_gem_type(str(entry.get("env_type", "")))
        for entry in custom.values()
        if isinstance(entry, Mapping)
    ):
        value = data.pop("default_history_length")
        notes.append(f"default_history_length={value!r} dropped: no custom_envs entry reads it")


def is_gem_type(env_type: str) -> bool:
    """Whether ROLL's ``env_type`` is a GEM env (a GEM id, or ROLL's roll_* types)."""
    return env_type in GEM_ROLL_TYPES or (":" in env_type and "." not in env_type.split(":")[0])


def gem_env(tag: str, entry: Mapping[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``env=gem`` config of a ``custom_envs`` entry.

    Args:
        tag: The entry's tag (for messages).
        entry: The entry (``env_type``, ``env_config``, ``tool_wrapper``, ...).
        kwargs: Its ``env_config``, as the caller read it.

    Returns:
        ``{"name": "gem", "kwargs": ...}``.
    """
    arguments = {"env_id": str(entry["env_type"]), **kwargs}
    for key, argument in ENTRY_KEYS.items():
        value = entry.get(key)
        if value is not None:
            arguments[argument] = dict(value) if isinstance(value, Mapping) else value
    return {"name": "gem", "kwargs": arguments}
