"""An explorer whose weight transfer breaks off after part of a version reached its
engines loads a whole version before it generates again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agentgym.job.explorer import ExplorerSession
from agentgym.job.published_weights import Published, WeightsGoneError

NAMES = ("a", "b", "c")


class BreakingChannel:
    """Publishes version 2; its first transfer breaks off after ``arrive`` tensors."""

    def __init__(self, arrive: int) -> None:
        self.arrive = arrive
        self.reads = 0

    def latest(self) -> Published:
        return Published(2, "v2", 1)

    def read(self, published: Published) -> Iterator[tuple[str, torch.Tensor]]:
        self.reads += 1
        for count, name in enumerate(NAMES):
            if self.reads == 1 and count == self.arrive:
                raise WeightsGoneError("the transfer broke off")
            yield name, torch.full((2,), float(published.version))


class RecordingEngine:
    def __init__(self) -> None:
        self.weights: dict[str, float] = dict.fromkeys(NAMES, 1.0)  # version 1's

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            self.weights[name] = float(tensor[0])


def parts(channel: BreakingChannel, engine: RecordingEngine) -> Any:
    return SimpleNamespace(
        name="e",
        weights=channel,
        train=SimpleNamespace(backend=engine),
        sync_timeout=5.0,
        job_dir=Path("."),
    )


@pytest.mark.parametrize(
    ("arrive", "version", "reads"),
    [
        (1, 2, 2),  # broken after part of version 2 arrived: version 2 again, whole
        (0, 1, 1),  # gone before any tensor: version 1 kept for now, untouched
    ],
)
def test_a_broken_transfer_leaves_no_mix_of_versions(arrive: int, version: int, reads: int) -> None:
    channel, engine = BreakingChannel(arrive=arrive), RecordingEngine()
    loop = asyncio.new_event_loop()
    try:
        loaded = ExplorerSession(parts(channel, engine), loop).load_newer(Published(1, "v1", 1))
    finally:
        loop.close()
    assert loaded.version == version
    assert engine.weights == dict.fromkeys(NAMES, float(version))
    assert channel.reads == reads
