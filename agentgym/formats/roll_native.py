"""ROLL's agent-native keys, read as agentgym's: ``AgentNativeStepEnvManager`` (the env
owns the conversation: ``agent.kind: native``), ``adv_estimator: step_reinforce``, the
reward normalization's ``norm_mean_type``/``norm_std_type``, and the env types that
need a service agentgym does not run (ROLL's ROCK sandboxes, Atropos, OpenReward),
refused by name before anything resolves or loads.

Part of the pure translation of :mod:`agentgym.formats.roll`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from agentgym.errors import ConfigError

NATIVE_MANAGER = "AgentNativeStepEnvManager"
"""ROLL's env manager for envs that own their conversation (one sample per step)."""

_TOOL_ENVS = (
    "agentgym's tool envs (env=mcp_tools: the tools of an MCP server you start; env=sql, "
    "env=math_tool: commands in agentgym's sandbox), or your env as an agentgym env "
    "(CONTRIBUTING.md); agent-native envs: env=sokoban_native agent=native "
    "(docs/native_envs.md)"
)

SERVICE_ENVS = {
    "rock_tb_native_env": (
        "ROLL's ROCK sandbox service (a ROCK server at env_config.sandbox_base_url running "
        "SWE-bench / terminal-bench containers and the iflow CLI agent), which agentgym "
        f"neither runs nor speaks. Use {_TOOL_ENVS}"
    ),
    "atropos_env": (
        "an Atropos environment server (NousResearch's atropos, env_config.atropos_env_path "
        "served by its API), which agentgym neither runs nor speaks. For GSM8K-style math "
        "use env=math_workflow (task sets from local JSONL or Parquet) or env=math_tool"
    ),
    "openreward_env": (
        "the OpenReward environment service (env_config.environment_name, reached over the "
        f"network), which agentgym neither runs nor speaks. Use {_TOOL_ENVS}"
    ),
}
"""ROLL's env types that need an outside service → what they need and what to use."""


def refuse_service_env(tag: str, env_type: Any) -> None:
    """Raise when ``env_type`` needs a service of :data:`SERVICE_ENVS`.

    Raises:
        ConfigError: Naming the tag, the service and what to use instead.
    """
    if env_type in SERVICE_ENVS:
        raise ConfigError(f"custom_envs.{tag}.env_type={env_type!r} needs {SERVICE_ENVS[env_type]}")


def refuse_service_envs(unresolved: Any) -> None:
    """:func:`refuse_service_env` on every ``custom_envs`` entry of a composed ROLL file,
    before it resolves: these files interpolate what is missing here too (a W&B key from
    the environment), and the service is the first thing to name.

    Raises:
        ConfigError: For the first entry whose env type needs a service.
    """
    entries = (
        OmegaConf.select(unresolved, "custom_envs") if OmegaConf.is_config(unresolved) else None
    )
    if not OmegaConf.is_config(entries):
        return
    plain = OmegaConf.to_container(entries, resolve=False)
    if not isinstance(plain, Mapping):
        return
    for tag, entry in plain.items():
        if isinstance(entry, Mapping):
            refuse_service_env(str(tag), entry.get("env_type"))


def is_native(entry: Mapping[str, Any]) -> bool:
    """Whether a ``custom_envs`` entry names ROLL's agent-native env manager."""
    return str(entry.get("env_manager_cls") or "").rsplit(".", 1)[-1] == NATIVE_MANAGER


def native_agent(data: dict[str, Any], natives: dict[str, bool], notes: list[str]) -> None:
    """Tags played by ``AgentNativeStepEnvManager`` → ``agent.kind: native`` (their env
    hands each prompt); a run's tags are all native or none (one player a run).

    Args:
        data: The config being translated.
        natives: ``"<section> <tag>"`` → whether its entry is agent-native.
        notes: Where the note goes.
    """
    if not any(natives.values()):
        return
    if not all(natives.values()):
        mixed = sorted(where for where, native in natives.items() if not native)
        raise ConfigError(
            f"{mixed} use another env manager than {NATIVE_MANAGER} beside tags that use it; "
            "one run plays all its envs one way (agent.kind): give every tag one env manager"
        )
    agent = data.get("agent") or {}
    if agent.get("kind", "native") != "native":
        raise ConfigError(
            f"agent.kind={agent['kind']!r}, but the tags' env_manager_cls is {NATIVE_MANAGER} "
            "(agent.kind=native)"
        )
    data["agent"] = {**agent, "kind": "native"}
    notes.append(
        f"env_manager_cls={NATIVE_MANAGER} → agent=native (the env's conversation is each "
        "step's prompt)"
    )


def step_reinforce(data: dict[str, Any], notes: list[str]) -> None:
    """``adv_estimator: step_reinforce``: one sample per step judged by its discounted
    return (``step_score: return``, ``step_gamma`` = ``step_reward_gamma``, ROLL's
    default 0.95), without GiGPO's step term; ROLL recomputes π_old for it
    (``old_logprobs: trainer``)."""
    if data.get("adv_estimator") != "step_reinforce":
        return
    gamma = data.pop("step_reward_gamma", 0.95)
    if data.setdefault("step_gamma", gamma) != gamma:
        raise ConfigError(
            f"step_reward_gamma={gamma} and step_gamma={data['step_gamma']} are one key; "
            "set one of them"
        )
    data.setdefault("step_score", "return")
    data.setdefault("step_advantage_weight", 0.0)
    data.setdefault("old_logprobs", "trainer")
    notes.append(
        f"adv_estimator=step_reinforce: step_score=return, step_gamma={gamma} "
        "(step_reward_gamma), old_logprobs=trainer (ROLL recomputes π_old for it)"
    )


def reward_scopes(data: dict[str, Any], notes: list[str]) -> None:
    """``reward_normalization.norm_mean_type``/``norm_std_type`` stay; where a file sets
    one and no ``method``, ``method`` is ROLL's default, ``identity``, from which ROLL
    derives the other (agentgym's default method is ``mean_std``)."""
    section = data.get("reward_normalization")
    if not isinstance(section, dict) or "method" in section:
        return
    if section.get("norm_mean_type") is None and section.get("norm_std_type") is None:
        return
    section["method"] = "identity"
    notes.append(
        "reward_normalization.method=identity (ROLL's default; norm_mean_type and "
        "norm_std_type decide)"
    )
