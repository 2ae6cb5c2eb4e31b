"""Trinity-RFT's ``algorithm`` section as agentgym's keys: the algorithm types built
here with Trinity's defaults for each, its policy losses, OPMD's advantage arguments and
its KL losses (``trinity/algorithm/``). :mod:`agentgym.formats.trinity` translates the
rest of the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

ALGORITHMS = ("grpo", "opmd")
"""Trinity's ``algorithm_type`` values built here."""

UNBUILT_ALGORITHMS = {
    "ppo": "Trinity's ppo (a critic, GAE): use agentgym's adv_estimator=gae",
    "sft": "supervised fine-tuning is not a Trinity algorithm agentgym runs",
    "dpo": "DPO (preference pairs) is not built",
    "mix": "MIX (expert data mixed into RL) is not built",
    "mix_chord": "MIX-CHORD is not built",
    "raft": "RAFT is not built",
    "asymre": "AsymRE is not built",
}
"""Trinity's other algorithm types, each with why it does not run here."""

TRINITY_GRPO = {
    "clip_ratio_low": 0.2,
    "clip_ratio_high": 0.2,
    "loss_agg_mode": "token-mean",
    "use_kl_loss": True,
    "kl_penalty": "mse",  # k2: 0.5 (log p - log p_ref)^2
    "kl_loss_coef": 0.001,
    "entropy_loss_coef": 0.0,
    "drop_zero_variance_groups": False,
    "reward_normalization.method": "mean_std",
    "reward_normalization.grouping": "state",
    "adv_estimator": "grpo",
    "pg_variant": "ppo",
}
"""Trinity's defaults for ``algorithm_type: grpo`` (its ``GRPOAlgorithm.default_config``:
``policy_loss_fn: ppo`` (clip 0.2, token-mean), ``kl_loss_fn: k2`` (``kl_coef``
0.001), ``entropy_loss_fn: default``, the group advantage, groups of equal reward
kept with advantage 0), in agentgym's keys."""

TRINITY_DEFAULTS: dict[str, dict[str, Any]] = {
    "grpo": TRINITY_GRPO,
    # OPMDAlgorithm.default_config: the opmd advantage (score minus the group's
    # baseline) and loss (no ratio, no clip), a k2 KL loss
    "opmd": TRINITY_GRPO
    | {"adv_estimator": "opmd", "pg_variant": "opmd", "reward_normalization.method": "identity"},
}
"""Each built ``algorithm_type``'s Trinity defaults, in agentgym's keys."""

POLICY_LOSSES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "ppo": (
        {"pg_variant": "ppo"},
        {"clip_range_low": "clip_ratio_low", "clip_range_high": "clip_ratio_high",
         "loss_agg_mode": "loss_agg_mode"},
    ),
    "opmd": ({"pg_variant": "opmd"}, {"tau": "opmd_tau", "loss_agg_mode": "loss_agg_mode"}),
    "topr": (
        {"pg_variant": "topr", "topr_advantage_threshold": 0.0,
         "topr_positive_weight": 1.0, "topr_negative_weight": 1.0},
        {"advantage_threshold": "topr_advantage_threshold", "loss_agg_mode": "loss_agg_mode"},
    ),
    "cispo": (
        {"pg_variant": "cispo", "cispo_epsilon_low": 1.0, "cispo_epsilon_high": 0.28},
        {"clip_range_low": "cispo_epsilon_low", "clip_range_high": "cispo_epsilon_high",
         "enable_mask_clip": "cispo_use_unified_mask", "loss_agg_mode": "loss_agg_mode"},
    ),
}  # fmt: skip
"""Trinity's ``policy_loss_fn`` → (agentgym's keys with Trinity's defaults for it, its
``policy_loss_fn_args`` → agentgym's keys; ``clip_range`` sets both clip bounds)."""

ADVANTAGE_ARGS = {"opmd_baseline": "opmd_baseline", "tau": "opmd_baseline_tau"}
"""OPMD's ``advantage_fn_args`` → agentgym's keys."""

KL_LOSSES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl", "low_var_kl": "low_var_kl", "abs": "abs"}
"""Trinity's ``kl_loss_fn`` → ``kl_penalty`` (``none``: no KL loss). Trinity's k3 is not
clamped; ``low_var_kl`` clamps at ±10 (verl's)."""


def algorithm_values(algorithm: Mapping[str, Any]) -> dict[str, Any]:
    """Trinity's ``algorithm`` section (its type, ``policy_loss_fn`` and its args, OPMD's
    ``advantage_fn_args``, ``kl_loss_fn`` and its ``kl_coef``) as agentgym's keys, on top
    of Trinity's defaults for the type.

    Raises:
        ConfigError: On an algorithm type, policy loss, KL loss or argument not built
            here (naming it, with the valid options).
    """
    kind = algorithm.get("algorithm_type", "grpo")
    if kind in UNBUILT_ALGORITHMS:
        raise ConfigError(f"algorithm.algorithm_type={kind!r}: {UNBUILT_ALGORITHMS[kind]}")
    if kind not in ALGORITHMS:
        raise ConfigError(
            f"algorithm.algorithm_type={kind!r} is not one of {[*ALGORITHMS, *UNBUILT_ALGORITHMS]}"
        )
    values = dict(TRINITY_DEFAULTS[kind])
    _algorithm_args(algorithm, values)
    return values


def _algorithm_args(algorithm: Mapping[str, Any], values: dict[str, Any]) -> None:
    """``policy_loss_fn`` and its args, OPMD's ``advantage_fn_args``, ``kl_loss_fn`` and
    its ``kl_coef``, as agentgym's keys (into ``values``)."""
    loss = algorithm.get("policy_loss_fn")
    if loss is not None:
        if loss not in POLICY_LOSSES:
            raise ConfigError(
                f"algorithm.policy_loss_fn={loss!r} is not built; built: {sorted(POLICY_LOSSES)}."
                f"{did_you_mean(loss, POLICY_LOSSES)}"
            )
        values |= POLICY_LOSSES[loss][0]
    names = POLICY_LOSSES[loss or values["pg_variant"]][1]
    for key, value in (algorithm.get("policy_loss_fn_args") or {}).items():
        if key == "clip_range" and values["pg_variant"] == "ppo":
            values["clip_ratio_low"] = values["clip_ratio_high"] = value
        elif key in ("mask_clip_range_low", "mask_clip_range_high") and loss == "cispo":
            bound = "cispo_epsilon_low" if key.endswith("low") else "cispo_epsilon_high"
            if value != values.get(bound):
                raise ConfigError(
                    f"algorithm.policy_loss_fn_args.{key}={value}: CISPO's mask uses the "
                    f"clip range here ({bound}={values.get(bound)}); give them equal"
                )
        elif key in names:
            values[names[key]] = value
        else:
            raise ConfigError(
                f"algorithm.policy_loss_fn_args.{key} is not read for policy_loss_fn="
                f"{loss or values['pg_variant']}; read: {sorted(names)}.{did_you_mean(key, names)}"
            )
    for key, value in (algorithm.get("advantage_fn_args") or {}).items():
        if values["adv_estimator"] != "opmd" or key not in ADVANTAGE_ARGS:
            raise ConfigError(
                f"algorithm.advantage_fn_args.{key} is not read here (read: OPMD's "
                f"{sorted(ADVANTAGE_ARGS)})"
            )
        values[ADVANTAGE_ARGS[key]] = value
    kl = algorithm.get("kl_loss_fn")
    if kl == "none":
        values["use_kl_loss"] = False
    elif kl is not None:
        if kl not in KL_LOSSES:
            raise ConfigError(f"algorithm.kl_loss_fn={kl!r} is not one of {sorted(KL_LOSSES)}")
        values["kl_penalty"] = KL_LOSSES[kl]
    if "kl_coef" in (algorithm.get("kl_loss_fn_args") or {}):
        values["kl_loss_coef"] = algorithm["kl_loss_fn_args"]["kl_coef"]
