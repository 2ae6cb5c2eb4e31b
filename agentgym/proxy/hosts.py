"""Where an episode's session lives: on a proxy server in this process (the run's event
loop), or on one in an engine's own process (``distributed=ray``: one server per engine,
beside its model, so an agent's requests go straight to the engine that generates them
and only the finished recording comes back to the driver).

Either way a session is opened from a :class:`SessionSpec` and closed into a
:class:`Recording`, which :func:`~agentgym.proxy.players.fill_trajectory` turns into
the episode's :class:`~agentgym.trajectory.Trajectory`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from agentgym.proxy.recorder import SessionRecorder
from agentgym.proxy.server import Feedback, ProxyServer, Session
from agentgym.rollout.backends.base import GenerationBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.loop import RolloutConfig
from agentgym.trajectory import Turn

if TYPE_CHECKING:
    from agentgym.rollout.engines import EngineClient


@dataclass(frozen=True)
class SessionSpec:
    """What a session records and where its server listens.

    Attributes:
        config: Rollout limits, sampling and mode.
        group_id: The episode's group (seeds requests).
        env_index: The episode's env (seeds requests).
        policy_version: Recorded where the backend reports no version.
        host: The address the server listens on (``agent.host``).
        port: Its port (0: any free one).
    """

    config: RolloutConfig
    group_id: int = 0
    env_index: int = 0
    policy_version: int = 0
    host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True)
class OpenedSession:
    """A session as its runner sees it: its base URL and the server's bearer token."""

    name: str
    base_url: str
    token: str


_RECORDED = ("turns", "conversation", "tools", "ending", "error")
"""The :class:`Recording` fields that a session's recorder holds under the same names."""


@dataclass
class Recording:
    """A finished session: what the proxy recorded and what the agent reported.

    Attributes:
        turns: The model calls, token for token.
        conversation: The last request's messages and the reply.
        tools: The tool schemas the template rendered.
        ending: Why the proxy refused to go on (``max_turns``, ``max_length``,
            ``generation_error``), or None.
        error: The generation error's text, if any.
        late_calls: Requests after the session finished.
        feedback: The reward the agent posted, if it did.
    """

    turns: list[Turn] = field(default_factory=list)
    conversation: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    ending: str | None = None
    error: str | None = None
    late_calls: int = 0
    feedback: Feedback | None = None

    @classmethod
    def of(cls, session: Session) -> Recording:
        """``session``'s recording, as it stands."""
        recorded = {name: getattr(session.recorder, name) for name in _RECORDED}
        return cls(**recorded, late_calls=session.late_calls, feedback=session.feedback)


class SessionHost(Protocol):
    """Opens sessions on a proxy server and closes them into recordings."""

    async def open(self, spec: SessionSpec, backend_env: Any = None) -> OpenedSession:
        """A new session recording as ``spec`` says."""
        ...

    async def close(self, opened: OpenedSession) -> Recording:
        """Finish the session (later calls are answered 410) and return its recording."""
        ...


class ServerSessions:
    """The sessions of one proxy server, which starts on first use on the running event
    loop: the run's loop (:class:`LocalHost`) or an engine's (its own process)."""

    def __init__(self) -> None:
        self.server: ProxyServer | None = None
        self._starting = asyncio.Lock()

    async def open(
        self,
        spec: SessionSpec,
        backend: GenerationBackend,
        chat: ChatTokenizer,
        backend_env: Any = None,
    ) -> OpenedSession:
        """A new session generating on ``backend`` with ``chat``'s template."""
        async with self._starting:
            if self.server is None:
                server = ProxyServer(spec.host, spec.port)
                await server.start()
                self.server = server
        recorder = SessionRecorder(
            backend,
            chat,
            spec.config,
            group_id=spec.group_id,
            env_index=spec.env_index,
            policy_version=spec.policy_version,
            backend_env=backend_env,
        )
        session = self.server.open(recorder)
        return OpenedSession(session.name, session.base_url, self.server.token)

    async def close(self, name: str) -> Recording:
        """Finish session ``name`` and return its recording."""
        assert self.server is not None
        session = self.server.sessions[name]
        self.server.finish(session)
        return Recording.of(session)

    async def stop(self) -> None:
        """Stop the server, if it started."""
        if self.server is not None:
            await self.server.stop()
            self.server = None


@dataclass
class LocalHost:
    """Sessions on a proxy server in this process, generating on ``backend``."""

    sessions: ServerSessions
    backend: GenerationBackend
    chat: ChatTokenizer

    async def open(self, spec: SessionSpec, backend_env: Any = None) -> OpenedSession:
        """A new session on this process's server."""
        return await self.sessions.open(spec, self.backend, self.chat, backend_env)

    async def close(self, opened: OpenedSession) -> Recording:
        """Finish the session and return its recording."""
        return await self.sessions.close(opened.name)


@dataclass
class EngineHost:
    """Sessions on the proxy server in an engine's process (``distributed=ray``)."""

    engine: EngineClient

    async def open(self, spec: SessionSpec, backend_env: Any = None) -> OpenedSession:
        """A new session on the engine's server (``backend_env`` stays here: model
        engines do not read it)."""
        return await self.engine.open_session(spec)

    async def close(self, opened: OpenedSession) -> Recording:
        """Finish the session on the engine and bring its recording here."""
        return await self.engine.close_session(opened.name)
