"""What limits a step's rollout: extra groups that close the step early, a cap on requests.

ROLL's ``is_use_additional_prompts`` starts ``max_additional_running_prompts``
groups beyond the batch; the step's batch is the first ``env_groups`` groups
(per round of ``max_traj_per_env``) whose every member has finished, so the
slowest episodes no longer set the step time. :class:`BatchCloser` keeps that
tally for :func:`~agentgym.rollout.loop.collect`; the episodes still running
when the batch is complete are cancelled (not carried into the next step: their
samples would be off-policy), and counted.

ROLL's ``max_running_requests`` caps the requests in flight to each engine:
:class:`RequestCap` for one engine in this process, ``Router(max_running_requests=...)``
for several.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentgym.rollout.backends.base import Generation, GenerationBackend, SamplingParams
from agentgym.trajectory import Trajectory

if TYPE_CHECKING:
    import torch

    from agentgym.envs.text_env import TextEnv


@dataclass
class BatchCloser:
    """Counts finished trajectories per group and says when the batch is complete.

    Attributes:
        needed: Complete groups the batch holds.
        group_size: Trajectories in a complete group.
        complete: Group ids in the order they completed.
        finished: Trajectories finished so far (the batch's and the others).
    """

    needed: int
    group_size: int
    complete: list[int] = field(default_factory=list)
    finished: int = 0
    _members: dict[int, list[Trajectory]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.needed < 1 or self.group_size < 1:
            raise ValueError(
                f"needed and group_size must be >= 1, got {self.needed} and {self.group_size}"
            )

    @property
    def done(self) -> bool:
        """Whether ``needed`` groups are complete."""
        return len(self.complete) >= self.needed

    def add(self, trajectory: Trajectory) -> bool:
        """Record a finished trajectory; returns :attr:`done`.

        A trajectory that finishes once the batch is complete is counted but
        can no longer complete a group of the batch.
        """
        self.finished += 1
        if self.done:
            return True
        members = self._members.setdefault(trajectory.group_id, [])
        members.append(trajectory)
        if len(members) == self.group_size:
            self.complete.append(trajectory.group_id)
        return self.done

    def batch(self) -> list[Trajectory]:
        """The trajectories of the first ``needed`` complete groups."""
        return [t for group in self.complete[: self.needed] for t in self._members[group]]


class RequestCap:
    """A backend that lets at most ``limit`` requests run at once (ROLL's
    ``max_running_requests`` for one engine); the others wait, first come first served.

    Everything but :meth:`generate` is the wrapped backend's.

    Args:
        backend: The engine.
        limit: Requests in flight at most.

    Raises:
        ValueError: If ``limit`` is below 1.
    """

    def __init__(self, backend: GenerationBackend, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {limit}")
        self.backend = backend
        self.limit = limit
        self.running = 0
        self._semaphores: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def _semaphore(self) -> asyncio.Semaphore:
        # a semaphore belongs to one event loop; eval runs each rollout in its own
        loop = asyncio.get_running_loop()
        if loop not in self._semaphores:
            self._semaphores = {loop: asyncio.Semaphore(self.limit)}
        return self._semaphores[loop]

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Wait for a free place, then generate."""
        async with self._semaphore():
            self.running += 1
            try:
                return await self.backend.generate(prompt_ids, params, env=env)
            finally:
                self.running -= 1

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The wrapped backend's."""
        await self.backend.update_weights(weights)

    async def close(self) -> None:
        """The wrapped backend's."""
        await self.backend.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)
