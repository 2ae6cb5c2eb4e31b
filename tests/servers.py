"""Start a real server process for a test and wait until it answers."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def running_server(
    command: Sequence[str], env: Mapping[str, str], log: Path, url: str, timeout: float = 240
) -> Iterator[str]:
    """Run ``command`` until ``url``/v1/models answers; yield ``url``; stop it after.

    The test fails with the server's last log lines if it exits or never answers.
    """
    with log.open("w") as output:
        process = subprocess.Popen(
            list(command), stdout=output, stderr=subprocess.STDOUT, env=dict(env)
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
