"""The router: least-outstanding balancing, bucket boundaries by bytes, every tensor
delivered once to every engine, requests held during a sync; the bucket codec."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.rollout.backends.buckets import WeightBucket, chunk_weights, pack_bucket
from agentgym.rollout.router import BucketLoader, Router, sync_weights


class GatedBackend:
    """Answers a request only when the test opens its gate (keyed by the prompt's first id)."""

    def __init__(self, index: int, gates: dict[int, asyncio.Event], log: list[tuple[int, int]]):
        self.index = index
        self.gates = gates
        self.log = log

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None):
        self.log.append((prompt_ids[0], self.index))
        await self.gates[prompt_ids[0]].wait()
        return Generation([self.index], [0.0], "length")

    async def update_weights(self, weights: Any) -> None:
        raise AssertionError("not used")

    async def close(self) -> None:
        pass


class RecordingLoader:
    """A bucket loader that keeps a copy of every tensor it is sent."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.buckets: list[list[str]] = []
        self.tensors: dict[str, list[torch.Tensor]] = {}
        self.aliases: list[tuple[str, str]] = []
        self.gate: asyncio.Event | None = None
        self.fail_on: int | None = None

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, env: Any = None):
        self.calls.append("generate")
        return Generation([1], [0.0], "length")

    async def update_weights(self, weights: Any) -> None:
        raise AssertionError("a bucket loader gets buckets")

    async def begin_weight_update(self) -> None:
        self.calls.append("begin")

    async def load_weight_bucket(self, bucket: WeightBucket) -> float:
        self.calls.append(f"load {bucket.index}")
        if self.gate is not None:
            await self.gate.wait()
        if bucket.index == self.fail_on:
            raise RuntimeError("load failed")
        self.buckets.append(bucket.names)
        for name, tensor in bucket.tensors():
            self.tensors.setdefault(name, []).append(tensor.clone())
        self.aliases += bucket.aliases()
        return 0.0

    async def finish_weight_update(self) -> None:
        self.calls.append("finish")

    async def close(self) -> None:
        self.calls.append("close")


def test_requests_go_to_the_engine_with_the_fewest_in_flight() -> None:
    async def scenario() -> list[tuple[int, int]]:
        gates = {k: asyncio.Event() for k in range(10)}
        log: list[tuple[int, int]] = []
        router = Router([GatedBackend(i, gates, log) for i in range(3)])

        def submit(k: int) -> asyncio.Task[Generation]:
            return asyncio.create_task(router.generate([k], SamplingParams()))

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        tasks = [submit(0), submit(1), submit(2)]  # in flight: [1, 1, 1]
        await settle()
        gates[1].set()  # engine 1 answers: [1, 0, 1]
        await settle()
        tasks.append(submit(3))  # -> engine 1, the only idle one: [1, 1, 1]
        await settle()
        tasks.append(submit(4))  # a tie: the lowest index, engine 0: [2, 1, 1]
        await settle()
        gates[2].set()  # engine 2 answers: [2, 1, 0]
        await settle()
        tasks.append(submit(5))  # -> engine 2: [2, 1, 1]
        tasks.append(submit(6))  # tie between 1 and 2 -> engine 1: [2, 2, 1]
        await settle()
        assert router.outstanding == [2, 2, 1]
        for gate in gates.values():
            gate.set()
        results = await asyncio.gather(*tasks)
        assert [r.token_ids[0] for r in results] == [0, 1, 2, 1, 0, 2, 1]
        assert router.outstanding == [0, 0, 0]
        assert router.served == [2, 3, 2]
        return log

    log = asyncio.run(scenario())
    assert log == [(0, 0), (1, 1), (2, 2), (3, 1), (4, 0), (5, 2), (6, 1)]


def test_buckets_close_before_the_tensor_that_would_overflow() -> None:
    sizes = {"a": 10, "b": 20, "c": 5, "d": 40, "e": 1}  # float32: 40, 80, 20, 160, 4 bytes
    weights = [(name, torch.zeros(n)) for name, n in sizes.items()]
    runs = [[name for name, _ in run] for run in chunk_weights(weights, bucket_bytes=100)]
    # a=40; +b would be 120 > 100; b+c = 100 fits exactly; d alone is over budget; e
    assert runs == [["a"], ["b", "c"], ["d"], ["e"]]
    with pytest.raises(ValueError, match="bucket_bytes must be >= 1"):
        list(chunk_weights(weights, bucket_bytes=0))


def test_every_tensor_reaches_every_engine_once_bucket_by_bucket() -> None:
    generator = torch.Generator().manual_seed(0)
    weights = {
        "embed.weight": torch.randn(16, 8, generator=generator),
        "layer.q": torch.randn(8, 8, generator=generator).to(torch.bfloat16),
        "layer.k": torch.randn(4, 8, generator=generator),
        "layer.norm": torch.randn(8, generator=generator).to(torch.float16),
        "step": torch.tensor([7], dtype=torch.int64),
        "transposed": torch.randn(8, 4, generator=generator).t(),  # not contiguous
    }
    weights["lm_head.weight"] = weights["embed.weight"]  # tied: sent once, then an alias
    engines = [RecordingLoader(), RecordingLoader()]
    stats = asyncio.run(sync_weights(engines, weights.items(), bucket_bytes=300))
    unique = sum(t.numel() * t.element_size() for n, t in weights.items() if n != "lm_head.weight")
    assert stats.num_bytes == unique
    # bytes: embed 512 | q 128 + k 128 + norm 16 + step 8 = 280 | transposed 128 + alias 0
    assert stats.buckets == 3
    for engine in engines:
        assert engine.calls == ["begin", "load 0", "load 1", "load 2", "finish"]
        assert sorted(engine.tensors) == sorted(n for n in weights if n != "lm_head.weight")
        for name, received in engine.tensors.items():
            assert len(received) == 1
            assert received[0].dtype == weights[name].dtype
            assert torch.equal(received[0], weights[name])
        assert engine.aliases == [("lm_head.weight", "embed.weight")]
        assert engine.buckets == engines[0].buckets
    assert engines[0].buckets == [
        ["embed.weight"],
        ["layer.q", "layer.k", "layer.norm", "step"],
        ["transposed", "lm_head.weight"],
    ]


def test_a_dropped_tensor_at_a_reused_address_is_not_an_alias() -> None:
    staging = torch.zeros(64)

    def stream() -> Any:  # an export that refills one staging buffer once the last bucket is out
        for value in range(3):
            staging.fill_(float(value))
            yield f"w{value}", staging[:]  # a new view of the same storage each time
            yield f"pad{value}", torch.full((64,), -1.0)  # closes the bucket holding the view

    kinds = []
    for run in chunk_weights(stream(), bucket_bytes=256):  # one 256-byte tensor per run
        kinds += [(name, isinstance(value, str)) for name, value in run]
        del run  # the consumer packs and drops each bucket, as sync_weights does
    # the earlier view is gone when the next arrives: same address, but not the same tensor
    assert [name for name, alias in kinds if alias] == []
    assert len(kinds) == 6


def test_the_wire_format_round_trips() -> None:
    tensors: list[tuple[str, torch.Tensor | str]] = [
        ("a", torch.arange(6, dtype=torch.float32).view(2, 3)),
        ("b", "a"),
    ]
    bucket = pack_bucket(3, tensors)
    payload, specs = bucket.to_wire()
    again = WeightBucket.from_wire(bytes(payload), specs, index=3)
    assert again.specs == bucket.specs
    assert [(n, t.tolist()) for n, t in again.tensors()] == [("a", [[0, 1, 2], [3, 4, 5]])]
    assert again.aliases() == [("b", "a")]


def test_mixed_dtypes_pack_at_offsets_their_views_accept() -> None:
    # a bf16 model with fp32 tensors (norms, routers): 3 bf16 values end at byte 6
    tensors: list[tuple[str, torch.Tensor]] = [
        ("odd", torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)),
        ("f32", torch.arange(4, dtype=torch.float32)),
        ("byte", torch.tensor([7], dtype=torch.uint8)),
        ("f64", torch.tensor([0.125], dtype=torch.float64)),
    ]
    bucket = pack_bucket(0, tensors)
    assert [spec.offset for spec in bucket.specs] == [0, 8, 24, 32]
    assert bucket.num_bytes == 40
    for (name, sent), (got_name, got) in zip(tensors, bucket.tensors(), strict=True):
        assert got_name == name and got.dtype == sent.dtype and torch.equal(got, sent)
    payload, specs = bucket.to_wire()
    again = WeightBucket.from_wire(bytes(payload), specs)
    pairs = zip(again.tensors(), bucket.tensors(), strict=True)
    assert all(torch.equal(a, b) for (_, a), (_, b) in pairs)


def test_requests_wait_for_a_weight_sync_in_progress() -> None:
    async def scenario() -> list[str]:
        engine = RecordingLoader()
        engine.gate = asyncio.Event()
        router = Router([engine])
        sync = asyncio.create_task(router.update_weights([("w", torch.ones(3))]))
        await asyncio.sleep(0.01)
        request = asyncio.create_task(router.generate([1], SamplingParams()))
        await asyncio.sleep(0.01)
        assert engine.calls == ["begin", "load 0"]  # the request has not reached the engine
        engine.gate.set()
        await asyncio.gather(sync, request)
        assert router.last_sync is not None and router.last_sync.buckets == 1
        return engine.calls

    assert asyncio.run(scenario()) == ["begin", "load 0", "finish", "generate"]


def test_a_failed_bucket_still_finishes_every_engine() -> None:
    engines = [RecordingLoader(), RecordingLoader()]
    engines[1].fail_on = 1
    weights = [(f"w{i}", torch.ones(25)) for i in range(3)]  # 100 bytes each: 3 buckets
    with pytest.raises(RuntimeError, match="load failed"):
        asyncio.run(sync_weights(engines, weights, bucket_bytes=100))
    for engine in engines:
        assert engine.calls[0] == "begin" and engine.calls[-1] == "finish"
        assert "load 2" not in engine.calls


def test_engines_without_buckets_get_the_whole_list() -> None:
    class Plain:
        def __init__(self) -> None:
            self.received: list[list[str]] = []

        async def generate(self, prompt_ids: Any, params: Any, *, env: Any = None) -> Generation:
            raise AssertionError("not used")

        async def update_weights(self, weights: Any) -> None:
            self.received.append([name for name, _ in weights])

        async def close(self) -> None:
            pass

    plain = Plain()
    loader = RecordingLoader()
    assert not isinstance(plain, BucketLoader) and isinstance(loader, BucketLoader)
    router = Router([plain, Plain()])
    asyncio.run(router.update_weights(iter([("a", torch.ones(2)), ("b", torch.ones(2))])))
    assert plain.received == [["a", "b"]]
    assert router.last_sync is None
    with pytest.raises(ValueError, match="at least one backend"):
        Router([])


def test_the_export_is_pulled_and_shared_off_the_event_loop() -> None:
    """Fetching the next weights (on Ray: a blocking ``ray.get`` of a trainer rank's
    bucket) and putting a bucket in the object store never run on the loop's thread,
    which keeps serving env traffic during a sync."""
    import threading

    pulled_on: list[int] = []
    shared_on: list[int] = []

    def export() -> Any:
        for index in range(4):
            pulled_on.append(threading.get_ident())
            yield f"w{index}", torch.full((16,), float(index))

    def share(bucket: WeightBucket) -> WeightBucket:
        shared_on.append(threading.get_ident())
        return bucket

    async def scenario() -> int:
        loader = RecordingLoader()
        await sync_weights([loader], export(), bucket_bytes=64, share=share)
        assert sorted(loader.tensors) == ["w0", "w1", "w2", "w3"]
        return threading.get_ident()

    loop_thread = asyncio.run(scenario())
    assert len(pulled_on) == 4 and len(shared_on) == 4
    assert loop_thread not in pulled_on + shared_on
