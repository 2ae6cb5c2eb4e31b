"""One connection to an MCP server, used from synchronous code (a tool's function).

The official ``mcp`` SDK is asynchronous; the connection runs its client on an event
loop in a thread of its own and hands each call to it, waiting up to a timeout. The
server is a command started over stdio (``python calculator.py``) or a URL
(``http://host:port/mcp``, streamable HTTP). A server that dies, or a connection that
breaks, raises :class:`~agentgym.envs.tools.tools.ToolServerDiedError` naming the
server; :meth:`MCPConnection.ensure` starts it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from agentgym.envs.tools.tools import ToolError, ToolServerDiedError

REQUEST_TIMEOUT = -32001
"""The MCP SDK's error code for a request that timed out (``mcp_types.REQUEST_TIMEOUT``)."""
CONNECTION_CLOSED = -32000
"""Its code for a connection that closed under a request (the server is gone)."""


@dataclass(frozen=True)
class ServerTool:
    """A tool as the server describes it."""

    name: str
    description: str
    input_schema: dict[str, Any]


def server_target(server: str | Sequence[str]) -> Any:
    """What :class:`mcp.client.client.Client` connects to: a URL as it is, a command
    (a string split as a shell would, or a list) as stdio server parameters; ``python``
    is this interpreter."""
    from mcp import StdioServerParameters

    if isinstance(server, str) and server.startswith(("http://", "https://")):
        return server
    words = shlex.split(server) if isinstance(server, str) else [str(w) for w in server]
    if not words:
        raise ValueError("server: give a command (python my_server.py) or a URL")
    if words[0] in ("python", "python3"):
        words[0] = sys.executable
    return StdioServerParameters(command=words[0], args=words[1:])


class MCPConnection:
    """A live connection to ``server`` (see the module docstring).

    Args:
        server: A command or a URL.
        timeout: Seconds to connect, and the default for a call.
    """

    def __init__(self, server: str | Sequence[str], *, timeout: float = 30.0) -> None:
        self.server = server
        self.name = server if isinstance(server, str) else " ".join(server)
        self.timeout = timeout
        self.restarts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="mcp")
        self._thread.start()
        self._client: Any = None
        self._session: Future[None] | None = None
        self._closing = asyncio.Event()
        self.tools: list[ServerTool] = []
        self._connect()

    def _run(self, coroutine: Any, timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except FutureTimeout:
            future.cancel()
            raise

    def _connect(self) -> None:
        ready: Future[None] = Future()
        self._closing = asyncio.Event()
        self._session = asyncio.run_coroutine_threadsafe(self._hold(ready), self._loop)
        try:
            ready.result(self.timeout)
        except Exception as error:
            self._drop()
            raise ToolServerDiedError(
                f"MCP server {self.name!r} could not be reached: {type(error).__name__}: {error}"
            ) from error

    async def _hold(self, ready: Future[None]) -> None:
        """Open the client, list the tools, and hold the connection until closed (the
        SDK's contexts are entered and left in this one task)."""
        from mcp.client.client import Client

        try:
            async with Client(server_target(self.server)) as client:
                listed = await client.list_tools()
                self.tools = [
                    ServerTool(t.name, t.description or "", dict(t.input_schema))
                    for t in listed.tools
                ]
                self._client = client
                ready.set_result(None)
                await self._closing.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else RuntimeError(error))
        finally:
            self._client = None

    def ensure(self) -> None:
        """Start the server again (reconnect) when the last call found it gone."""
        if self._client is None:
            self.restarts += 1
            self._connect()

    def call(self, name: str, arguments: dict[str, Any], timeout: float | None = None) -> str:
        """Call tool ``name``; its text content.

        Raises:
            ToolError: The tool reported an error, or the call timed out (for the model).
            ToolServerDiedError: The server or the connection is gone.
        """
        if self._client is None:
            raise ToolServerDiedError(f"MCP server {self.name!r} is down")
        seconds = self.timeout if timeout is None else timeout
        try:
            result = self._run(self._call(name, arguments, seconds), seconds + 5)
        except (TimeoutError, FutureTimeout) as error:
            raise ToolError(f"the tool {name!r} did not answer within {seconds:g} s") from error
        except Exception as error:
            code = getattr(error, "code", None)  # an MCPError the server or the SDK answered
            if code == REQUEST_TIMEOUT:
                raise ToolError(f"the tool {name!r} did not answer within {seconds:g} s") from None
            if isinstance(code, int) and code != CONNECTION_CLOSED:
                raise ToolError(f"the tool {name!r} failed: {error}") from None
            self._drop()
            raise ToolServerDiedError(
                f"MCP server {self.name!r} failed during {name!r}: {type(error).__name__}: {error}"
            ) from error
        text = "\n".join(
            str(getattr(part, "text", "")) for part in result.content if hasattr(part, "text")
        )
        if getattr(result, "is_error", False):
            raise ToolError(text or f"the tool {name!r} failed")
        return text

    async def _call(self, name: str, arguments: dict[str, Any], seconds: float) -> Any:
        return await self._client.call_tool(name, arguments, read_timeout_seconds=seconds)

    def _drop(self) -> None:
        """Close a connection, or forget a broken one (a stdio server ends with it)."""
        session, self._session = self._session, None
        self._client = None
        if session is None:
            return
        self._loop.call_soon_threadsafe(self._closing.set)
        with contextlib.suppress(BaseException):  # the broken transport's own errors
            session.result(10)

    def close(self) -> None:
        """Close the connection (the stdio server ends with it) and the loop's thread."""
        self._drop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
