"""Sokoban room generation: our generator against gym-sokoban's, one room per call.

Each setting is one ``benchmark.group``, so pytest-benchmark prints the two
generators side by side. Run with::

    python -m pytest benchmarks/ --benchmark-only -p no:cacheprovider
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest
from pytest_benchmark.fixture import BenchmarkFixture
from sokoban_anchor import (
    SETTINGS,
    Setting,
    anchor_arrays,
    anchor_to_room,
    generate_ours,
    seed_anchor,
)

SEED = 0

# gym-sokoban takes about a second per 10x10 room; pytest-benchmark's default
# (5 rounds when one round exceeds --benchmark-max-time) is too few to trust.
ANCHOR_MIN_ROUNDS = 20

_PARAMS = [pytest.param(setting, id=setting.id) for setting in SETTINGS]


@pytest.mark.parametrize("setting", _PARAMS)
def test_ours(benchmark: BenchmarkFixture, setting: Setting) -> None:
    """Our generator; the seeded RNG advances, so every call makes a new room."""
    benchmark.group = setting.label
    rng = np.random.default_rng(SEED)
    generated = benchmark(generate_ours, rng, setting)
    assert not generated.room.solved


@pytest.mark.benchmark(min_rounds=ANCHOR_MIN_ROUNDS)
@pytest.mark.parametrize("setting", _PARAMS)
def test_gym_sokoban(benchmark: BenchmarkFixture, room_utils: ModuleType, setting: Setting) -> None:
    """gym-sokoban's generator, retried until it succeeds as its SokobanEnv.reset does."""
    benchmark.group = setting.label
    seed_anchor(SEED)
    structure, state = benchmark(anchor_arrays, room_utils, setting)
    assert not anchor_to_room(structure, state).solved
