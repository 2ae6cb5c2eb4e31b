"""GAE's critic on worker ranks: DP=2 over Ray ranks takes the same critic steps as one
process; one rank behind a local handle is the torch critic itself; the placement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from agentgym.builders.recipe import default_grpo_config
from agentgym.cluster import Cluster, plan_placement, start_cluster
from agentgym.schema import validate
from agentgym.trainers.ranks import CriticGroup, StrategySpec, start_rank_group
from agentgym.trainers.strategies import Critic
from agentgym.trainers.strategies.optim import OptimizerConfig
from agentgym.trainers.strategies.torch_critic import TorchCritic
from agentgym.trainers.updates import update_critic
from tests.test_config import composed
from tests.trainers.test_critic import with_targets
from tests.trainers.test_update_path import ragged_batch

SETTINGS: dict[str, Any] = {
    "optimizer": OptimizerConfig(learning_rate=1e-2, max_grad_norm=1.0),
    "micro_batch_size": 2,
}
CONFIG = default_grpo_config(
    adv_estimator="gae", critic_micro_batch_size=1, critic_gradient_accumulation_steps=6
)


def group(cluster: Cluster, model_dir: Path, ranks: int) -> CriticGroup:
    plan = plan_placement(
        {"critic": list(range(ranks))}, num_nodes=cluster.num_nodes, num_gpus_per_node=0
    )
    spec = StrategySpec("critic", "torch", model_dir, {}, SETTINGS)
    return start_rank_group(cluster, plan.workers["critic"], spec, rpc_timeout=300)


def two_steps(critic: Critic) -> tuple[list[dict[str, float]], torch.Tensor]:
    """Two critic updates (one mini-batch of 6 rows each), then the values of a batch
    on its generated tokens (the rest is padding, cut differently per rank)."""
    metrics = [
        update_critic(CONFIG, critic, with_targets(ragged_batch(seed)), step)
        for seed, step in [(0, 1), (1, 2)]
    ]
    batch = ragged_batch(2)
    return metrics, critic.values(batch) * batch.loss_mask


def assert_same_run(
    first: tuple[list[dict[str, float]], torch.Tensor],
    second: tuple[list[dict[str, float]], torch.Tensor],
) -> None:
    for one, two in zip(first[0], second[0], strict=True):
        assert one.keys() == two.keys()
        for key in one:
            if key != "time/critic":
                # the ranks' gradient sum rounds differently from one process's
                assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), key
    torch.testing.assert_close(second[1], first[1], rtol=1e-4, atol=1e-4)


def test_one_local_rank_equals_the_torch_critic(tiny_model_dir: Path) -> None:
    single = two_steps(TorchCritic(tiny_model_dir, **SETTINGS))
    cluster = start_cluster("local")
    try:
        assert_same_run(single, two_steps(group(cluster, tiny_model_dir, 1)))
    finally:
        cluster.shutdown()
    batch = ragged_batch(2)
    untouched = TorchCritic(tiny_model_dir, **SETTINGS).values(batch) * batch.loss_mask
    assert not torch.allclose(untouched, single[1])  # the steps moved the values


@pytest.mark.ray
def test_dp2_critic_on_ray_equals_one_process(tiny_model_dir: Path) -> None:
    single = two_steps(TorchCritic(tiny_model_dir, **SETTINGS))
    cluster = start_cluster("ray", rpc_timeout=300)
    try:
        dp = group(cluster, tiny_model_dir, 2)
        pids = {handle.call_sync("pid") for handle in dp.handles}
        assert len(pids) == 2  # two processes, not two threads of one
        assert_same_run(single, two_steps(dp))
        dp.close()
    finally:
        cluster.shutdown()


def test_the_critic_takes_actor_trains_devices_unless_its_mapping_says() -> None:
    ray = ("adv_estimator=gae", "distributed=ray", "++actor_train.device_mapping=[0,1]")
    plan = validate(composed(*ray)).placement
    assert [w.slots[0].device for w in plan.workers["critic"]] == [0, 1]
    plan = validate(composed(*ray, "++critic.device_mapping=[2]")).placement
    assert [w.slots[0].device for w in plan.workers["critic"]] == [2]
    assert "critic" not in validate(composed("distributed=ray")).placement.workers
