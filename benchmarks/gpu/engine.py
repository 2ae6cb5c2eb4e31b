"""The card's peak, HF-engine generation and weight sync trainer → engine."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from .runner import Context, Deadline, time_reps


def peak(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """The measured matmul peak: an ``n × n × n`` product of random bf16 matrices
    (float32 on the CPU), median of repetitions after a warm-up; later items' MFU
    divides by it."""
    s = ctx.settings
    dtype = torch.bfloat16 if s.device.startswith("cuda") else torch.float32
    n = s.peak_size
    a = torch.randn(n, n, device=s.device, dtype=dtype)
    b = torch.randn(n, n, device=s.device, dtype=dtype)
    repeat = 10 if s.device.startswith("cuda") else 1

    def products() -> None:
        for _ in range(repeat):
            torch.mm(a, b)

    seconds = time_reps(products, deadline, max(s.max_reps, 5), ctx.synchronize)
    median = sorted(seconds)[len(seconds) // 2] / repeat
    tflops = 2 * n**3 / median / 1e12
    ctx.peak_tflops = tflops
    return {"tflops": tflops, "n": float(n), "reps": float(len(seconds))}


def generation(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """Generated tokens/s of the HF engine (:class:`~agentgym.rollout.backends.hf.HFBackend`)
    with the rollout batch of requests in flight, each ``gen_new_tokens`` long (no stop
    token: random weights would stop at random)."""
    from agentgym.rollout.backends.base import SamplingParams
    from agentgym.rollout.backends.hf import HFBackend

    s = ctx.settings
    shape = ctx.shape(s.train_shape)
    engine = HFBackend.from_pretrained(
        str(ctx.model(s.train_shape)), dtype=s.dtype, device=s.device, max_batch_size=s.gen_batch
    )
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(
        0, shape.vocab_size, (s.gen_batch, s.gen_prompt_len), generator=generator
    )
    params = SamplingParams(temperature=1.0, max_new_tokens=s.gen_new_tokens)
    counts: list[int] = []

    async def batch() -> None:
        results = await asyncio.gather(*(engine.generate(p, params) for p in prompts.tolist()))
        counts.append(sum(len(r.token_ids) for r in results))
        await engine.close()

    try:
        seconds = time_reps(lambda: asyncio.run(batch()), deadline, s.max_reps, ctx.synchronize)
    finally:
        asyncio.run(engine.close())
    median = sorted(seconds)[len(seconds) // 2]
    return {
        "tokens_per_s": counts[-1] / median,
        "step_s": median,
        "requests": float(s.gen_batch),
        "new_tokens": float(counts[-1]),
        "reps": float(len(seconds)),
    }


def weight_sync(ctx: Context, deadline: Deadline) -> dict[str, Any]:
    """A trainer's weights (the torch strategy's ``export_weights``) through the
    :class:`~agentgym.rollout.router.Router`'s bucketed sync into an HF engine on the same
    device, in this process: pack (read the trainer's tensors into a host buffer), transfer
    (the call, no Ray here) and load (copy into the engine's parameters), the router's own
    timers. After the syncs the engine's weights must equal the trainer's."""
    from agentgym.rollout.backends.hf import HFBackend
    from agentgym.rollout.router import Router
    from agentgym.trainers.strategies.optim import OptimizerConfig
    from agentgym.trainers.strategies.torch_strategy import TorchStrategy

    s = ctx.settings
    path = ctx.model(s.sync_shape)
    trainer = TorchStrategy(
        path, dtype=s.dtype, device=s.device, optimizer=OptimizerConfig(learning_rate=1e-6)
    )
    engine = HFBackend.from_pretrained(str(path), dtype=s.dtype, device=s.device)
    router = Router([engine], bucket_bytes=s.bucket_mb << 20)
    with torch.no_grad():  # new weights, changed in place so that tied ones stay tied
        for parameter in trainer.model.parameters():
            parameter.mul_(1.5)
    stats: list[Any] = []

    def sync() -> None:
        asyncio.run(router.update_weights(trainer.export_weights()))
        stats.append(router.last_sync)

    try:
        seconds = time_reps(sync, deadline, s.max_reps, ctx.synchronize)
        own = dict(engine.model.named_parameters())
        gap = max(
            float((own[name].detach().float() - tensor.detach().float()).abs().max())
            for name, tensor in trainer.model.named_parameters()
        )
    finally:
        asyncio.run(router.close())
    if gap != 0.0:
        raise AssertionError(f"after the sync the engine's weights differ by {gap}")
    median = sorted(seconds)[len(seconds) // 2]
    measured = stats[1:]  # the warm-up's stats are left out, as its time is

    def mid(key: str) -> float:
        values = sorted(getattr(stat, key) for stat in measured)
        return float(values[len(values) // 2])

    megabytes = measured[0].num_bytes / 2**20
    return {
        "sync_s": median,
        "pack_s": mid("pack_seconds"),
        "transfer_s": mid("transfer_seconds"),
        "load_s": mid("load_seconds"),
        "megabytes": megabytes,
        "buckets": float(measured[0].buckets),
        "mb_per_s": megabytes / median,
        "max_abs_diff": gap,
        "reps": float(len(seconds)),
    }
