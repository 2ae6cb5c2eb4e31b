"""Hugging Face transformers backend: batched ``generate`` on CPU or one GPU."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from agentgym.rollout.backends.base import Generation, GenerationError, SamplingParams

if TYPE_CHECKING:
    from agentgym.envs.text_env import TextEnv
    from agentgym.rollout.backends.buckets import WeightBucket


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
    Logprobs are those of the distribution sampled from: the logits divided by
    the temperature, with top-k/top-p applied (vLLM's ``processed_logprobs``).

    Weights sent by :meth:`update_weights` are copied into the backend's own
    tensors, never adopted: a trainer in the same process may take an optimizer
    step while this backend generates (``async_generation_ratio > 0``), and a
    shared tensor would change the policy in the middle of a sample.

    Args:
        model: A ``PreTrainedModel``.
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
        self._received: set[str] = set()

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
                # requests that differ only in their seed share a batch (one generator per row)
                params = replace(self._pending[0].params, seed=None)
                batch = [r for r in self._pending if replace(r.params, seed=None) == params]
                batch = batch[: self.max_batch_size]
                self._pending = [r for r in self._pending if all(r is not b for b in batch)]
                try:
                    async with self._lock:
                        results = await asyncio.to_thread(
                            self._generate_batch,
                            [r.prompt_ids for r in batch],
                            params,
                            [r.params.seed for r in batch],
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
    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int | None]
    ) -> list[Generation]:
        """Sample a left-padded batch with a KV cache, token by token.

        Each row with a seed draws from its own generator, so its sample does
        not depend on which other requests share the batch. Rows with the same
        prompt (a group's first turn) share one prefill.
        """
        from transformers import DynamicCache

        device = next(self.model.parameters()).device
        # a group's members share their prompt: each distinct prompt is prefilled once
        # and its cache rows copied to the rows that asked for it
        distinct: dict[tuple[int, ...], int] = {}
        row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]  # [B]
        unique = [list(p) for p in distinct]  # [U]
        rows, width = len(prompts), max(len(p) for p in unique)
        input_ids = torch.tensor(
            [[self.pad_token_id] * (width - len(p)) + p for p in unique], device=device
        )  # [U, P]
        attention_mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in unique], device=device
        )  # [U, P]
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [U, P]
        generators = _generators(seeds, device)
        stop = torch.tensor(sorted(set(params.stop_token_ids)) or [-1], device=device)
        cache = DynamicCache()
        tokens: list[torch.Tensor] = []
        logprobs: list[torch.Tensor] = []
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        for step in range(params.max_new_tokens):
            logits = (
                self.model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    past_key_values=cache,
                    use_cache=True,
                )
                .logits[:, -1]
                .float()
            )  # [B, V] ([U, V] after the prefill)
            if step == 0 and len(unique) < rows:
                select = torch.tensor(row_of, device=device)  # [B]
                cache.batch_select_indices(select)
                logits, attention_mask = logits[select], attention_mask[select]
                position_ids = position_ids[select]
            processed = _process(logits, params)  # [B, V]: the distribution sampled from
            next_ids = _sample(processed, params, generators)  # [B]
            tokens.append(next_ids)
            logprobs.append(torch.log_softmax(processed, -1).gather(-1, next_ids[:, None])[:, 0])
            finished |= torch.isin(next_ids, stop)
            if bool(finished.all()):
                break
            input_ids = next_ids[:, None]
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(rows, 1)], -1)
            position_ids = position_ids[:, -1:] + 1
        new_ids = torch.stack(tokens, 1).tolist()  # [B, N]
        new_logprobs = torch.stack(logprobs, 1).tolist()  # [B, N]
        stop_set = set(params.stop_token_ids)
        results = []
        for row_ids, row_logprobs in zip(new_ids, new_logprobs, strict=True):
            end = next((i + 1 for i, t in enumerate(row_ids) if t in stop_set), None)
            finish = "stop" if end is not None else "length"
            end = end or len(row_ids)
            results.append(Generation(row_ids[:end], row_logprobs[:end], finish))
        return results

    async def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``weights`` (Hugging Face names) into the model, between batches.

        Always a copy, never an adoption of the sender's tensor (see the class
        docstring); the copy waits for the batch being generated to finish.

        Raises:
            KeyError: Naming a tensor the model does not have.
        """
        async with self._lock or asyncio.Lock():
            await asyncio.to_thread(self._copy_weights, weights)

    @torch.no_grad()
    def _copy_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        own = dict(self.model.named_parameters(remove_duplicate=False)) | dict(
            self.model.named_buffers(remove_duplicate=False)
        )
        for name, tensor in weights:
            target = own.get(name)
            if target is None:
                raise KeyError(f"update_weights: the model has no parameter {name!r}")
            target.copy_(tensor)

    async def begin_weight_update(self) -> None:
        """Start a bucketed update (the coverage check of :meth:`finish_weight_update`)."""
        self._received = set()

    async def load_weight_bucket(self, bucket: WeightBucket) -> float:
        """Copy one bucket's tensors into the model (never adopted: the bucket's
        buffer may be read-only and is released after the call).

        Returns:
            Seconds spent copying.

        Raises:
            KeyError: Naming a tensor the model does not have.
        """
        async with self._lock or asyncio.Lock():
            started = time.perf_counter()
            await asyncio.to_thread(self._copy_bucket, bucket)
            return time.perf_counter() - started

    @torch.no_grad()
    def _copy_bucket(self, bucket: WeightBucket) -> None:
        own = dict(self.model.named_parameters(remove_duplicate=False)) | dict(
            self.model.named_buffers(remove_duplicate=False)
        )
        for name in bucket.names:
            if name not in own:
                raise KeyError(f"weight sync: the model has no parameter {name!r}")
        for name, tensor in bucket.tensors():
            own[name].copy_(tensor)
        for name, source in bucket.aliases():
            if own[name] is not own[source]:  # tied in the trainer, untied here
                own[name].copy_(own[source])
        self._received.update(bucket.names)

    async def finish_weight_update(self) -> None:
        """Check that every parameter was sent.

        Raises:
            GenerationError: Naming the parameters no bucket carried.
        """
        missing = sorted({name for name, _ in self.model.named_parameters()} - self._received)
        if missing:
            raise GenerationError(
                f"weight sync left {len(missing)} parameter(s) with their old values: "
                f"{missing[:5]}{' ...' if len(missing) > 5 else ''}"
            )

    async def close(self) -> None:
        """Stop the batching task."""
        if self._worker is not None:
            self._worker.cancel()
            self._worker = None


def _generators(seeds: list[int | None], device: torch.device) -> list[torch.Generator] | None:
    """One generator per seeded row (None when no row has a seed: the global generator)."""
    if all(seed is None for seed in seeds):
        return None
    fallback = int(torch.randint(0, 2**31 - 1, ()).item())
    return [
        torch.Generator(device=device).manual_seed(fallback + i if seed is None else seed)
        for i, seed in enumerate(seeds)
    ]


def _process(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The logits of the distribution that samples: divided by the temperature, with
    top-k and top-p applied (``-inf`` outside them); unchanged at temperature 0."""
    if params.temperature == 0:
        return logits
    logits = logits / params.temperature  # [B, V]
    if params.top_k > 0:
        kth = logits.topk(min(params.top_k, logits.shape[-1]), -1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1:
        sorted_logits, order = logits.sort(-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) > params.top_p  # keep the first token past p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def _sample(
    logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator] | None
) -> torch.Tensor:
    """Next token per row from processed logits: greedy at temperature 0, else sampled."""
    if params.temperature == 0:
        return logits.argmax(-1)
    probs = logits.softmax(-1)
    if generators is None:
        return torch.multinomial(probs, 1)[:, 0]
    return torch.cat(
        [torch.multinomial(row, 1, generator=g) for row, g in zip(probs, generators, strict=True)]
    )
