"""The KL coefficient of the token-level KL penalty in the rewards: fixed or adaptive.

As ROLL (``roll/utils/kl_controller.py``, from OpenRLHF) and verl
(``core_algos.AdaptiveKLController``) define them: the controller's ``value``
is the ``beta`` of ``token_rewards - beta * KL`` (``add_token_level_kl``); after
each step it sees the batch's KL and may move. It does not touch
``kl_loss_coef`` (the KL *loss* of ``use_kl_loss``), which stays fixed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor

ADAPTIVE_ERROR_LIMIT = 0.2
"""The proportional error is clipped to ``[-0.2, 0.2]`` (Ziegler et al., 2019)."""


class KLController(Protocol):
    """Holds the KL coefficient and updates it once per step."""

    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` after a step whose mean KL was ``current_kl`` over ``n_steps`` samples."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint saves."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        ...


class FixedKLController:
    """``value`` stays ``init_kl_coef``."""

    def __init__(self, init_kl_coef: float) -> None:
        self.value = float(init_kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Does nothing: the coefficient is fixed."""

    def state_dict(self) -> dict[str, Any]:
        """``{"value": ...}``."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``value``."""
        self.value = float(state["value"])


class AdaptiveKLController:
    """Ziegler et al.'s proportional controller (arXiv:1909.08593, as ROLL and verl).

    After each step::

        error  = clip(current_kl / target_kl - 1, -0.2, 0.2)
        value *= 1 + error * n_steps / kl_horizon

    where ``n_steps`` is the number of samples in the step's batch (ROLL and
    verl pass the batch size), so ``kl_horizon`` is counted in samples.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, kl_horizon: int) -> None:
        self.value = float(init_kl_coef)
        self.target_kl = float(target_kl)
        self.kl_horizon = int(kl_horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Scale ``value`` by ``1 + clip(current_kl / target_kl - 1, ±0.2) * n_steps / horizon``."""
        error = min(
            max(current_kl / self.target_kl - 1.0, -ADAPTIVE_ERROR_LIMIT), ADAPTIVE_ERROR_LIMIT
        )
        self.value *= 1.0 + error * n_steps / self.kl_horizon

    def state_dict(self) -> dict[str, Any]:
        """``{"value": ...}``: the target and horizon come from the config."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``value``."""
        self.value = float(state["value"])


KL_CONTROLLERS: dict[str, Callable[..., KLController]] = {
    "fixed": FixedKLController,
    "adaptive": AdaptiveKLController,
}


def make_kl_controller(
    init_kl_coef: float, *, target_kl: float | None = None, kl_horizon: int | None = None
) -> KLController:
    """The controller ROLL's ``get_kl_controller`` picks: adaptive exactly with ``target_kl``.

    Args:
        init_kl_coef: The starting coefficient (``init_kl_coef``), ``>= 0``.
        target_kl: The KL the adaptive controller steers to, or None for a fixed one.
        kl_horizon: The adaptive controller's horizon in samples (required with
            ``target_kl``; ROLL's default is 10000).

    Returns:
        A :class:`FixedKLController` or an :class:`AdaptiveKLController`.

    Raises:
        ValueError: On a negative ``init_kl_coef``, ``target_kl <= 0``, a missing or
            non-positive ``kl_horizon`` with ``target_kl``, or a ``kl_horizon``
            without ``target_kl`` (ROLL ignores it silently; it would do nothing).
    """
    if not init_kl_coef >= 0 or not math.isfinite(init_kl_coef):
        raise ValueError(f"init_kl_coef must be a finite number >= 0, got {init_kl_coef}")
    if target_kl is None:
        if kl_horizon is not None:
            raise ValueError(
                f"kl_horizon={kl_horizon} does nothing without target_kl: set target_kl for "
                "the adaptive KL controller, or leave kl_horizon unset for a fixed init_kl_coef"
            )
        return KL_CONTROLLERS["fixed"](init_kl_coef)
    if not target_kl > 0:
        raise ValueError(
            f"target_kl must be positive (or None for a fixed coefficient), got {target_kl}"
        )
    if kl_horizon is None or kl_horizon <= 0:
        raise ValueError(
            f"the adaptive KL controller (target_kl={target_kl}) needs a positive kl_horizon "
            f"(in samples; ROLL's default is 10000), got {kl_horizon}"
        )
    return KL_CONTROLLERS["adaptive"](init_kl_coef, target_kl, kl_horizon)


def current_kl(kl: Tensor, mask: Tensor) -> float:
    """The step's KL that the controller sees, measured as ROLL and verl measure it.

    Each row's token mean over its masked tokens, then the mean over all rows
    (a row without masked tokens counts as 0, as in both).

    Args:
        kl: ``[B, T]`` per-token KL estimate (``kl_penalty(old_logprobs, ref_logprobs, kind)``).
        mask: ``[B, T]`` 1 on generated tokens.

    Returns:
        The mean KL as a Python float.

    Raises:
        ValueError: On mismatched or non-2-D shapes.
    """
    if kl.shape != mask.shape or kl.dim() != 2:
        raise ValueError(
            f"kl and mask must both be [B, T], got {tuple(kl.shape)} and {tuple(mask.shape)}"
        )
    keep = mask.bool()
    row_sums = torch.where(keep, kl, torch.zeros_like(kl)).sum(-1)  # [B]
    row_means = row_sums / keep.sum(-1).clamp(min=1)  # [B]
    return float(row_means.mean()) if row_means.numel() else 0.0
