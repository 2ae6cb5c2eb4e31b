"""The OpenAI-compatible proxy server (FastAPI, served by uvicorn on the run's own
event loop).

Each episode is a session with its own base URL, ``http://HOST:PORT/s/<session>/v1``;
every request carries the run's bearer token. Routes under a session:

* ``POST /chat/completions``: messages, ``tools`` / ``tool_choice`` (``none``: the text
  as written, no ``tool_calls``), ``temperature``,
  ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``n`` (1), ``seed``,
  ``logprobs``, ``stream`` (server-sent events);
* ``POST /completions``: a text or token-id prompt;
* ``GET /models``;
* ``POST /feedback`` (beside ``/v1``): the episode's reward, which ends the session
  (Trinity-RFT's serve mode).

A server that serves agents started by someone else (``mode: serve``,
:mod:`agentgym.proxy.serve`) also answers ``POST /sessions``, which opens a session
for a task and returns its base URL.

A bad request gets OpenAI's error body with a 4xx status; the server goes on.
FastAPI and uvicorn come with the ``[proxy]`` extra.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from jinja2 import TemplateError

from agentgym.proxy.messages import MessageError
from agentgym.proxy.recorder import ProxyError, Reply, RequestParams, SessionRecorder

KEEP_ALIVE = 3600
"""Seconds an idle connection stays open. uvicorn's default, 5 s, is shorter than a
training step: the server then closed connections its agents' pools were about to
reuse, and a request sent as the close crossed it failed (seen: 4 episodes of a step)."""


WILDCARDS = ("0.0.0.0", "::", "")
"""Addresses that listen on every interface."""


def reachable_address() -> str:
    """This machine's address as other machines reach it (loopback when it has none)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass
class Feedback:
    """What an agent reported at ``/feedback``."""

    reward: float
    success: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Session:
    """One episode's session on the server.

    Attributes:
        name: Its id in the URL.
        recorder: Its recording.
        base_url: What the agent's OpenAI client takes as ``base_url``.
        finished: No more requests are taken (the runner returned, or feedback came).
        late_calls: Requests that came after it finished.
        feedback: The reward the agent posted, if it did.
        opened: When it was opened (``time.monotonic``).
        task: The task it plays, as its opener named it (``mode: serve``).
    """

    name: str
    recorder: SessionRecorder
    base_url: str
    finished: bool = False
    late_calls: int = 0
    feedback: Feedback | None = None
    opened: float = field(default_factory=time.monotonic)
    task: str | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ProxyServer:
    """The proxy's HTTP server and its sessions.

    Args:
        host: The address it listens on; anything but loopback must be asked for
            (``agent.host``), and the token is required there too.
        port: Its port (0: any free one).
        model_name: The model id ``/models`` reports (requests may name any).
        max_sessions_kept: Finished sessions remembered (their late calls are answered
            410 and counted, as ROLL answers them); older ones are forgotten (404).
        token: The bearer token every request must carry (None: a new random one).

    Attributes:
        opener: Answers ``POST /sessions`` with a new session for the body's ``task``
            (None: the route answers 404; the run opens its sessions itself).
        on_finish: Called with each session as it finishes.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        model_name: str = "policy",
        max_sessions_kept: int = 4096,
        token: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.model_name = model_name
        self.token = token or secrets.token_urlsafe(24)
        self.opener: Callable[[str | None], Awaitable[Session]] | None = None
        self.on_finish: Callable[[Session], None] | None = None
        self.max_sessions_kept = max_sessions_kept
        self.sessions: dict[str, Session] = {}
        self._counter = 0
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The server's root URL (on every address: this machine's, which agents on other
        machines can reach, e.g. runners beside an engine on another node)."""
        host = reachable_address() if self.host in WILDCARDS else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Listen and serve on the running event loop (returns once it accepts)."""
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto IPPROTO_TCP: asyncio sets TCP_NODELAY only on such sockets (and those they
        # accept); without it each response waits ~40 ms for a delayed ACK
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(  # log_config None: the run's logging stays as it is
            build_app(self),
            log_config=None,
            lifespan="off",
            access_log=False,
            timeout_keep_alive=KEEP_ALIVE,
        )
        self._server = _quiet_server(config)
        self._task = asyncio.ensure_future(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it stopped
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        """Stop serving (requests in flight finish)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
            self._server = self._task = None

    def open(self, recorder: SessionRecorder, task: str | None = None) -> Session:
        """A new session recording into ``recorder``."""
        self._counter += 1
        name = f"{self._counter:x}{secrets.token_hex(4)}"
        recorder.session = name
        session = Session(name, recorder, f"{self.url}/s/{name}/v1", task=task)
        self.sessions[name] = session
        return session

    def finish(self, session: Session) -> None:
        """Take no more requests in ``session`` (later ones are answered 410 Gone and counted)."""
        if session.finished:
            return
        session.finished = True
        if self.on_finish is not None:
            self.on_finish(session)
        finished = [name for name, s in self.sessions.items() if s.finished]
        for name in finished[: max(0, len(finished) - self.max_sessions_kept)]:
            del self.sessions[name]

    def session(self, name: str, authorization: str | None) -> Session:
        """The open session ``name`` for a request with ``authorization``.

        Raises:
            ProxyError: 401 without the run's token, 404 for an unknown session,
                410 for a finished one (counted in its ``late_calls``).
        """
        self.check_token(authorization)
        found = self.sessions.get(name)
        if found is None:
            raise ProxyError(404, f"no session {name!r} on this proxy", code="unknown_session")
        if found.finished:
            found.late_calls += 1
            raise ProxyError(
                410, f"session {name!r} has finished: its episode is over", code="session_finished"
            )
        return found

    def check_token(self, authorization: str | None) -> None:
        """Raise 401 unless ``authorization`` carries the run's bearer token."""
        expected = f"Bearer {self.token}"
        if authorization is None or not secrets.compare_digest(authorization, expected):
            raise ProxyError(
                401,
                "missing or wrong bearer token: use the api_key the runner was given",
                code="invalid_api_key",
                kind="authentication_error",
            )


def _quiet_server(config: Any) -> Any:
    """uvicorn's server without its signal handlers: Ctrl-C stays the run's."""
    import uvicorn

    class Server(uvicorn.Server):
        def capture_signals(self) -> Any:
            return nullcontext()

    return Server(config)


def build_app(proxy: ProxyServer) -> Any:
    """The FastAPI app of ``proxy``'s routes."""
    app = FastAPI(title="agentgym proxy", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ProxyError)
    async def proxy_error(_: Request, error: ProxyError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(Exception)
    async def server_error(_: Request, error: Exception) -> JSONResponse:
        failure = ProxyError(500, f"the proxy failed: {type(error).__name__}: {error}")
        return JSONResponse(failure.body(), status_code=500)

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ProxyError(400, f"the request body is not JSON: {error}") from error
        if not isinstance(body, dict):
            raise ProxyError(400, "the request body must be a JSON object")
        return body

    @app.post("/sessions")
    async def sessions(request: Request) -> dict[str, Any]:
        proxy.check_token(request.headers.get("authorization"))
        if proxy.opener is None:
            raise ProxyError(404, "this proxy opens its sessions itself", code="unknown_route")
        body = await body_of(request) if await request.body() else {}
        task = body.get("task")
        if task is not None and not isinstance(task, str | int):
            raise ProxyError(400, "'task' must be a string or an integer")
        session = await proxy.opener(None if task is None else str(task))
        return {"session": session.name, "base_url": session.base_url, "task": session.task}

    @app.get("/s/{name}/v1/models")
    async def models(name: str, request: Request) -> dict[str, Any]:
        proxy.session(name, request.headers.get("authorization"))
        model = {"id": proxy.model_name, "object": "model", "created": 0, "owned_by": "agentgym"}
        return {"object": "list", "data": [model]}

    @app.post("/s/{name}/v1/chat/completions", response_model=None)
    async def chat_completions(name: str, request: Request) -> Any:
        session = proxy.session(name, request.headers.get("authorization"))
        body = await body_of(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ProxyError(400, "messages must be a list of message objects")
        tools = _tools(body.get("tools"))
        params = request_params(body)
        async with session.lock:
            try:
                reply = await session.recorder.chat_completion(messages, tools, params)
            except asyncio.CancelledError:
                raise _cancelled() from None
            except MessageError as error:
                raise ProxyError(400, str(error), code="invalid_messages") from error
            except (TemplateError, ValueError) as error:  # raise_exception raises ValueError
                raise ProxyError(
                    400, f"the chat template cannot render this request: {error}"
                ) from error
        model = str(body.get("model") or proxy.model_name)
        if body.get("stream"):
            pieces = session.recorder.pieces(reply.token_ids) if body.get("logprobs") else None
            chunks = _chat_chunks(reply, model, body, pieces)
            return StreamingResponse(chunks, media_type="text/event-stream")
        pieces = session.recorder.pieces(reply.token_ids) if body.get("logprobs") else None
        return JSONResponse(_chat_response(reply, model, pieces))

    @app.post("/s/{name}/v1/completions")
    async def completions(name: str, request: Request) -> dict[str, Any]:
        session = proxy.session(name, request.headers.get("authorization"))
        body = await body_of(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) and not (
            isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        ):
            raise ProxyError(400, "prompt must be a string or a list of token ids")
        params = request_params(body)
        async with session.lock:
            try:
                reply = await session.recorder.completion(prompt, params)
            except asyncio.CancelledError:
                raise _cancelled() from None
        return {
            "id": f"cmpl-{session.name}-{len(session.recorder.turns)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": str(body.get("model") or proxy.model_name),
            "choices": [
                {
                    "index": 0,
                    "text": reply.content,
                    "finish_reason": reply.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": _usage(reply),
        }

    @app.post("/s/{name}/feedback")
    async def feedback(name: str, request: Request) -> dict[str, Any]:
        session = proxy.session(name, request.headers.get("authorization"))
        body = await body_of(request)
        reward = body.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise ProxyError(400, "feedback needs a numeric 'reward'")
        success = body.get("success")
        info = body.get("info") or {}
        if not isinstance(info, dict):
            raise ProxyError(400, "feedback's 'info' must be an object")
        session.feedback = Feedback(float(reward), None if success is None else bool(success), info)
        proxy.finish(session)
        return {"session": name, "finished": True}

    return app


def _cancelled() -> ProxyError:
    """A request whose generation was cancelled: its episode was (the run is stopping, or
    a step closed with extra groups); answered, not logged as the server's failure."""
    return ProxyError(503, "the episode was cancelled: the run is stopping", code="cancelled")


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools
    ):
        raise ProxyError(400, "tools must be a list of {'type': 'function', 'function': {...}}")
    return tools


def request_params(body: Mapping[str, Any]) -> RequestParams:
    """The sampling options of a request body.

    Raises:
        ProxyError: For ``n`` other than 1, or a value of the wrong type.
    """
    n = body.get("n", 1)
    if n not in (None, 1):
        raise ProxyError(
            400,
            f"n={n}: the proxy records one response per request; send {n} requests",
            code="n_not_supported",
        )
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    try:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        return RequestParams(
            temperature=_number(body.get("temperature")),
            top_p=_number(body.get("top_p")),
            max_tokens=None if max_tokens is None else int(max_tokens),
            seed=None if body.get("seed") is None else int(body["seed"]),
            stop=tuple(str(s) for s in stops),
            parse_tools=body.get("tool_choice") != "none",
        )
    except (TypeError, ValueError) as error:
        raise ProxyError(400, f"a sampling option has the wrong type: {error}") from error


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": len(reply.token_ids),
        "total_tokens": reply.prompt_tokens + len(reply.token_ids),
    }


def _message(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["content"] = reply.content or None
        message["tool_calls"] = reply.tool_calls
    return message


def _logprobs(reply: Reply, pieces: list[str]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": piece,
                "logprob": logprob,
                "bytes": list(piece.encode()),
                "top_logprobs": [],
            }
            for piece, logprob in zip(pieces, reply.logprobs, strict=True)
        ]
    }


def _chat_response(reply: Reply, model: str, pieces: list[str] | None) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{secrets.token_hex(8)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": _message(reply),
                "finish_reason": reply.finish_reason,
                "logprobs": None if pieces is None else _logprobs(reply, pieces),
            }
        ],
        "usage": _usage(reply),
    }


async def _chat_chunks(
    reply: Reply, model: str, body: Mapping[str, Any], pieces: list[str] | None
) -> AsyncIterator[str]:
    """The reply as server-sent events: the message in one chunk, then the finish
    reason (and usage, with ``stream_options.include_usage``), then ``[DONE]``."""
    base = {
        "id": f"chatcmpl-{secrets.token_hex(8)}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }
    delta = _message(reply)
    if "tool_calls" in delta:
        delta["tool_calls"] = [{**call, "index": i} for i, call in enumerate(delta["tool_calls"])]
    first = {"index": 0, "delta": delta, "finish_reason": None}
    if pieces is not None:
        first["logprobs"] = _logprobs(reply, pieces)
    yield f"data: {json.dumps({**base, 'choices': [first]})}\n\n"
    last = {"index": 0, "delta": {}, "finish_reason": reply.finish_reason}
    yield f"data: {json.dumps({**base, 'choices': [last]})}\n\n"
    options = body.get("stream_options") or {}
    if isinstance(options, dict) and options.get("include_usage"):
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': _usage(reply)})}\n\n"
    yield "data: [DONE]\n\n"
