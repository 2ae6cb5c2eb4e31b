"""Fault injection for tests: kill a Ray actor's process the way a crash or the OOM
killer would (production code has no such hook)."""

from __future__ import annotations

import os
import signal
from typing import Any


def kill_actor_process(handle: Any) -> int:
    """SIGKILL the process behind ``handle`` (a :class:`~agentgym.cluster.handles.RayHandle`);
    returns its pid."""
    pid = int(handle.call_sync("__ray_call__", lambda self: os.getpid(), timeout=60))
    os.kill(pid, signal.SIGKILL)
    return pid
