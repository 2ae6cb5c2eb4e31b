"""``synchronizer.sync_method: memory`` on a real Ray instance: the weights travel in
buckets (several here), tied weights once, and a reader of replaced weights is told."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from agentgym.job.published_weights import WeightsGoneError

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[Any]:
    import ray

    from agentgym.job.ray_job import NAMESPACE

    ray.init(num_cpus=1, namespace=NAMESPACE, log_to_driver=False, include_dashboard=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def weights(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    embed = torch.randn(64, 16, generator=generator)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16, generator=generator),
        "model.layers.0.mlp.down_proj.weight": torch.randn(16, 32, generator=generator),
        "model.norm.weight": torch.ones(16, dtype=torch.bfloat16),
        "lm_head.weight": embed,  # tied: the same storage
    }


def test_weights_travel_in_buckets_and_come_back_equal(ray_instance: Any) -> None:
    from agentgym.job.ray_job import MemoryChannel, remove_job_actors

    channel = MemoryChannel("t/buckets", bucket_bytes=4096)  # 4 KiB: three buckets
    try:
        sent = weights(0)
        channel.store(3, sent, groups_per_step=2)
        published = channel.latest()
        assert published is not None and (published.version, published.groups_per_step) == (3, 2)
        count, targets = ray_instance.get(channel.actor.layout.remote(published.key))
        assert count == 3 and targets == ["model.embed_tokens.weight"]  # the tie sent once
        read = list(channel.read(published))
        assert [name for name, _ in read] == list(sent)
        for name, tensor in read:
            assert tensor.dtype == sent[name].dtype and torch.equal(tensor, sent[name])
        # a newer publication replaces them: a reader still on the old one is told
        old = channel.read(published)
        next(old)
        channel.store(4, weights(1), groups_per_step=2)
        with pytest.raises(WeightsGoneError, match="version 3"):
            list(old)
        newest = channel.latest()
        assert newest is not None and newest.version == 4
        assert torch.equal(
            dict(channel.read(newest))["lm_head.weight"], weights(1)["lm_head.weight"]
        )
    finally:
        remove_job_actors("t/buckets")


def test_a_publication_missing_a_bucket_does_not_take_effect() -> None:
    from agentgym.job.published_weights import Published
    from agentgym.job.ray_job import WeightsActor
    from agentgym.rollout.backends.buckets import chunk_weights, pack_bucket

    actor = WeightsActor()
    buckets = [pack_bucket(i, run) for i, run in enumerate(chunk_weights(weights(0).items(), 4096))]
    entry = Published(1, "v1", 1)
    for bucket in buckets[1:]:  # bucket 0 was lost
        actor.put("v1", bucket)
    assert not actor.store(entry, len(buckets)) and actor.latest() is None
    for bucket in buckets:
        actor.put("v1", bucket)
    assert actor.store(entry, len(buckets)) and actor.latest() == entry
