"""A vLLM worker extension that reloads weights sent as safetensors bytes.

vLLM imports this class by name (``worker_extension_cls``) inside its worker
processes and mixes it into the worker. Weights travel as bytes, not tensors,
so they cross process boundaries on CPU and GPU alike. The method is not named
``update_weights``, which clashes with a worker method on CPU.
"""

from __future__ import annotations

from typing import Any


class WeightReloadExtension:
    """Mixed into vLLM's worker; called through ``collective_rpc``."""

    def agentgym_load_weights(self, payload: bytes) -> int:
        """Load safetensors ``payload`` into the running model in place.

        Returns:
            The number of tensors loaded.
        """
        from safetensors.torch import load

        tensors = load(payload)
        worker: Any = self
        worker.reload_weights(weights_iterator=iter(tensors.items()))
        return len(tensors)

    def agentgym_load_weights_from_path(self, path: str) -> int:
        """Load a safetensors file (for servers, whose RPC endpoint takes strings only)."""
        with open(path, "rb") as handle:
            return self.agentgym_load_weights(handle.read())
