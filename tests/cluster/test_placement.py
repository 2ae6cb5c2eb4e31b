"""Placement from ROLL's device_mapping: slots, colocation, and errors with the numbers."""

from __future__ import annotations

import pytest

from agentgym.cluster import Slot, plan_placement
from agentgym.errors import ConfigError
from agentgym.schema import validate
from tests.test_config import composed


def test_ranks_are_contiguous_node_by_node_on_gpus() -> None:
    plan = plan_placement(
        {"actor_train": list(range(8)), "actor_infer": [8, 9, 10, 11, 12, 13, 14, 15]},
        num_nodes=2,
        num_gpus_per_node=8,
        devices_per_worker={"actor_infer": 2},
    )
    train = plan.workers["actor_train"]
    assert [w.slots for w in train] == [(Slot(0, d),) for d in range(8)]
    engines = plan.workers["actor_infer"]
    assert [w.visible_devices for w in engines] == ["0,1", "2,3", "4,5", "6,7"]
    assert {w.node for w in engines} == {1}
    assert plan.world_size("actor_train") == 8 and plan.world_size("actor_infer") == 4


def test_any_two_roles_may_share_devices() -> None:
    plan = plan_placement(
        {"actor_train": [0, 1], "actor_infer": [0, 1], "critic": [1, 0]},
        num_nodes=1,
        num_gpus_per_node=2,
    )
    assert [w.slots for w in plan.workers["actor_train"]] == [
        w.slots for w in plan.workers["actor_infer"]
    ]
    assert [w.slots for w in plan.workers["critic"]] == [(Slot(0, 1),), (Slot(0, 0),)]


def test_cpu_slots_spread_the_devices_evenly_over_the_nodes() -> None:
    plan = plan_placement(
        {"actor_train": [0, 1], "actor_infer": [0]}, num_nodes=2, num_gpus_per_node=0
    )
    assert [w.node for w in plan.workers["actor_train"]] == [0, 1]
    assert plan.workers["actor_infer"][0].node == 0
    assert not plan.gpu and plan.devices_per_node == 1


@pytest.mark.parametrize(
    ("mappings", "kwargs", "message"),
    [
        ({"actor_train": list(range(10))}, {"num_nodes": 1, "num_gpus_per_node": 8},
         r"uses device 9, but the cluster has num_nodes × num_gpus_per_node = 1 × 8 = 8"),
        ({"actor_train": [0, 0, 1]}, {"num_nodes": 1, "num_gpus_per_node": 8},
         r"names device\(s\) \[0\] more than once"),
        ({"actor_infer": [0, 1, 2]}, {"num_nodes": 1, "num_gpus_per_node": 8,
         "devices_per_worker": {"actor_infer": 2}},
         r"3 devices, not a multiple of num_gpus_per_worker=2"),
        ({"actor_infer": [6, 7, 8, 9]}, {"num_nodes": 2, "num_gpus_per_node": 8,
         "devices_per_worker": {"actor_infer": 4}}, r"would span nodes \[0, 1\]"),
    ],
)  # fmt: skip
def test_a_bad_mapping_fails_with_the_numbers(mappings, kwargs, message) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_placement(mappings, **kwargs)


def test_the_config_checks_placement_at_start() -> None:
    with pytest.raises(ConfigError, match=r"1 × 2 = 2 devices"):
        validate(
            composed(
                "distributed=ray", "num_gpus_per_node=2", "++actor_train.device_mapping=[0,1,2]"
            )
        )
    with pytest.raises(ConfigError, match=r"distributed=local runs one trainer rank"):
        validate(composed("++actor_train.device_mapping=[0,1]"))
    with pytest.raises(ConfigError, match=r"reference model lives in the actor_train ranks"):
        validate(composed("distributed=ray", "++actor_train.device_mapping=[0,1]",
                          "++reference.device_mapping=[2]"))  # fmt: skip
    config = validate(
        composed("distributed=ray", "++actor_train.device_mapping='list(range(0,2))'")
    )
    assert config.actor_train.device_mapping == [0, 1]


def test_deepspeed_is_named_and_pointed_at_data_parallel_ranks() -> None:
    with pytest.raises(ConfigError, match=r"deepspeed_train \(DeepSpeed ZeRO\) is not supported"):
        validate(composed("actor_train.strategy_args.strategy_name=deepspeed_train"))
