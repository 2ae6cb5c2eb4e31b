"""The multi-turn rollout: one asyncio task per env, token-in-token-out.

Each env runs its episodes in its own task; nothing waits for a lockstep
barrier, so a slow env or a long generation holds back only itself, and the
backend batches whatever requests are pending. The loop drives each env
through its :class:`~agentgym.rollout.workers.EnvClient`: an env of this
process runs ``reset``/``step`` in a thread pool so that a blocking env does
not stall the event loop; an env on an env worker is called over its handle.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeAlias, TypeVar

import numpy as np

from agentgym.choices import SAMPLE_MODES
from agentgym.rollout.backends.base import GenerationBackend, SamplingParams
from agentgym.rollout.chat import PREFIX_CHECK_MODES, ChatTokenizer, Message, report_drift
from agentgym.rollout.collection_gc import FewerCollections
from agentgym.rollout.env_manager import Assignment, EnvManager
from agentgym.rollout.limits import BatchCloser
from agentgym.rollout.lockstep import GENERATE_OPT_LEVELS, Lockstep
from agentgym.rollout.metrics import rollout_metrics
from agentgym.rollout.stop_strings import cut_at_stop_string
from agentgym.rollout.turns import (
    has_think,
    observation_messages,
    record_step,
    step_window,
    strip_think,
)
from agentgym.rollout.workers import EnvClient, EnvLostError
from agentgym.trajectory import Trajectory, Turn

_T = TypeVar("_T")
_K = TypeVar("_K")


@dataclass(frozen=True)
class RolloutConfig:
    """How trajectories are collected.

    Attributes:
        mode: ``"trajectory"`` (one sample per episode with the full history)
            or ``"step"`` (one sample per turn, prompts holding the last
            ``history_length`` turns).
        max_turns: The most model turns per episode.
        max_actions_per_traj: The most env actions per episode (None: no limit).
        sequence_length: The most tokens of one sample; an episode ends
            (``max_length``) when the next turn's prompt plus
            ``sampling.max_new_tokens`` would not fit.
        sampling: Sampling parameters of every turn (the tokenizer's
            end-of-turn ids are added to the stop ids).
        history_length: Past turns kept in ``step`` mode prompts.
        strip_think_history: Drop ``<think>`` blocks of past turns in ``step`` mode.
        prefix_check: ``"strict"`` (raise on drift), ``"warn"`` or ``"off"``.
        record_frames: Keep ``rgb_array`` frames of every step (for GIFs).
        env_workers: Threads that run ``reset``/``step`` of envs in this process.
        generate_opt_level: ROLL's: 1 sends each request when its episode needs
            it; 0 sends each turn's requests as one batch (:mod:`~agentgym.rollout.lockstep`).
    """

    mode: str = "step"
    max_turns: int = 10
    max_actions_per_traj: int | None = None
    sequence_length: int = 512
    sampling: SamplingParams = field(default_factory=SamplingParams)
    history_length: int = 0
    strip_think_history: bool = False
    prefix_check: str = "warn"
    record_frames: bool = False
    env_workers: int = 16
    generate_opt_level: int = 1

    def __post_init__(self) -> None:
        if self.generate_opt_level not in GENERATE_OPT_LEVELS:
            raise ValueError(
                f"generate_opt_level={self.generate_opt_level} is not one of {GENERATE_OPT_LEVELS}"
            )
        if self.mode not in SAMPLE_MODES:
            raise ValueError(f"mode={self.mode!r} is not one of {list(SAMPLE_MODES)}")
        if self.prefix_check not in PREFIX_CHECK_MODES:
            raise ValueError(
                f"prefix_check={self.prefix_check!r} is not one of {list(PREFIX_CHECK_MODES)}"
            )
        for key in ("max_turns", "sequence_length", "env_workers"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.history_length < 0:
            raise ValueError(f"history_length must be >= 0, got {self.history_length}")


@dataclass
class RolloutResult:
    """Trajectories of one collection, ordered by group id then env, and their metrics."""

    trajectories: list[Trajectory]
    metrics: dict[str, float]


class EpisodePlayer(Protocol):
    """Plays one episode on an env and returns its trajectory: the env manager's own
    loop (:class:`EpisodeRunner`), or an agent behind the OpenAI-compatible proxy
    (:class:`agentgym.proxy.players.ProxyPlayer`)."""

    env_calls: set[asyncio.Future[Any]]
    """Env calls still running for cancelled episodes (awaited before the next batch)."""

    async def run(self, assignment: Assignment, env: EnvClient) -> Trajectory:
        """Play ``assignment`` on ``env``; a failure ends the trajectory, never raises."""
        ...

    def metrics(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """This kind's own metrics of a batch (beside :func:`rollout_metrics`)."""
        ...


PlayerFactory: TypeAlias = Callable[
    [GenerationBackend, ChatTokenizer, RolloutConfig, int], EpisodePlayer
]
"""Makes the :class:`EpisodePlayer` of a collection from its backend, chat, rollout config
and policy version (``EpisodeRunner`` itself is one); the build floor picks it
(``agent.kind``)."""


_POOLS: dict[int, ThreadPoolExecutor] = {}


def env_pool(workers: int) -> ThreadPoolExecutor:
    """The process's thread pool of ``workers`` threads for in-process env calls,
    started once and kept: starting 16 threads a batch cost more than the rollout's
    own bookkeeping of a batch of single-turn episodes. A call still queued when the
    episode awaiting it is cancelled is cancelled with it (asyncio chains the two)."""
    pool = _POOLS.get(workers)
    if pool is None:
        pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="agentgym-env")
    return pool


async def collect(
    manager: EnvManager,
    backend: GenerationBackend,
    chat: ChatTokenizer,
    config: RolloutConfig,
    *,
    policy_version: int = 0,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    players: PlayerFactory | None = None,
) -> RolloutResult:
    """Run the manager's next batch of episodes.

    Args:
        manager: Supplies envs, seeds and group ids.
        backend: Generates responses.
        chat: Tokenizes the conversation with the policy's chat template.
        config: Rollout limits and sampling.
        policy_version: Recorded on every trajectory.
        on_trajectory: Called with each trajectory as soon as it is finished.
        players: Who plays each episode (default: :class:`EpisodeRunner`, the env
            manager's own loop).

    Returns:
        The trajectories and their metrics. A trajectory whose env or
        generation raised ends with ``env_error``/``generation_error`` and
        keeps the turns it had; the batch always completes. With the
        manager's ``additional_groups``, the batch is the first
        ``manager.batch_groups × max_traj_per_env`` groups to complete; the
        episodes still running then are cancelled (``scheduling/cancelled_episodes``)
        and the finished ones of other groups left out (``scheduling/dropped_episodes``).
    """
    stop = tuple(sorted(set(config.sampling.stop_token_ids) | chat.end_of_turn_ids))
    config = replace(config, sampling=replace(config.sampling, stop_token_ids=stop))
    pool = env_pool(config.env_workers)
    lockstep = Lockstep(backend, len(manager.slots)) if config.generate_opt_level == 0 else None
    backend = lockstep or backend
    runner = (players or EpisodeRunner)(backend, chat, config, policy_version)
    closer = (
        BatchCloser(manager.batch_groups * manager.max_traj_per_env, manager.group_size)
        if manager.additional_groups
        else None
    )
    complete = asyncio.Event()

    async def run_env(episodes: Sequence[Assignment], env: EnvClient) -> list[Trajectory]:
        finished = []

        def done(_: int, trajectory: Trajectory) -> None:
            if on_trajectory is not None:
                on_trajectory(trajectory)
            finished.append(trajectory)
            if closer is not None and closer.add(trajectory):
                complete.set()

        await play_env(env, enumerate(episodes), runner, done)
        if lockstep is not None:  # the next turns need not wait for this env
            lockstep.leave()
        return finished

    assignments = manager.assignments()
    with FewerCollections():  # thousands of live episodes: see collection_gc
        if closer is None:
            per_env = await asyncio.gather(
                *(
                    run_env(episodes, env)
                    for episodes, env in zip(assignments, manager.clients(pool), strict=True)
                )
            )
            trajectories = [t for env_trajectories in per_env for t in env_trajectories]
        else:
            tasks = [
                asyncio.ensure_future(run_env(episodes, env))
                for episodes, env in zip(assignments, manager.clients(pool), strict=True)
            ]
            try:
                await _until(complete, tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                # an env call runs to its end, so the next reset does not race a step
                await asyncio.gather(*runner.env_calls, return_exceptions=True)
            trajectories = closer.batch()
    trajectories.sort(key=lambda t: (t.group_id, t.env_index))
    metrics = rollout_metrics(trajectories) | runner.metrics(trajectories)
    if closer is not None:
        episodes = sum(len(episodes) for episodes in assignments)
        metrics["scheduling/cancelled_episodes"] = float(episodes - closer.finished)
        metrics["scheduling/dropped_episodes"] = float(closer.finished - len(trajectories))
    return RolloutResult(trajectories, metrics)


async def play_env(
    env: EnvClient,
    episodes: Iterable[tuple[_K, Assignment]],
    runner: EpisodePlayer,
    finished: Callable[[_K, Trajectory], None],
    *,
    admit: Callable[[_K], AbstractAsyncContextManager[None]] | None = None,
) -> None:
    """The one per-env episode loop of every rollout: play ``episodes`` on ``env`` one
    after another and hand each trajectory to ``finished`` with its key.

    :func:`collect` passes one batch's episodes; the async rollout
    (:class:`~agentgym.rollout.async_rollout.AsyncRollout`) passes every batch's, keyed
    by batch and index, with ``admit``: the staleness bound's gate, held while the
    episode plays.
    """
    for key, assignment in episodes:
        if admit is None:
            trajectory = await runner.run(assignment, env)
        else:
            async with admit(key):
                trajectory = await runner.run(assignment, env)
        finished(key, trajectory)


async def _until(complete: asyncio.Event, tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Wait until ``complete`` is set or every task is done (raising a task's error)."""
    waiter = asyncio.ensure_future(complete.wait())
    pending = set(tasks)
    try:
        while pending and not complete.is_set():
            done, _ = await asyncio.wait({*pending, waiter}, return_when=asyncio.FIRST_COMPLETED)
            pending -= done
            for task in done - {waiter}:
                task.result()
    finally:
        waiter.cancel()


class EpisodeRunner:
    """Plays one episode at a time on an env (:func:`collect` and
    :class:`~agentgym.rollout.async_rollout.AsyncRollout` share it)."""

    def __init__(
        self,
        backend: GenerationBackend,
        chat: ChatTokenizer,
        config: RolloutConfig,
        policy_version: int,
    ) -> None:
        self.backend = backend
        self.chat = chat
        self.config = config
        self.policy_version = policy_version
        self.env_calls: set[asyncio.Future[Any]] = set()

    async def _env_call(self, call: Awaitable[_T], env: EnvClient) -> _T:
        """Await an env's reset or step; a cancelled episode leaves the call running to
        its end (tracked in :attr:`env_calls`), since a thread cannot be interrupted.
        An env called on the loop itself (``inline``) has no await point to cancel at."""
        if getattr(env, "inline", False):
            return await call
        future = asyncio.ensure_future(call)
        self.env_calls.add(future)
        future.add_done_callback(self.env_calls.discard)
        return await asyncio.shield(future)

    def metrics(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """None beside :func:`rollout_metrics`."""
        return {}

    def _frames(self, env: EnvClient) -> bool:
        return self.config.record_frames and env.render_mode == "rgb_array"

    async def run(self, assignment: Assignment, env: EnvClient) -> Trajectory:
        trajectory = new_trajectory(assignment, self.config.mode, self.policy_version)
        try:
            start = await self._env_call(
                env.reset(
                    assignment.seed, options=assignment.reset_options, frame=self._frames(env)
                ),
                env,
            )
        except Exception:
            trajectory.termination_reason = "env_error"
            trajectory.error = traceback.format_exc(limit=-8)
            return trajectory
        trajectory.tools = start.tools
        trajectory.messages = [
            {"role": "system", "content": start.instructions},
            {"role": "user", "content": start.observation},
        ]
        if start.frame is not None:
            trajectory.frames.append(start.frame)
        await self._play(env, trajectory, start.observation)
        if (
            self.config.prefix_check != "off"
            and trajectory.turns
            and self.config.mode == "trajectory"
        ):
            self._check(trajectory)
        return trajectory

    async def _play(self, env: EnvClient, trajectory: Trajectory, observation: str) -> None:
        config = self.config
        messages = trajectory.messages
        responses: dict[int, list[int]] = {}
        new_messages: list[Message] = list(messages)
        history: list[int] = []
        actions = 0
        trajectory.termination_reason = "max_turns"
        for turn_index in range(config.max_turns):
            if turn_index == 0:  # both modes: the opening messages (a group shares them)
                segment = prompt = self.chat.first_segment(messages, trajectory.tools)
            elif config.mode == "trajectory":
                previous = trajectory.turns[-1].response_ids
                segment = self.chat.next_segment(previous, new_messages, trajectory.tools)
                prompt = history + segment
            else:
                segment = prompt = self._step_prompt(messages, responses, trajectory.tools)
            if len(prompt) + config.sampling.max_new_tokens > config.sequence_length:
                trajectory.termination_reason = "max_length"
                return
            sampling = config.sampling
            if sampling.seed is not None:  # one stream per group, env and turn: batching-proof
                sampling = replace(
                    sampling,
                    seed=request_seed(
                        sampling.seed, trajectory.group_id, trajectory.env_index, turn_index
                    ),
                )
            try:
                generation = await self.backend.generate(prompt, sampling, env=env.backend_env)
            except Exception as error:  # a scripted policy acting on a lost env: the env's fault
                lost = isinstance(error, EnvLostError)
                trajectory.termination_reason = "env_error" if lost else "generation_error"
                trajectory.error = traceback.format_exc(limit=-8)
                return
            if sampling.stop_strings:
                decode = self.chat.decode_response
                generation = cut_at_stop_string(generation, sampling.stop_strings, decode)
            text = self.chat.decode_response(generation.token_ids)
            version = generation.policy_version
            turn = Turn(
                prompt_ids=segment,
                response_ids=list(generation.token_ids),
                logprobs=list(generation.logprobs),
                response_text=text,
                finish_reason=generation.finish_reason,
                observation=observation,
                policy_version=self.policy_version if version is None else version,
                token_versions=generation.token_versions,
            )
            if turn_index == 0:  # async generation: the version of its first turn
                trajectory.policy_version = turn.policy_version
            trajectory.turns.append(turn)
            messages.append({"role": "assistant", "content": text})
            responses[len(messages) - 1] = turn.response_ids
            history = prompt + turn.response_ids
            try:
                outcome = await self._env_call(env.step(text, frame=self._frames(env)), env)
            except Exception:
                trajectory.termination_reason = "env_error"
                trajectory.error = traceback.format_exc(limit=-8)
                return
            record_step(trajectory, turn, outcome)
            observation, info = outcome.observation, outcome.info
            terminated, truncated = outcome.terminated, outcome.truncated
            actions += len(turn.actions)
            if terminated or truncated:
                trajectory.termination_reason = "terminated" if terminated else "truncated"
                return
            if config.max_actions_per_traj is not None and actions >= config.max_actions_per_traj:
                trajectory.termination_reason = "max_actions"
                return
            new_messages = observation_messages(observation, info)
            if turn_index + 1 < config.max_turns:
                messages.extend(new_messages)

    def _step_prompt(
        self,
        messages: list[Message],
        responses: dict[int, list[int]],
        tools: list[dict[str, Any]],
    ) -> list[int]:
        """The prompt of a ``step``-mode sample: system, the last turns, the new observation."""
        start = step_window(messages, self.config.history_length)
        window = [messages[0], *messages[start:]]
        spliced: dict[int, list[int]] = {}
        for offset, message in enumerate(messages[start:], start=1):
            original = start + offset - 1
            if original not in responses:
                continue
            if self.config.strip_think_history and has_think(message["content"]):
                window[offset] = {**message, "content": strip_think(message["content"])}
            else:
                spliced[offset] = responses[original]
        return self.chat.render_ids(window, spliced, tools=tools, add_generation_prompt=True)

    def _check(self, trajectory: Trajectory) -> None:
        responses = {
            i: turn.response_ids
            for i, turn in zip(
                [i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant"],
                trajectory.turns,
                strict=True,
            )
        }
        result = self.chat.check(
            trajectory.messages, responses, trajectory.input_ids, tools=trajectory.tools
        )
        trajectory.prefix_drift = result.drift
        trajectory.retokenized = not result.exact
        report_drift(result, self.config.prefix_check, f"{trajectory.tag} seed {trajectory.seed}")


def new_trajectory(assignment: Assignment, mode: str, policy_version: int) -> Trajectory:
    """The empty trajectory of ``assignment``'s episode, before its first turn."""
    return Trajectory(
        env_name=assignment.slot.name,
        tag=assignment.slot.tag,
        group_id=assignment.group_id,
        seed=assignment.seed,
        env_index=assignment.slot.index,
        mode=mode,
        policy_version=policy_version,
    )


def request_seed(base: int, group_id: int, env_index: int, turn: int) -> int:
    """A sampling seed for one request, derived from the run's seed and its position.

    Members of a group get different seeds (their samples must differ); the
    same request in a resumed run gets the same seed.
    """
    state = np.random.SeedSequence([base, group_id, env_index, turn]).generate_state(1)
    return int(state[0] & 0x7FFFFFFF)
