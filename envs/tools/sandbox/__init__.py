"""Sandboxes for model-written code: Python in confined processes, read-only SQLite."""

from agentgym.envs.tools.sandbox.pool import WorkerPool, default_pool
from agentgym.envs.tools.sandbox.python import (
    ISOLATION_MODES,
    IsolationReport,
    PythonSandbox,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
    probe_isolation,
)

__all__ = [
    "ISOLATION_MODES",
    "IsolationReport",
    "PythonSandbox",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "WorkerPool",
    "default_pool",
    "probe_isolation",
]
