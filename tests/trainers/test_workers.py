"""The trainer worker group: DP=2 over Ray ranks takes the same steps as one process;
one rank behind a local handle is the torch strategy itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentgym.builders.recipe import default_grpo_config
from agentgym.cluster import Cluster, plan_placement, start_cluster
from agentgym.trainers.ranks import PolicyGroup, StrategySpec, deal, start_rank_group
from agentgym.trainers.strategies import Strategy
from agentgym.trainers.strategies.optim import OptimizerConfig
from agentgym.trainers.strategies.torch_strategy import TorchStrategy
from agentgym.trainers.updates import update_policy
from tests.trainers.test_update_path import ragged_batch

SETTINGS = {
    "optimizer": OptimizerConfig(learning_rate=1e-2, max_grad_norm=1.0),
    "temperature": 0.7,
    "micro_batch_size": 2,
}
CONFIG = default_grpo_config(
    micro_batch_size=1,
    gradient_accumulation_steps=6,
    loss_agg_mode="seq-mean-token-mean",
    entropy_loss_coef=0.01,
    clip_ratio_low=0.1,
    clip_ratio_high=0.1,
)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    cluster = start_cluster("ray", rpc_timeout=300)
    try:
        yield cluster
    finally:
        cluster.shutdown()


def group(cluster: Cluster, model_dir: Path, ranks: int) -> PolicyGroup:
    plan = plan_placement(
        {"actor_train": list(range(ranks))}, num_nodes=cluster.num_nodes, num_gpus_per_node=0
    )
    spec = StrategySpec("actor_train", "torch", model_dir, {}, SETTINGS)
    return start_rank_group(cluster, plan.workers["actor_train"], spec, rpc_timeout=300)


def two_steps(strategy: Strategy) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    metrics = [
        update_policy(CONFIG, strategy, ragged_batch(seed), step) for seed, step in [(0, 1), (1, 2)]
    ]
    weights = {name: tensor.clone() for name, tensor in strategy.export_weights()}
    return metrics, weights


def assert_same_run(
    first: tuple[list[dict[str, float]], dict[str, torch.Tensor]],
    second: tuple[list[dict[str, float]], dict[str, torch.Tensor]],
) -> None:
    for one, two in zip(first[0], second[0], strict=True):
        assert one.keys() == two.keys()
        for key in one:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    assert first[1].keys() == second[1].keys()
    for name, tensor in first[1].items():
        torch.testing.assert_close(second[1][name], tensor, rtol=1e-5, atol=1e-5)


def test_micro_batches_are_dealt_in_contiguous_shares() -> None:
    assert deal([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert deal([1], 3) == [[1], [], []]


@pytest.mark.ray
def test_dp2_on_ray_equals_one_process_over_two_steps(
    tiny_model_dir: Path, ray_cluster: Cluster
) -> None:
    single = two_steps(TorchStrategy(tiny_model_dir, **SETTINGS))  # type: ignore[arg-type]
    dp = group(ray_cluster, tiny_model_dir, 2)
    try:
        pids = {handle.call_sync("pid") for handle in dp.handles}
        assert len(pids) == 2  # two processes, not two threads of one
        assert_same_run(single, two_steps(dp))
        # a step's weights moved: the comparison is not between two untouched models
        initial = TorchStrategy(tiny_model_dir, **SETTINGS)  # type: ignore[arg-type]
        moved = [
            not torch.equal(tensor, single[1][name]) for name, tensor in initial.export_weights()
        ]
        assert any(moved)
    finally:
        dp.close()


def test_one_local_rank_equals_the_strategy(tiny_model_dir: Path) -> None:
    cluster = start_cluster("local")
    try:
        single = two_steps(TorchStrategy(tiny_model_dir, **SETTINGS))  # type: ignore[arg-type]
        assert_same_run(single, two_steps(group(cluster, tiny_model_dir, 1)))
    finally:
        cluster.shutdown()


def test_the_group_backend_follows_the_device_the_ranks_train_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentgym.trainers.ranks import group_backend

    # a machine with GPUs whose ranks train on the CPU (Ray's CPU-only ranks see every GPU)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert group_backend("torch", {"device": "cpu"}) == "gloo"
    assert group_backend("fsdp2_train", {"device": "cpu"}) == "gloo"
    assert group_backend("torch", {"device": "cuda"}) == "nccl"
    assert group_backend("megatron_train", {"device": "cpu"}) == "nccl"  # the rank's GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert group_backend("megatron_train", {}) == "gloo"


def test_ranks_other_than_0_stream_a_collective_export_without_sending_it() -> None:
    from agentgym.trainers.ranks import _buckets

    weights = [(f"w{i}", torch.full((4,), float(i))) for i in range(5)]  # 16 bytes each
    sent = list(_buckets(iter(weights), 40))
    assert [list(bucket) for bucket in sent] == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    assert all(torch.equal(sent[i // 2][f"w{i}"], t) for i, (_, t) in enumerate(weights))
    pulled: list[str] = []

    def export() -> Iterator[tuple[str, torch.Tensor]]:  # the collective export, iterated
        for name, tensor in weights:
            pulled.append(name)
            yield name, tensor

    silent = list(_buckets(export(), 40, keep=False))
    assert silent == [{}, {}, {}]  # the same steps as rank 0's, nothing in them
    assert pulled == [name for name, _ in weights]
