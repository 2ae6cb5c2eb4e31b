"""ROLL's ``generate_opt_level: 0``: batch generation in lockstep.

At level 1 (the default, ROLL's request scheduler) each episode sends its next
request as soon as its env has stepped, and the backend batches whatever is
pending. At level 0 every turn is one batch: the requests of all running
episodes are held until each of them has asked, sent to the backend together,
and answered together; then every env steps, and the next turn's batch forms.
The samples are the same (each request's seed is its group, env and turn,
:func:`~agentgym.rollout.loop.request_seed`); only the timing differs: the
slowest episode of a turn holds back all the others, as in ROLL's
``get_batch_opt_level_0`` (one ``generate`` call per batch).

:class:`Lockstep` wraps any :class:`~agentgym.rollout.backends.base.GenerationBackend`;
:func:`~agentgym.rollout.loop.collect` makes one per collection with one member
per env task, and a member leaves when its env has played its episodes (or was
cancelled), so the turns after it need not wait for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from agentgym.rollout.backends.base import Generation, GenerationBackend, SamplingParams

GENERATE_OPT_LEVELS = (0, 1)
"""ROLL's ``generate_opt_level``: 0 lockstep batches (:class:`Lockstep`), 1 per-request."""

_Request = tuple[Sequence[int], SamplingParams, Any, "asyncio.Future[Generation]"]


class Lockstep:
    """A backend that sends a turn's requests as one batch once every member has asked.

    Args:
        backend: The backend that generates.
        members: The tasks that will ask (one per env); each calls :meth:`leave` when done.

    Attributes:
        batches: The size of each batch sent, in order.
    """

    def __init__(self, backend: GenerationBackend, members: int) -> None:
        if members < 0:
            raise ValueError(f"members must be >= 0, got {members}")
        self.backend = backend
        self.members = members
        self.batches: list[int] = []
        self._pending: list[_Request] = []
        self._sending: set[asyncio.Future[None]] = set()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None
    ) -> Generation:
        """Wait for the turn's batch, then return this request's generation."""
        request: _Request = (prompt_ids, params, env, asyncio.get_running_loop().create_future())
        self._pending.append(request)
        self._flush()
        try:
            return await request[3]
        except asyncio.CancelledError:
            if request in self._pending:  # cancelled before its batch was sent
                self._pending.remove(request)
            raise

    def leave(self) -> None:
        """A member is done asking (its env played its episodes or was cancelled)."""
        self.members -= 1
        self._flush()

    def _flush(self) -> None:
        if not self._pending or len(self._pending) < self.members:
            return
        batch, self._pending = self._pending, []
        self.batches.append(len(batch))
        task = asyncio.ensure_future(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Request]) -> None:
        results = await asyncio.gather(
            *(self.backend.generate(prompt, params, env=env) for prompt, params, env, _ in batch),
            return_exceptions=True,
        )
        for (*_, future), result in zip(batch, results, strict=True):
            if future.done():  # its episode was cancelled meanwhile
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The wrapped backend's weight update."""
        await self.backend.update_weights(weights)

    async def close(self) -> None:
        """Close the wrapped backend."""
        await self.backend.close()
