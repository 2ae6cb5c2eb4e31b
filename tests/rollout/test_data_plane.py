"""The env workers' data plane: requests over a socket, the key, a replaced connection,
heartbeats, a silent or vanished worker."""

from __future__ import annotations

import asyncio
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from agentgym.cluster import LocalHandle, RpcTimeoutError, WorkerDiedError
from agentgym.rollout.data_plane import (
    HandshakeError,
    accept_handshake,
    connect,
    read_frame,
    write_frame,
)
from agentgym.rollout.worker_client import WorkerChannel
from agentgym.rollout.workers import EnvAnswer, EnvBuild, EnvLostError, EnvRequest, EnvWorker
from tests.rollout.envs import CountEnv, registered

KEY = secrets.token_bytes(32)


@contextmanager
def worker(delay: float = 0.0, envs: int = 2) -> Iterator[EnvWorker]:
    with registered("plane_count", lambda **kw: CountEnv(delay=delay, **kw)):
        made = EnvWorker([EnvBuild("plane_count")] * envs, serve_on=("127.0.0.1", KEY))
    try:
        yield made
    finally:
        made.close()


async def answers_for(reader: asyncio.StreamReader, count: int) -> list[EnvAnswer]:
    got: list[EnvAnswer] = []
    while len(got) < count:
        got += await read_frame(reader, 10.0)
    return got


def test_requests_go_over_the_socket_and_each_gets_one_answer() -> None:
    with worker() as served:
        channel = WorkerChannel(LocalHandle(served, name="env_worker[0]"), KEY)

        async def scenario() -> str:
            # both resets are sent in one message (made in the same turn of the loop)
            (incarnation, first), (_, second) = await asyncio.gather(
                channel.request("reset", 0, 7), channel.request("reset", 1, 7)
            )
            assert channel.messages == 1
            assert first.observation == second.observation  # the same seed
            step = await channel.request("step", 0, incarnation, "<answer>Inc</answer>")
            assert step.observation.startswith("value 1")
            with pytest.raises(ValueError, match="'close' is not one of") as refused:
                await channel.request("close")
            assert "raised on the env worker" in "".join(refused.value.__notes__)
            with pytest.raises(EnvLostError, match="restarted since this episode's reset"):
                await channel.request("step", 1, "an old incarnation", "<answer>Inc</answer>")
            return str(step.observation)

        after_step = asyncio.run(scenario())
        # a new event loop (the next rollout) opens a new connection and goes on
        assert asyncio.run(channel.request("render", 0)) == after_step


def test_a_replaced_connection_gets_no_more_answers_and_a_heartbeat_is_answered() -> None:
    with worker(delay=0.3) as served:
        host, port = served.data_address()

        async def scenario() -> None:
            old_reader, old_writer = await connect(host, port, KEY)
            write_frame(old_writer, [EnvRequest(0, "reset", (0, 7))])
            (answer,) = await answers_for(old_reader, 1)
            incarnation = answer.value[0]
            write_frame(
                old_writer, [EnvRequest(1, "step", (0, incarnation, "<answer>Inc</answer>"))]
            )
            reader, writer = await connect(host, port, KEY)  # replaces the old one
            write_frame(writer, [])  # a heartbeat: answered at once, with no answers
            assert await read_frame(reader, 10.0) == []
            write_frame(writer, [EnvRequest(2, "render", (1,))])
            assert [a.id for a in await answers_for(reader, 1)] == [2]
            await asyncio.sleep(0.5)  # the old connection's step has finished meanwhile
            with pytest.raises(asyncio.IncompleteReadError):  # closed, its answer dropped
                await read_frame(old_reader, 10.0)
            old_writer.close()
            writer.close()

        asyncio.run(scenario())


def test_a_connection_without_the_key_is_refused() -> None:
    with worker() as served:
        host, port = served.data_address()

        async def scenario() -> None:
            with pytest.raises(HandshakeError, match="refused the key"):
                await connect(host, port, secrets.token_bytes(32))
            reader, writer = await connect(host, port, KEY)  # the right key still works
            write_frame(writer, [EnvRequest(0, "render", (0,))])
            assert len(await answers_for(reader, 1)) == 1
            writer.close()

        asyncio.run(scenario())


def test_the_driver_refuses_a_worker_without_the_key() -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def impostor() -> None:  # takes any proof, and cannot prove the key itself
        sock = listener.accept()[0]
        sock.sendall(secrets.token_bytes(32))
        sock.recv(64)
        sock.sendall(secrets.token_bytes(32))
        time.sleep(1)
        sock.close()

    threading.Thread(target=impostor, daemon=True).start()

    async def scenario() -> None:
        with pytest.raises(HandshakeError, match="does not hold the key"):
            await connect("127.0.0.1", listener.getsockname()[1], KEY)

    try:
        asyncio.run(scenario())
    finally:
        listener.close()


class _Address:
    """A handle whose worker only tells its address (the worker is a bare socket)."""

    name = "env_worker[9]"

    def __init__(self, port: int) -> None:
        self.port = port

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        assert method == "data_address"
        return "127.0.0.1", self.port


def test_a_silent_worker_fails_its_requests_after_the_silence_limit() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def silent() -> None:  # proves the key, then never answers, not even a heartbeat
        sock = listener.accept()[0]
        held.append(sock)
        accept_handshake(sock, KEY)

    threading.Thread(target=silent, daemon=True).start()
    channel = WorkerChannel(
        _Address(listener.getsockname()[1]),  # type: ignore[arg-type]
        KEY,
        heartbeat=0.1,
        silence_limit=0.5,
    )
    start = time.monotonic()
    try:
        with pytest.raises(RpcTimeoutError, match=r"env_worker\[9\]: no answer in"):
            asyncio.run(channel.request("render", 0))
    finally:
        listener.close()
        for sock in held:
            sock.close()
    assert 0.5 <= time.monotonic() - start < 10


def test_a_closed_connection_fails_every_waiting_request_as_a_dead_worker() -> None:
    with worker(delay=5.0) as served:
        channel = WorkerChannel(LocalHandle(served, name="env_worker[0]"), KEY)

        async def scenario() -> None:
            (incarnation, _), _ = await asyncio.gather(
                channel.request("reset", 0, 7), channel.request("reset", 1, 7)
            )
            steps = [
                asyncio.ensure_future(
                    channel.request("step", i, incarnation, "<answer>Inc</answer>")
                )
                for i in range(2)
            ]
            await asyncio.sleep(0.2)
            served.close()  # its socket closes, as when the worker's process dies
            for step in steps:
                with pytest.raises(WorkerDiedError, match=r"env_worker\[0\]: its connection"):
                    await step

        asyncio.run(scenario())
