"""Env test fixtures: a third-party plugin package installed with pip (tests/plugins.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import agentgym
from agentgym import registry
from tests.plugins import PLUGIN_NAMES, install


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder ``agentgym-test-plugins`` is pip-installed into (put it on PYTHONPATH)."""
    return install(tmp_path_factory.mktemp("plugins"))


@pytest.fixture
def plugins(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plugin package on ``sys.path`` and its envs registered, for one test."""
    monkeypatch.syspath_prepend(str(plugin_site))
    registry.discover_plugins()
    yield plugin_site
    monkeypatch.undo()
    for name in PLUGIN_NAMES:
        if name in registry._SPECS:
            agentgym.unregister(name)
    registry.discover_plugins()
