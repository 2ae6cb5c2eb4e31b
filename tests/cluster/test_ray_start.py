"""Starting Ray for a run: a config error found after ``ray.init`` stops the Ray it
started, and the program's SIGTERM handler survives ``ray.init`` (which installs its own)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from agentgym.cluster.ray_cluster import RayCluster
from agentgym.errors import ConfigError

pytestmark = pytest.mark.ray


@pytest.fixture
def own_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A Ray of this test's own on loopback (RayCluster sets the loopback switch), none
    running before or after."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not ray.is_initialized()
    try:
        yield
    finally:
        ray.shutdown()


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise AssertionError("never sent")


def test_a_config_error_after_ray_init_stops_ray(own_ray: None) -> None:
    import ray

    with pytest.raises(ConfigError, match=r"num_nodes=5 .* the Ray cluster has 1 node"):
        RayCluster(num_nodes=5, num_cpus=1)
    assert not ray.is_initialized()


def test_ray_init_keeps_the_programs_sigterm_handler(own_ray: None) -> None:
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        cluster = RayCluster(num_nodes=1, num_cpus=1)
        assert signal.getsignal(signal.SIGTERM) is on_sigterm
        cluster.shutdown()
    finally:
        signal.signal(signal.SIGTERM, previous)
