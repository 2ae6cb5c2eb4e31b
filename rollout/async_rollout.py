"""Async generation (``async_generation_ratio: k``): rollout runs ahead of training.

Every env plays its episodes back to back, batch after batch, while the trainer
trains on the batches already complete. Three pieces:

* :class:`AdmissionControl` starts an episode only while the staleness bound
  allows it (AReaL's and SkyRL's rule: accepted + running ≤ (k + version + 1) ×
  batch), so no generated work is thrown away for staleness.
* :class:`PausableBackend` wraps the generation backend: it records the weights
  version of every response and pauses new requests for a weight sync.
* :class:`AsyncRollout` runs the envs and hands out batches in admission order.

Batches are taken in the order their episodes were admitted (batch ``b`` holds
episodes ``b·B … b·B + B - 1``), not the order they finished: the episode with
index ``g`` is admitted at version ``v`` only if ``g < (k + v + 1)·B``, so batch
``b`` starts at version ``v ≥ b - k`` and is trained by step ``b + 1``, which
updates version ``b``: every trained sample is at most ``k`` versions behind the
weights it updates (``⌈k⌉`` for a fractional k). A batch that finished first
out of order would not have this bound (AReaL's consumer takes what finishes
first; a long episode started early can then be trained many versions later).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agentgym.rollout.backends.base import Generation, GenerationBackend, SamplingParams
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.collection_gc import FewerCollections
from agentgym.rollout.env_manager import Assignment, EnvManager
from agentgym.rollout.loop import (
    EpisodeRunner,
    PlayerFactory,
    RolloutConfig,
    RolloutResult,
    play_env,
)
from agentgym.rollout.metrics import rollout_metrics
from agentgym.trajectory import Trajectory

if TYPE_CHECKING:
    import torch

    from agentgym.envs.text_env import TextEnv


class AdmissionError(RuntimeError):
    """An episode was started beyond the staleness bound (a scheduler bug)."""


class WeightSyncTimeoutError(TimeoutError):
    """A weight sync took longer than ``rpc_timeout`` (generation was resumed)."""


def staleness_bound(ratio: float, version: int, batch_size: int) -> int:
    """How many episodes may have been started in all at ``version``:
    ``⌊(ratio + version + 1) × batch_size⌋`` (AReaL's ``max_head_offpolicyness`` rule)."""
    return math.floor((ratio + version + 1) * batch_size)


@dataclass
class AdmissionControl:
    """Counts episodes as AReaL's ``StalenessManager`` does and refuses any beyond the bound.

    Attributes:
        batch_size: Episodes a training batch holds.
        ratio: ``async_generation_ratio`` (k).
        accepted: Episodes finished (those of trained batches included).
        running: Episodes in flight.
        peak: The largest ``accepted + running`` over the bound of its version seen
            (≤ 0 always).
        highest_started: The largest episode index started so far (-1: none): how far
            ahead of training the envs ran.
    """

    batch_size: int
    ratio: float
    accepted: int = 0
    running: int = 0
    peak: int = -(2**62)
    highest_started: int = -1

    def admits(self, index: int, version: int) -> bool:
        """Whether the episode with global ``index`` may start at ``version``."""
        return index < staleness_bound(self.ratio, version, self.batch_size)

    def start(self, index: int, version: int) -> None:
        """Count a starting episode.

        Raises:
            AdmissionError: If ``index`` is beyond the bound, or the count would be.
        """
        bound = staleness_bound(self.ratio, version, self.batch_size)
        if index >= bound or self.accepted + self.running + 1 > bound:
            raise AdmissionError(
                f"episode {index} at version {version}: accepted {self.accepted} + running "
                f"{self.running} + 1 > bound {bound} (ratio {self.ratio}, batch {self.batch_size})"
            )
        self.running += 1
        self.peak = max(self.peak, self.accepted + self.running - bound)
        self.highest_started = max(self.highest_started, index)

    def finish(self) -> None:
        """An episode ended (trained or not, it counts as accepted)."""
        self.running -= 1
        self.accepted += 1


class PausableBackend:
    """A generation client that records versions and pauses for weight syncs.

    Each response carries the version of the weights that generated it. While
    paused, new requests wait; :meth:`pause` either lets the requests in flight
    finish (``abort=False``: they finish on the old weights) or cancels them
    (``abort=True``): an aborted request is **regenerated** from its prompt after
    :meth:`resume` (its partial output is discarded; the turn records the new version).

    With ``chunk`` (``partial_rollout``), a response is generated ``chunk`` tokens at a
    time, each piece a request whose prompt is the prompt and the tokens so far (token
    in, token out: nothing is re-tokenized). A pause then waits for one piece at most,
    and the response goes on after it on the new weights: its tokens are kept, and
    :attr:`Generation.token_versions` records each token's version (verl's partial
    rollout; SkyRL's abort and resume at a piece's end).

    Args:
        backend: The engine, or a :class:`~agentgym.rollout.router.Router`.
        version: The version of the weights the engines hold now.
        chunk: Tokens a piece (0: a response is one request).
    """

    def __init__(self, backend: GenerationBackend, version: int = 0, *, chunk: int = 0) -> None:
        self.backend = backend
        self.version = version
        self.chunk = chunk
        self.continued = 0
        """Responses that went on across a weight sync (``chunk``)."""
        self.aborted = 0
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight: set[asyncio.Task[Generation]] = set()
        self._aborting: set[asyncio.Task[Generation]] = set()

    @property
    def paused(self) -> bool:
        """Whether new requests wait."""
        return not self._open.is_set()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Generate once not paused; the result carries the generating version (and with
        ``chunk``, each token's)."""
        if self.chunk:
            return await self._in_pieces(prompt_ids, params, env)
        generation, version = await self._request(prompt_ids, params, env)
        return replace(generation, policy_version=version)

    async def _request(
        self, prompt_ids: Sequence[int], params: SamplingParams, env: TextEnv | None
    ) -> tuple[Generation, int]:
        """One request once not paused (sent again if a pause aborts it); its response
        and the version that generated it."""
        while True:
            await self._open.wait()
            version = self.version
            task = asyncio.ensure_future(self.backend.generate(prompt_ids, params, env=env))
            self._in_flight.add(task)
            try:
                return await task, version
            except asyncio.CancelledError:
                if task not in self._aborting:
                    raise
                self._aborting.discard(task)  # aborted by a pause: regenerate on the new weights
            finally:
                self._in_flight.discard(task)

    async def _in_pieces(
        self, prompt_ids: Sequence[int], params: SamplingParams, env: TextEnv | None
    ) -> Generation:
        """A response ``chunk`` tokens at a time, each piece on the weights of its time."""
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        while True:
            piece = replace(
                params, max_new_tokens=min(self.chunk, params.max_new_tokens - len(ids))
            )
            if params.seed is not None and ids:  # a piece's own stream, the same on a rerun
                piece = replace(piece, seed=(params.seed * 1_000_003 + len(ids)) % 2**31)
            part, version = await self._request([*prompt_ids, *ids], piece, env)
            if versions and version != versions[-1]:
                self.continued += 1
            ids += part.token_ids
            logprobs += part.logprobs
            versions += [version] * len(part.token_ids)
            done = part.finish_reason != "length" or len(ids) >= params.max_new_tokens
            if done or not part.token_ids:
                first = versions[0] if versions else version
                return Generation(ids, logprobs, part.finish_reason, first, versions)

    async def pause(self, *, abort: bool = False) -> None:
        """Stop new requests and wait until none is in flight (cancelling them with ``abort``)."""
        self._open.clear()
        running = list(self._in_flight)
        if abort:
            self.aborted += len(running)
            self._aborting.update(running)
            for task in running:
                task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    def resume(self) -> None:
        """Let requests through again."""
        self._open.set()

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The wrapped backend's."""
        await self.backend.update_weights(weights)

    async def close(self) -> None:
        """The wrapped backend's."""
        await self.backend.close()


async def bounded_update(
    update: Callable[[], Awaitable[None]], backend: Any, *, timeout: float, paused: bool = False
) -> float:
    """Run ``update`` (the new weights to ``backend``) bounded by ``timeout``; the seconds
    it took.

    Raises:
        WeightSyncTimeoutError: Naming the backend, when it takes longer than ``timeout``.
    """
    started = time.perf_counter()
    try:
        await asyncio.wait_for(update(), timeout)
    except TimeoutError as error:
        note = (
            " while generation was paused; generation was resumed on the old weights"
            if paused
            else ""
        )
        raise WeightSyncTimeoutError(
            f"weight sync to the generation backend ({type(backend).__name__}."
            f"update_weights) took longer than rpc_timeout={timeout} s{note}"
        ) from error
    return time.perf_counter() - started


async def paused_update(
    client: PausableBackend,
    update: Callable[[], Awaitable[None]],
    *,
    timeout: float,
    abort: bool = False,
) -> dict[str, float]:
    """Pause generation, run ``update`` (bounded by ``timeout``), bump the version, resume;
    where the sync spent its time, as tracker entries (seconds pausing, updating, resuming).

    Generation is resumed whatever happens (a ``finally``); the version moves
    only when the update succeeded.

    Raises:
        WeightSyncTimeoutError: When ``update`` takes longer than ``timeout``.
    """
    started = time.perf_counter()
    try:
        await client.pause(abort=abort)
        paused = time.perf_counter()
        await bounded_update(update, client.backend, timeout=timeout, paused=True)
        client.version += 1
        synced = time.perf_counter()
    finally:
        client.resume()
    return {
        "time/weight_sync_pause": paused - started,
        "time/weight_sync": synced - paused,
        "time/weight_sync_resume": time.perf_counter() - synced,
    }


@dataclass
class _Batch:
    trajectories: list[Trajectory] = field(default_factory=list)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class AsyncRollout:
    """Plays the train manager's episodes ahead of training, within the staleness bound.

    Args:
        manager: The train envs (batch ``b`` is its ``b``-th :meth:`~EnvManager.assignments`).
        client: The generation client.
        chat: The policy's chat template.
        config: Rollout limits and sampling.
        ratio: ``async_generation_ratio`` (k ≥ 0).
        first_batch: The first batch's index: the step resumed from (0 for a new run);
            the client's version must be the same.
        players: Who plays each episode (default: the env manager's own loop).

    Raises:
        ValueError: With the manager's ``additional_groups`` (extra prompts close a
            batch by completion order, which breaks the staleness bound), or ``ratio < 0``.
    """

    def __init__(
        self,
        manager: EnvManager,
        client: PausableBackend,
        chat: ChatTokenizer,
        config: RolloutConfig,
        *,
        ratio: float,
        first_batch: int = 0,
        players: PlayerFactory | None = None,
    ) -> None:
        if manager.additional_groups:
            raise ValueError(
                "async_generation_ratio > 0 with is_use_additional_prompts: extra groups close "
                "a batch by completion order; use one of the two"
            )
        if ratio < 0:
            raise ValueError(f"async_generation_ratio must be >= 0, got {ratio}")
        self.manager = manager
        self.client = client
        self.ratio = ratio
        self.first_batch = first_batch
        stop = tuple(sorted(set(config.sampling.stop_token_ids) | chat.end_of_turn_ids))
        config = replace(config, sampling=replace(config.sampling, stop_token_ids=stop))
        self.runner = (players or EpisodeRunner)(client, chat, config, first_batch)
        self.batch_size = manager.batch_size
        self.admission = AdmissionControl(
            self.batch_size, ratio, accepted=first_batch * self.batch_size
        )
        self.admission_wait = 0.0
        self._planned = first_batch
        self._cursors: dict[int, int] = {}
        self._assignments: dict[int, list[list[Assignment]]] = {}
        self._batches: dict[int, _Batch] = {}
        self._changed = asyncio.Event()
        self._pool = ThreadPoolExecutor(
            max_workers=config.env_workers, thread_name_prefix="agentgym-env"
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._collections = FewerCollections()

    def start(self) -> None:
        """Start every env's episode loop (on the running event loop)."""
        if not self._tasks:  # released by close(): see collection_gc
            self._collections.hold()
        clients = self.manager.clients(self._pool)
        self._tasks = [
            asyncio.ensure_future(self._play(position, env)) for position, env in enumerate(clients)
        ]

    def cursor(self, batch: int) -> int:
        """The manager's seed cursor before batch ``batch`` (a checkpoint after step
        ``batch`` stores it: the batches in flight then are regenerated on resume)."""
        self._plan(batch)
        return self._cursors[batch]

    def versions_changed(self) -> None:
        """Wake the envs waiting for admission (the client's version moved)."""
        self._changed.set()
        self._changed = asyncio.Event()

    def _plan(self, batch: int) -> list[list[Assignment]]:
        """Batch ``batch``'s assignments; earlier ones are drawn first (the cursor's order)."""
        while self._planned <= batch:
            self._cursors[self._planned] = self.manager.cursor
            self._assignments[self._planned] = self.manager.assignments()
            self._planned += 1
        return self._assignments[batch]

    def advance(self) -> None:
        """Count a step that changed no weights (nothing to sync): the next version."""
        self.client.version += 1
        self.versions_changed()

    async def sync(
        self, update: Callable[[], Awaitable[None]], *, timeout: float, abort: bool = False
    ) -> dict[str, float]:
        """:func:`paused_update`, then admit the episodes the new version allows."""
        try:
            return await paused_update(self.client, update, timeout=timeout, abort=abort)
        finally:
            self.versions_changed()

    def _offsets(self, position: int) -> int:
        return sum(len(episodes) for episodes in self._plan(self.first_batch)[:position])

    async def _play(self, position: int, env: Any) -> None:
        await play_env(
            env, self._episodes(position), self.runner, self._finished, admit=self._admit
        )

    def _episodes(self, position: int) -> Iterator[tuple[tuple[int, int], Assignment]]:
        """The env's episodes of every batch from the first, keyed ``(batch, index)``."""
        offset = self._offsets(position)
        batch = self.first_batch
        while True:
            for r, assignment in enumerate(self._plan(batch)[position]):
                yield (batch, batch * self.batch_size + offset + r), assignment
            batch += 1

    @contextlib.asynccontextmanager
    async def _admit(self, key: tuple[int, int]) -> AsyncIterator[None]:
        """Wait until the staleness bound admits the episode; count it while it plays."""
        _, index = key
        waited = time.perf_counter()
        while not self.admission.admits(index, self.client.version):
            await self._changed.wait()
        self.admission_wait += time.perf_counter() - waited
        self.admission.start(index, self.client.version)  # raises beyond the bound
        try:
            yield
        finally:
            self.admission.finish()

    def _finished(self, key: tuple[int, int], trajectory: Trajectory) -> None:
        entry = self._batches.setdefault(key[0], _Batch())
        entry.trajectories.append(trajectory)
        if len(entry.trajectories) == self.batch_size:
            entry.done.set()

    async def next_batch(self, batch: int) -> RolloutResult:
        """Wait for batch ``batch`` (every episode finished) and hand it over.

        Raises:
            Whatever an env's loop raised.
        """
        entry = self._batches.setdefault(batch, _Batch())
        waiter = asyncio.ensure_future(entry.done.wait())
        try:
            while not entry.done.is_set():
                done, _ = await asyncio.wait(
                    {waiter, *self._tasks}, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done - {waiter}:
                    task.result()
                    raise RuntimeError("an env's episode loop ended")
        finally:
            waiter.cancel()
        del self._batches[batch]
        self._assignments.pop(batch, None)
        for trained in [b for b in self._cursors if b < batch]:  # a checkpoint reads later ones
            del self._cursors[trained]
        trajectories = sorted(entry.trajectories, key=lambda t: (t.group_id, t.env_index))
        metrics = rollout_metrics(trajectories) | self.runner.metrics(trajectories)
        return RolloutResult(trajectories, metrics)

    async def close(self) -> None:
        """Cancel the episodes in flight (a resume regenerates them) and release the envs."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*self.runner.env_calls, return_exceptions=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._tasks:
            self._tasks = []
            self._collections.release()
