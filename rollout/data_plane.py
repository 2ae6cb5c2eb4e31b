"""The env workers' data plane: requests and answers over a socket of their own.

Ray places the env workers and restarts them, but one Ray actor call costs the
driver about a millisecond of CPU (about as much as a whole in-process env
turn on these machines), and the driver's CPU is the rollout's critical path
whenever the envs are cheap. So each :class:`~agentgym.rollout.workers.EnvWorker`
also listens on a TCP socket of its own (on its node's address), and the
driver sends it requests and reads its answers there: a message is a
length-prefixed pickle, a few tens of microseconds each side.

- A connection begins with a mutual challenge (HMAC-SHA256 of a random nonce
  under a key the driver made and gave the worker through Ray): only the
  driver that started the worker may send it pickles, and the driver only
  unpickles what that worker sends.
- The driver sends lists of :class:`~agentgym.rollout.workers.EnvRequest`;
  the worker sends lists of :class:`~agentgym.rollout.workers.EnvAnswer`,
  whatever finished since its last message (answers that finish close
  together travel together). An empty list from the driver is a heartbeat,
  which the worker answers with an empty list.
- One connection at a time: a new one (a new rollout's event loop) replaces
  the old, whose answers are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import pickle
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

_LENGTH = struct.Struct("!Q")
_NONCE = 32
_DIGEST = hashlib.sha256().digest_size


class HandshakeError(ConnectionError):
    """The other side of a data-plane connection does not hold the key."""


def _proof(key: bytes, nonce: bytes, side: bytes) -> bytes:
    return hmac.new(key, side + nonce, hashlib.sha256).digest()


def _frame(value: Any) -> bytes:
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(body)) + body


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise ConnectionError("the connection closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _recv_frame(sock: socket.socket) -> Any:
    (size,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    return pickle.loads(_recv_exactly(sock, size))


async def read_frame(reader: asyncio.StreamReader, wait: float | None = None) -> Any:
    """The next message of a driver-side connection.

    Raises:
        TimeoutError: If no message began within ``wait`` seconds (nothing is
            consumed then, so the next read starts at the same message).
        asyncio.IncompleteReadError: If the connection closed.
    """
    header = await asyncio.wait_for(reader.readexactly(_LENGTH.size), wait)
    (size,) = _LENGTH.unpack(header)
    return pickle.loads(await reader.readexactly(size))


def write_frame(writer: asyncio.StreamWriter, value: Any) -> None:
    """Queue a message on a driver-side connection (the transport sends it)."""
    writer.write(_frame(value))


async def connect(host: str, port: int, key: bytes) -> tuple[asyncio.StreamReader, Any]:
    """Open a driver-side connection to a worker's :class:`RequestServer` and prove the key.

    Returns:
        The stream reader and writer.

    Raises:
        HandshakeError: If the worker does not prove the key.
        OSError: If the worker cannot be reached.
    """
    reader, writer = await asyncio.open_connection(host, port)
    try:
        theirs = await reader.readexactly(_NONCE)
        ours = os.urandom(_NONCE)
        writer.write(_proof(key, theirs, b"driver") + ours)
        try:
            proof = await reader.readexactly(_DIGEST)
        except (asyncio.IncompleteReadError, ConnectionResetError) as error:
            raise HandshakeError(
                f"the env worker at {host}:{port} refused the key (it hung up)"
            ) from error
        if not hmac.compare_digest(proof, _proof(key, ours, b"worker")):
            raise HandshakeError(f"the env worker at {host}:{port} does not hold the key")
    except BaseException:
        writer.close()
        raise
    return reader, writer


def _hang_up(sock: socket.socket) -> None:
    """Close ``sock`` so that a thread blocked on it wakes and the peer sees the end
    (a plain ``close`` does neither while another thread is in ``recv``/``accept``)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def accept_handshake(sock: socket.socket, key: bytes, timeout: float = 10.0) -> bool:
    """The worker's side of the challenge on a new connection: True if the driver
    proved ``key`` (the worker has then proved it too)."""
    sock.settimeout(timeout)
    nonce = os.urandom(_NONCE)
    sock.sendall(nonce)
    if not hmac.compare_digest(_recv_exactly(sock, _DIGEST), _proof(key, nonce, b"driver")):
        return False
    sock.sendall(_proof(key, _recv_exactly(sock, _NONCE), b"worker"))
    sock.settimeout(None)
    return True


class RequestServer:
    """The worker's side: accepts the driver's connection, hands requests on, sends answers.

    Args:
        host: The address to listen on (the node's address).
        key: The key the driver must prove.
        handle: Called with a connection's number and each batch of requests
            (it must not block: it starts them).
    """

    def __init__(self, host: str, key: bytes, handle: Callable[[int, list[Any]], None]) -> None:
        self.key = key
        self.handle = handle
        self._listener = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        self._lock = threading.Condition()
        self._connection: socket.socket | None = None
        self._number = 0
        self._outbox: list[Any] = []
        self._closed = False
        threading.Thread(target=self._accept, name="data-plane-accept", daemon=True).start()
        threading.Thread(target=self._send, name="data-plane-send", daemon=True).start()

    def answer(self, number: int, answer: Any) -> None:
        """Send ``answer`` on connection ``number`` (dropped if that one has been replaced)."""
        with self._lock:
            if number == self._number and self._connection is not None:
                self._outbox.append(answer)
                self._lock.notify_all()

    def close(self) -> None:
        """Stop listening and close the connection."""
        with self._lock:
            self._closed = True
            self._drop()
            self._lock.notify_all()
        _hang_up(self._listener)

    def _drop(self) -> None:
        if self._connection is not None:
            _hang_up(self._connection)
            self._connection, self._outbox = None, []

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                proven = accept_handshake(sock, self.key)
            except (OSError, ConnectionError):
                proven = False
            if not proven:
                sock.close()
                continue
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self._drop()
                self._number += 1
                self._connection = sock
                number = self._number
            threading.Thread(
                target=self._receive, args=(sock, number), name="data-plane-recv", daemon=True
            ).start()

    def _receive(self, sock: socket.socket, number: int) -> None:
        while True:
            try:
                requests = _recv_frame(sock)
            except Exception:  # closed, or a message that does not unpickle here
                with self._lock:
                    if number == self._number:
                        self._drop()
                return
            if requests:
                self.handle(number, requests)
            else:  # a heartbeat: answer at once
                with self._lock:
                    if number == self._number:
                        self._outbox.append(None)
                        self._lock.notify_all()

    def _send(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: bool(self._outbox) or self._closed)
                if self._closed:
                    return
                batch, self._outbox = self._outbox, []
                sock = self._connection
            if sock is None:
                continue
            answers = [answer for answer in batch if answer is not None]
            try:
                sock.sendall(_frame(answers))
            except OSError:
                with self._lock:
                    if sock is self._connection:
                        self._drop()
