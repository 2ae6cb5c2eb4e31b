"""Megatron ranks behind the trainer worker group on Ray: TP=2 trains like the torch
strategy in one process, and the collective export and save run on every rank."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from agentgym.cluster import Cluster, plan_placement, start_cluster
from agentgym.trainers.ranks import StrategySpec, start_rank_group
from agentgym.trainers.strategies.torch_strategy import TorchStrategy
from tests.trainers.megatron.launch import model_dir
from tests.trainers.megatron.ranks import SETTINGS, two_steps
from tests.trainers.megatron.test_training import assert_same_run


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    cluster = start_cluster("ray", rpc_timeout=300)
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.mark.ray
def test_tp2_group_on_ray_trains_exports_and_saves(
    ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    qwen_dir = model_dir(tmp_path_factory.mktemp("megatron-group"))
    single: Any = two_steps(TorchStrategy(qwen_dir, **SETTINGS))
    plan = plan_placement({"actor_train": [0, 1]}, num_nodes=1, num_gpus_per_node=0)
    spec = StrategySpec(
        "actor_train", "megatron_train", qwen_dir, {"tensor_model_parallel_size": 2}, SETTINGS
    )
    group = start_rank_group(ray_cluster, plan.workers["actor_train"], spec, rpc_timeout=300)
    try:
        assert len({handle.call_sync("pid") for handle in group.handles}) == 2
        # export_weights (inside two_steps) needs both TP ranks: it would hang on rank 0 alone
        assert_same_run(single, two_steps(group))
        target = tmp_path_factory.mktemp("megatron-group-ckpt")
        group.save(target)
        saved = TorchStrategy(target / "model", **SETTINGS)
        for name, tensor in saved.export_weights():
            torch.testing.assert_close(tensor, single[1][name], rtol=1e-5, atol=1e-5)
    finally:
        group.close()


@pytest.mark.ray
def test_four_data_parallel_ranks_on_ray_take_six_rows(
    ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Rows and micro-batches fewer than, or not a multiple of, the ranks: every rank
    still takes part in the strategy's gathers (a rank left out hangs the others),
    and the padded mini-batch takes the one-process step."""
    from tests.trainers.test_update_path import ragged_batch

    qwen_dir = model_dir(tmp_path_factory.mktemp("megatron-dp4"))
    single = TorchStrategy(qwen_dir, **SETTINGS)
    batch = ragged_batch(0)  # 6 rows: shares of 2, 2, 1, 1; 3 rows: 1, 1, 1, 0
    first = batch.rows(slice(0, 3), width=14)
    expected = [single.logprobs(part) * part.loss_mask for part in (batch, first)]
    single_run: Any = two_steps(single)  # 6 micro-batches a mini-batch: 8 on 4 replicas
    plan = plan_placement({"actor_train": [0, 1, 2, 3]}, num_nodes=1, num_gpus_per_node=0)
    spec = StrategySpec("actor_train", "megatron_train", qwen_dir, {}, SETTINGS)
    group = start_rank_group(ray_cluster, plan.workers["actor_train"], spec, rpc_timeout=300)
    try:
        for part, logprobs in zip((batch, first), expected, strict=True):
            got = group.logprobs(part) * part.loss_mask  # the torch strategy's: 0 off it
            torch.testing.assert_close(got, logprobs, rtol=1e-5, atol=1e-5)
        assert_same_run(single_run, two_steps(group))
    finally:
        group.close()
