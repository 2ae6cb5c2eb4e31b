"""Episodes played by an agent behind the proxy: a kind of
:class:`~agentgym.rollout.loop.EpisodePlayer` (``agent.kind: proxy``).

For each episode the player opens a session on the proxy server, hands the runner
its task, base URL and token, waits for it within ``agent.timeout``, closes the
session and builds the :class:`~agentgym.trajectory.Trajectory` from the session's
recording and the runner's report. Rewards then flow through the same
normalisation and advantages as the env manager's own episodes.

A runner that raises, outlasts its timeout or never calls the model ends its episode
with ``agent_error`` (counted in ``train/failed``, named on the console); so does one
whose agent calls the model after its episode ended. The batch always completes.
"""

from __future__ import annotations

import asyncio
import inspect
import traceback
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentgym.proxy.hosts import (
    EngineHost,
    LocalHost,
    OpenedSession,
    Recording,
    ServerSessions,
    SessionHost,
    SessionSpec,
)
from agentgym.proxy.runners import AgentResult, AgentRunner, AgentTask, load_runner
from agentgym.rollout.backends.base import GenerationBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.engines import EngineClient
from agentgym.rollout.env_manager import Assignment
from agentgym.rollout.loop import RolloutConfig, new_trajectory
from agentgym.rollout.router import Router
from agentgym.rollout.workers import EnvClient
from agentgym.trajectory import Trajectory

if TYPE_CHECKING:
    from agentgym.rollout.engines import EngineClient

_FROM_ASSIGNMENT = ("seed", "group_id", "reset_options")
"""The :class:`AgentTask` fields that an episode's assignment holds under the same names."""

_FROM_ROLLOUT_CONFIG = ("max_turns", "mode", "history_length", "strip_think_history")
"""The :class:`AgentTask` fields that the rollout config holds under the same names."""


@dataclass(frozen=True)
class AgentSettings:
    """The ``agent`` config section, for ``kind: proxy``.

    Attributes:
        runner: Who plays each episode: ``env`` (the built-in env runner) or an
            import path (``package.module:Class``).
        timeout: Seconds an episode's runner may take.
        host: Where the proxy listens (loopback unless set otherwise).
        port: Its port (0: any free one).
    """

    runner: str = "env"
    timeout: float = 600.0
    host: str = "127.0.0.1"
    port: int = 0


class ProxyPlayers:
    """Makes the proxy's episode players (a :class:`~agentgym.rollout.loop.PlayerFactory`)
    and picks where each episode's session lives.

    Args:
        settings: The ``agent`` section.
        runner: The runner (default: the one ``settings.runner`` names).
        on_engines: Host each session on the proxy server of an engine's own process
            (``distributed=ray``; the engine with the fewest open sessions), when the
            backend is engine workers (one, or a router over several); otherwise (and
            by default) on this process's server, one per event loop. Under
            ``async_generation_ratio`` the backend is the pausable client, which holds
            requests for each weight sync and versions every response: sessions stay
            on this process's server, where its requests pass through it.
    """

    def __init__(
        self,
        settings: AgentSettings,
        runner: AgentRunner | None = None,
        *,
        on_engines: bool = False,
    ) -> None:
        self.settings = settings
        self.runner = runner or load_runner(settings.runner)
        self.on_engines = on_engines
        self.open_sessions: dict[str, int] = {}
        """Sessions open on each engine (by its name)."""
        self._servers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ServerSessions] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(
        self,
        backend: GenerationBackend,
        chat: ChatTokenizer,
        config: RolloutConfig,
        policy_version: int,
    ) -> ProxyPlayer:
        """A player of one collection's episodes."""
        return ProxyPlayer(self, backend, chat, config, policy_version)

    def host(self, backend: GenerationBackend, chat: ChatTokenizer) -> SessionHost:
        """Where the next session lives: the least busy engine's server when sessions go
        on engines, else the running loop's own server."""
        engines = _engines(backend) if self.on_engines else []
        if engines:
            return EngineHost(min(engines, key=lambda e: self.open_sessions.get(e.name, 0)))
        loop = asyncio.get_running_loop()
        sessions = self._servers.get(loop)
        if sessions is None:
            sessions = self._servers[loop] = ServerSessions()
        return LocalHost(sessions, backend, chat)

    async def close(self) -> None:
        """Stop the running loop's server, if it has one."""
        sessions = self._servers.pop(asyncio.get_running_loop(), None)
        if sessions is not None:
            await sessions.stop()


def _engines(backend: GenerationBackend) -> list[EngineClient]:
    """The engine workers behind ``backend`` (none when any part of it is not one)."""
    parts = backend.backends if isinstance(backend, Router) else [backend]
    return list(parts) if all(isinstance(part, EngineClient) for part in parts) else []  # type: ignore[arg-type]


@dataclass
class ProxyPlayer:
    """Plays one collection's episodes through the proxy (see the module docstring)."""

    players: ProxyPlayers
    backend: GenerationBackend
    chat: ChatTokenizer
    config: RolloutConfig
    policy_version: int
    env_calls: set[asyncio.Future[Any]] = field(default_factory=set)
    """Always empty: the runner's env calls are its own."""
    on_engines: int = 0
    """Sessions this player hosted on engines' own servers."""

    async def run(self, assignment: Assignment, env: EnvClient) -> Trajectory:
        """Play ``assignment`` with the runner; failures end the trajectory."""
        config, settings = self.config, self.players.settings
        trajectory = new_trajectory(assignment, config.mode, self.policy_version)
        host = self.players.host(self.backend, self.chat)
        spec = SessionSpec(
            config,
            group_id=assignment.group_id,
            env_index=assignment.slot.index,
            policy_version=self.policy_version,
            host=settings.host,
            port=settings.port,
        )
        engine = host.engine.name if isinstance(host, EngineHost) else None
        if engine is not None:
            self.players.open_sessions[engine] = self.players.open_sessions.get(engine, 0) + 1
            self.on_engines += 1
        try:
            try:
                opened = await host.open(spec, env.backend_env)
            except Exception:  # the engine that would host it is gone, or its server failed
                trajectory.termination_reason = "generation_error"
                trajectory.error = traceback.format_exc(limit=-8)
                return trajectory
            recording, result = await self._play(assignment, env, opened, trajectory, host)
        finally:
            if engine is not None:
                self.players.open_sessions[engine] -= 1
        fill_trajectory(trajectory, recording, result)
        return trajectory

    async def _play(
        self,
        assignment: Assignment,
        env: EnvClient,
        opened: OpenedSession,
        trajectory: Trajectory,
        host: SessionHost,
    ) -> tuple[Recording, AgentResult | None]:
        """Run the runner on ``opened`` within ``agent.timeout``; the session's recording
        and the runner's report (None when it failed: ``trajectory.error`` says why)."""
        config, settings = self.config, self.players.settings
        slot = assignment.slot
        task = AgentTask(
            env_name=slot.name,
            tag=slot.tag,
            env_index=slot.index,
            max_actions=config.max_actions_per_traj,
            env=env,
            **{name: getattr(assignment, name) for name in _FROM_ASSIGNMENT},
            **{name: getattr(config, name) for name in _FROM_ROLLOUT_CONFIG},
        )
        result: AgentResult | None = None
        try:
            result = await asyncio.wait_for(
                self._run_runner(task, opened.base_url, opened.token), settings.timeout
            )
        except TimeoutError:
            trajectory.error = f"the agent did not return within agent.timeout={settings.timeout}s"
        except Exception:
            trajectory.error = traceback.format_exc(limit=-8)
        finally:
            recording = await host.close(opened)
        return recording, result

    def metrics(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """``proxy/requests`` (model calls per episode), ``proxy/prefix_breaks`` (new
        samples started because an agent rewrote its history, trajectory mode) and
        ``proxy/on_engines`` (the share of sessions hosted in engines' processes)."""
        turns = [turn for trajectory in trajectories for turn in trajectory.turns]
        episodes = max(len(trajectories), 1)
        return {
            "proxy/requests": len(turns) / episodes,
            "proxy/prefix_breaks": float(sum(turn.starts_sample for turn in turns)),
            "proxy/on_engines": self.on_engines / episodes,
        }

    async def _run_runner(self, task: AgentTask, base_url: str, token: str) -> AgentResult | None:
        run = self.players.runner.run
        if inspect.iscoroutinefunction(run):
            return await run(task, base_url, token)
        return await asyncio.to_thread(run, task, base_url, token)  # type: ignore[arg-type]


def fill_trajectory(
    trajectory: Trajectory, recording: Recording, result: AgentResult | None
) -> None:
    """The trajectory from the session's recording and the runner's report."""
    trajectory.turns = recording.turns
    trajectory.messages = recording.conversation
    trajectory.tools = recording.tools
    if trajectory.turns:
        trajectory.policy_version = trajectory.turns[0].policy_version
    if recording.ending == "generation_error":
        trajectory.termination_reason, trajectory.error = "generation_error", recording.error
        return
    cut_short = recording.ending in ("max_turns", "max_length")  # the proxy refused: a limit
    failure = None if cut_short and trajectory.turns else trajectory.error
    if failure is None and not trajectory.turns:
        failure = trajectory.error or "the agent returned without calling the model"
    if failure is None and recording.late_calls:
        failure = (
            f"the agent called the model {recording.late_calls} time(s) after its episode ended"
        )
    if failure is not None:
        trajectory.termination_reason, trajectory.error = "agent_error", failure
        return
    trajectory.error = None
    result = result or AgentResult()
    feedback = recording.feedback
    reports = result.turns or []
    for turn, report in zip(trajectory.turns, reports, strict=False):
        turn.reward = report.reward
        turn.action_is_valid = report.action_is_valid
        turn.actions = list(report.actions)
    reward = result.reward
    if reward is None and not reports and feedback is not None:
        reward = feedback.reward
    if reward is not None:  # the episode's reward, on its last turn
        trajectory.turns[-1].reward += reward - sum(turn.reward for turn in trajectory.turns)
    trajectory.score = sum(turn.reward for turn in trajectory.turns)
    trajectory.success = result.success or bool(feedback is not None and feedback.success)
    trajectory.termination_reason = recording.ending or result.termination_reason or "terminated"
