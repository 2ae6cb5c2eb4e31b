"""Generation backends: token ids in, token ids and per-token logprobs out.

Each backend is imported lazily by :func:`make_backend`, so that a missing
heavy dependency (vLLM, an HTTP server) only matters when it is asked for.
"""

from __future__ import annotations

from agentgym.rollout.backends.base import (
    Generation,
    GenerationBackend,
    GenerationError,
    SamplingParams,
)

__all__ = ["Generation", "GenerationBackend", "GenerationError", "SamplingParams"]
