"""Weight-sync time on CPU: a trainer's state dict → Router → engine actors on Ray.

For the tiny model and a Qwen2.5-0.5B-shaped one (random weights), HF and
vLLM-CPU engines, one and two engines, several bucket sizes. Each setting
prints a Markdown row (median of ``ROUNDS`` syncs) with the router's split
into pack, transfer and load seconds (each bucket is put in Ray's object store once,
``cluster.share``, as ``agentgym.builders`` wires it); after the syncs one engine's logprobs
must equal the trainer's (the sync really moved the weights).

Run::

    python -m pytest benchmarks/test_weight_sync_benchmark.py --benchmark-only -s \
        -p no:cacheprovider
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from dry import DRY, sized
from weight_sync_bench import (
    HEADER,
    build_qwen05b_shaped,
    build_tiny,
    logprob_gap,
    measure_sync,
)

from agentgym.cluster import start_cluster
from agentgym.rollout.engines import spawn_engines
from agentgym.rollout.router import Router

BUCKET_MB = {"tiny": [1, 256], "0.5b": [32, 256, 1024]}
VLLM_MAX_BUCKET_MB = 256
"""vLLM-CPU holds a bucket three times (the message to its engine core, the decoded
views, the layerwise reload's buffers): a 1 GB bucket ran this 24 GB machine out of memory."""
ROUNDS = {"tiny": sized(5, 1), "0.5b": 3}
SETTINGS = sized(
    [
        ("tiny", "hf", 1),
        ("tiny", "hf", 2),
        ("tiny", "vllm", 1),
        ("0.5b", "hf", 1),
        ("0.5b", "hf", 2),
        ("0.5b", "vllm", 1),
    ],
    [("tiny", "hf", 1)],
)  # dry: the tiny model to an HF engine
PROMPT = list(range(5, 30))


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tiny = build_tiny(tmp_path_factory.mktemp("tiny"))
    if DRY:
        return {"tiny": tiny}
    return {"tiny": tiny, "0.5b": build_qwen05b_shaped(tmp_path_factory.mktemp("q05"), tiny)}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    cluster = start_cluster("ray", rpc_timeout=1800)
    print(f"\n{HEADER}")
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.parametrize(
    ("model_name", "backend", "engines"), SETTINGS, ids=[f"{m}-{b}x{n}" for m, b, n in SETTINGS]
)
def test_weight_sync(
    benchmark: Any,
    cluster: Any,
    model_dirs: dict[str, Path],
    model_name: str,
    backend: str,
    engines: int,
) -> None:
    if backend == "vllm":
        pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM

    path = model_dirs[model_name]
    trainer = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():  # new weights, changed in place so that tied ones stay tied
        for parameter in trainer.parameters():
            parameter.mul_(1.5)
    weights = dict(trainer.state_dict())
    clients = spawn_engines(
        cluster, engines, backend, str(path), max_model_len=512, max_batch_size=8
    )
    try:
        before = logprob_gap(Router(clients), trainer, PROMPT)
        for bucket_mb in BUCKET_MB[model_name]:
            if backend == "vllm" and bucket_mb > VLLM_MAX_BUCKET_MB:
                continue
            router = Router(clients, bucket_bytes=bucket_mb << 20, share=cluster.share)
            figures = measure_sync(router, weights, ROUNDS[model_name])
            label = f"{model_name}, {backend} × {engines}, bucket {bucket_mb} MB"
            print(figures.row(label))
            benchmark.extra_info[f"bucket_{bucket_mb}MB"] = dataclasses.asdict(figures)
        router = Router(clients, share=cluster.share)
        benchmark.pedantic(
            lambda: asyncio.run(router.update_weights(weights.items())), rounds=1, iterations=1
        )
        after = max(logprob_gap(Router([client]), trainer, PROMPT) for client in clients)
        benchmark.extra_info["logprob_gap_before"] = before
        benchmark.extra_info["logprob_gap_after"] = after
        assert after < 1e-3 < before
    finally:
        asyncio.run(Router(clients).close())
        for client in clients:
            client.handle.kill()
