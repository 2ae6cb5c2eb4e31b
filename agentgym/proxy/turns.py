"""Generation and weight loads taking turns on one backend, so that no response spans
two weight versions (the serving explorer loads weights while agents are being served).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from agentgym.rollout.backends.base import Generation, GenerationBackend, SamplingParams


class TakingTurns:
    """Generations and weight loads take turns: a load waits for the generations in
    flight and holds new ones until the engines hold the whole new version."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._generating = 0
        self._loading = False

    @asynccontextmanager
    async def generation(self) -> AsyncIterator[None]:
        """Generate (after any load under way)."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._loading)
            self._generating += 1
        try:
            yield
        finally:
            async with self._changed:
                self._generating -= 1
                self._changed.notify_all()

    @asynccontextmanager
    async def load(self) -> AsyncIterator[None]:
        """Load weights (once the generations in flight have finished)."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._loading)
            self._loading = True
            await self._changed.wait_for(lambda: self._generating == 0)
        try:
            yield
        finally:
            async with self._changed:
                self._loading = False
                self._changed.notify_all()


@dataclass
class TurnTakingBackend:
    """``backend``'s generation, in turn with weight loads (what sessions record from)."""

    backend: GenerationBackend
    turns: TakingTurns

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        """One generation, never across a weight load."""
        async with self.turns.generation():
            return await self.backend.generate(prompt_ids, params, env=env)
