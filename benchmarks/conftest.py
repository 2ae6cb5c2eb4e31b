"""Fixtures shared by the benchmarks."""

from __future__ import annotations

from types import ModuleType

import pytest
from sokoban_anchor import INSTALL_HINT, load_room_utils


@pytest.fixture(scope="session")
def room_utils() -> ModuleType:
    """gym-sokoban's ``room_utils`` module; skips the benchmark when gym-sokoban is missing."""
    module = load_room_utils()
    if module is None:
        pytest.skip(f"gym-sokoban is not installed; {INSTALL_HINT}")
    return module
