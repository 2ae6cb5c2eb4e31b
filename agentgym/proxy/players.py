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
from typing import Any

from agentgym.proxy.recorder import SessionRecorder
from agentgym.proxy.runners import AgentResult, AgentRunner, AgentTask, load_runner
from agentgym.proxy.server import ProxyServer, Session
from agentgym.rollout.backends.base import GenerationBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import Assignment
from agentgym.rollout.loop import RolloutConfig, new_trajectory
from agentgym.rollout.workers import EnvClient
from agentgym.trajectory import Trajectory


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
    and owns the proxy server of each event loop they play on.

    Args:
        settings: The ``agent`` section.
        runner: The runner (default: the one ``settings.runner`` names).
    """

    def __init__(self, settings: AgentSettings, runner: AgentRunner | None = None) -> None:
        self.settings = settings
        self.runner = runner or load_runner(settings.runner)
        self._servers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ProxyServer] = (
            weakref.WeakKeyDictionary()
        )
        self._starting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
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

    async def server(self) -> ProxyServer:
        """The proxy server of the running event loop, started on first use."""
        loop = asyncio.get_running_loop()
        lock = self._starting.setdefault(loop, asyncio.Lock())
        async with lock:
            server = self._servers.get(loop)
            if server is None:
                server = ProxyServer(self.settings.host, self.settings.port)
                await server.start()
                self._servers[loop] = server
        return server

    async def close(self) -> None:
        """Stop the running loop's server, if it has one."""
        server = self._servers.pop(asyncio.get_running_loop(), None)
        if server is not None:
            await server.stop()


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

    async def run(self, assignment: Assignment, env: EnvClient) -> Trajectory:
        """Play ``assignment`` with the runner; failures end the trajectory."""
        config = self.config
        trajectory = new_trajectory(assignment, config.mode, self.policy_version)
        server = await self.players.server()
        recorder = SessionRecorder(
            self.backend,
            self.chat,
            config,
            group_id=assignment.group_id,
            env_index=assignment.slot.index,
            policy_version=self.policy_version,
            backend_env=env.backend_env,
        )
        session = server.open(recorder)
        task = AgentTask(
            seed=assignment.seed,
            env_name=assignment.slot.name,
            tag=assignment.slot.tag,
            group_id=assignment.group_id,
            env_index=assignment.slot.index,
            reset_options=assignment.reset_options,
            max_turns=config.max_turns,
            max_actions=config.max_actions_per_traj,
            mode=config.mode,
            history_length=config.history_length,
            strip_think_history=config.strip_think_history,
            env=env,
        )
        result: AgentResult | None = None
        try:
            result = await asyncio.wait_for(
                self._play(task, session, server.token), self.players.settings.timeout
            )
        except TimeoutError:
            trajectory.error = (
                f"the agent did not return within agent.timeout={self.players.settings.timeout}s"
            )
        except Exception:
            trajectory.error = traceback.format_exc(limit=-8)
        finally:
            server.finish(session)
        fill_trajectory(trajectory, recorder, session, result)
        return trajectory

    def metrics(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """``proxy/requests`` (model calls per episode) and ``proxy/prefix_breaks`` (new
        samples started because an agent rewrote its history, trajectory mode)."""
        turns = [turn for trajectory in trajectories for turn in trajectory.turns]
        return {
            "proxy/requests": len(turns) / max(len(trajectories), 1),
            "proxy/prefix_breaks": float(sum(turn.starts_sample for turn in turns)),
        }

    async def _play(self, task: AgentTask, session: Session, token: str) -> AgentResult | None:
        run = self.players.runner.run
        if inspect.iscoroutinefunction(run):
            return await run(task, session.base_url, token)
        return await asyncio.to_thread(run, task, session.base_url, token)  # type: ignore[arg-type]


def fill_trajectory(
    trajectory: Trajectory, recorder: SessionRecorder, session: Session, result: AgentResult | None
) -> None:
    """The trajectory from the session's recording and the runner's report."""
    trajectory.turns = recorder.turns
    trajectory.messages = recorder.conversation
    trajectory.tools = recorder.tools
    if trajectory.turns:
        trajectory.policy_version = trajectory.turns[0].policy_version
    if recorder.ending == "generation_error":
        trajectory.termination_reason, trajectory.error = "generation_error", recorder.error
        return
    cut_short = recorder.ending in ("max_turns", "max_length")  # the proxy refused: a limit
    failure = None if cut_short and trajectory.turns else trajectory.error
    if failure is None and not trajectory.turns:
        failure = trajectory.error or "the agent returned without calling the model"
    if failure is None and session.late_calls:
        failure = f"the agent called the model {session.late_calls} time(s) after its episode ended"
    if failure is not None:
        trajectory.termination_reason, trajectory.error = "agent_error", failure
        return
    trajectory.error = None
    result = result or AgentResult()
    feedback = session.feedback
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
    trajectory.termination_reason = recorder.ending or result.termination_reason or "terminated"
