"""Hugging Face transformers backend: batched ``generate`` on CPU or one GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from agentgym.rollout.backends.base import Generation, GenerationError, SamplingParams

if TYPE_CHECKING:
    from agentgym.envs.text_env import TextEnv


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]


class HFBackend:
    """Generate with a transformers causal LM, batching pending requests.

    Requests queue up while a batch runs (in a worker thread, so the event loop
    keeps stepping envs); the next batch takes everything pending with the same
    sampling parameters, up to ``max_batch_size``. Prompts are left-padded.
    Logprobs come from the raw logits (``output_logits``), i.e. the model's
    distribution before temperature and top-k/top-p.

    Args:
        model: A ``PreTrainedModel`` (the trainer's own model object may be shared).
        pad_token_id: Id used for left padding.
        max_batch_size: The most requests generated together.
    """

    def __init__(self, model: Any, *, pad_token_id: int, max_batch_size: int = 64) -> None:
        self.model = model
        self.pad_token_id = pad_token_id
        self.max_batch_size = max_batch_size
        self._pending: list[_Request] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None

    @classmethod
    def from_pretrained(
        cls, path: str, *, dtype: str = "float32", device: str = "cpu", max_batch_size: int = 64
    ) -> HFBackend:
        """Load a model folder (weights + tokenizer) for generation."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        model = model.to(device)  # type: ignore[arg-type]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return cls(model.eval(), pad_token_id=pad, max_batch_size=max_batch_size)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, *, env: TextEnv | None = None
    ) -> Generation:
        """Queue one request and wait for its batch."""
        if self._worker is None or self._worker.done():
            # event-loop-bound primitives are made in the loop that uses them
            self._wakeup = asyncio.Event()
            self._lock = asyncio.Lock()
            self._worker = asyncio.create_task(self._serve())
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(list(prompt_ids), params, future))
        assert self._wakeup is not None
        self._wakeup.set()
        return await future

    async def _serve(self) -> None:
        assert self._wakeup is not None
        assert self._lock is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                params = self._pending[0].params
                batch = [r for r in self._pending if r.params == params][: self.max_batch_size]
                self._pending = [r for r in self._pending if all(r is not b for b in batch)]
                try:
                    async with self._lock:
                        results = await asyncio.to_thread(
                            self._generate_batch, [r.prompt_ids for r in batch], params
                        )
                except Exception as error:  # the engine failed: every waiting request learns why
                    for request in batch:
                        request.future.set_exception(
                            GenerationError(f"HF generate failed: {error}")
                        )
                    continue
                for request, result in zip(batch, results, strict=True):
                    if not request.future.done():
                        request.future.set_result(result)

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        from transformers import GenerationConfig

        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor(
            [[self.pad_token_id] * (width - len(p)) + p for p in prompts], device=device
        )  # [B, P]
        attention_mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device
        )  # [B, P]
        stop = list(params.stop_token_ids)
        config = GenerationConfig(
            do_sample=params.temperature > 0,
            temperature=params.temperature if params.temperature > 0 else None,
            top_p=params.top_p if params.temperature > 0 else None,
            top_k=max(params.top_k, 0) if params.temperature > 0 else None,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=stop or None,
            pad_token_id=self.pad_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        if params.seed is not None:
            torch.manual_seed(params.seed)
        out = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=config
        )
        new_ids = out.sequences[:, width:]  # [B, N]
        logits = torch.stack(out.logits, dim=1).float()  # [B, N, V]
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new_ids[..., None])[..., 0]
        results = []
        stop_set = set(stop)
        for row_ids, row_logprobs in zip(new_ids.tolist(), logprobs.tolist(), strict=True):
            end = next((i + 1 for i, t in enumerate(row_ids) if t in stop_set), None)
            finish = "stop" if end is not None else "length"
            end = end or params.max_new_tokens
            results.append(Generation(row_ids[:end], row_logprobs[:end], finish))
        return results

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``weights`` into the model in place (a no-op when the trainer shares it)."""
        state = dict(weights)
        async with self._lock or asyncio.Lock():
            own = self.model.state_dict()
            with torch.no_grad():
                for name, tensor in state.items():
                    if name not in own:
                        raise KeyError(f"update_weights: the model has no parameter {name!r}")
                    if own[name].data_ptr() != tensor.data_ptr():
                        own[name].copy_(tensor)

    async def close(self) -> None:
        """Stop the batching task."""
        if self._worker is not None:
            self._worker.cancel()
            self._worker = None
