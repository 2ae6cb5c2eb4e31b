"""Fixed and adaptive KL controllers, against hand-computed updates."""

from __future__ import annotations

import pytest
import torch

from agentgym.trainers.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    current_kl,
    make_kl_controller,
)


def test_adaptive_update_by_hand() -> None:
    controller = make_kl_controller(0.2, target_kl=0.1, kl_horizon=100)
    assert isinstance(controller, AdaptiveKLController)
    # KL 0.15: error 0.15/0.1 - 1 = 0.5, clipped to 0.2; 10 samples -> x (1 + 0.2*10/100) = 1.02
    controller.update(0.15, n_steps=10)
    assert controller.value == pytest.approx(0.204)
    # KL 0.09: error -0.1 (inside the clip) -> x (1 - 0.1*10/100) = 0.99
    controller.update(0.09, n_steps=10)
    assert controller.value == pytest.approx(0.204 * 0.99)
    # KL 0: error -1, clipped to -0.2; 50 samples -> x (1 - 0.2*50/100) = 0.9
    controller.update(0.0, n_steps=50)
    assert controller.value == pytest.approx(0.204 * 0.99 * 0.9)


def test_fixed_controller_never_moves() -> None:
    controller = make_kl_controller(0.05)
    assert isinstance(controller, FixedKLController)
    controller.update(100.0, n_steps=1000)
    assert controller.value == 0.05


def test_state_dict_round_trip_restores_the_coefficient() -> None:
    controller = make_kl_controller(0.2, target_kl=0.1, kl_horizon=100)
    controller.update(0.15, n_steps=10)
    restored = make_kl_controller(0.2, target_kl=0.1, kl_horizon=100)
    restored.load_state_dict(controller.state_dict())
    assert restored.value == controller.value == pytest.approx(0.204)
    restored.update(0.15, n_steps=10)
    assert restored.value == pytest.approx(0.204 * 1.02)


def test_current_kl_is_the_mean_over_rows_of_row_token_means() -> None:
    # row means 1.5 and 4; the empty row counts as 0 -> (1.5 + 4 + 0) / 3
    kl = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert current_kl(kl, mask) == pytest.approx(5.5 / 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kl_horizon": 100}, "does nothing without target_kl"),
        ({"target_kl": 0.1}, "needs a positive kl_horizon"),
        ({"target_kl": 0.1, "kl_horizon": 0}, "needs a positive kl_horizon"),
        ({"target_kl": 0.0, "kl_horizon": 10}, "target_kl must be positive"),
    ],
)
def test_make_kl_controller_rejects_inconsistent_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_kl_controller(0.2, **kwargs)


def test_make_kl_controller_rejects_a_negative_coefficient() -> None:
    with pytest.raises(ValueError, match="init_kl_coef"):
        make_kl_controller(-0.1)
