"""The weight table's layouts and the start checks, by hand (one process, no process
group)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from agentgym.trainers.strategies.megatron.model import Parallelism
from agentgym.trainers.strategies.megatron.options import check_options
from agentgym.trainers.strategies.megatron.parallel import Groups, even_micro_batches
from agentgym.trainers.strategies.megatron.weights import LAYOUTS, Shapes, tp_merge, tp_shard

# 2 query groups of 2 heads, head_dim 1: rows are named by value
SHAPES = Shapes(
    vocab_size=3, padded_vocab_size=4, num_query_groups=2, heads_per_group=2, head_dim=1
)


def column(*values: float) -> torch.Tensor:
    return torch.tensor(values)[:, None]  # [N, 1]


def test_qkv_is_interleaved_per_query_group_and_split_by_whole_groups() -> None:
    q, k, v = column(10, 11, 12, 13), column(20, 21), column(30, 31)
    full = LAYOUTS["qkv"].stack([q, k, v], SHAPES)
    assert full[:, 0].tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    assert tp_shard(full, LAYOUTS["qkv"], 1, 2)[:, 0].tolist() == [12, 13, 21, 31]
    back = LAYOUTS["qkv"].unstack(full, SHAPES)
    assert [t[:, 0].tolist() for t in back] == [[10, 11, 12, 13], [20, 21], [30, 31]]


def test_gate_up_keeps_gate_then_up_on_every_rank() -> None:
    gate, up = column(1, 2), column(3, 4)
    full = LAYOUTS["gate_up"].stack([gate, up], SHAPES)
    assert tp_shard(full, LAYOUTS["gate_up"], 0, 2)[:, 0].tolist() == [1, 3]
    assert tp_shard(full, LAYOUTS["gate_up"], 1, 2)[:, 0].tolist() == [2, 4]


def test_vocab_rows_are_padded_with_zeros_and_cut_on_export() -> None:
    table = torch.ones(3, 2)
    full = LAYOUTS["vocab"].stack([table], SHAPES)
    assert full.tolist() == [[1, 1], [1, 1], [1, 1], [0, 0]]
    assert torch.equal(LAYOUTS["vocab"].unstack(full, SHAPES)[0], table)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_merging_the_shards_gives_the_full_tensor(layout: str) -> None:
    full = torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4)
    shards = [tp_shard(full, LAYOUTS[layout], rank, 2) for rank in range(2)]
    assert torch.equal(tp_merge(shards, LAYOUTS[layout]), full)


def test_options_that_need_transformer_engine_stop_at_start() -> None:
    # on every device: the strategy builds megatron-core's local spec on a GPU too
    with pytest.raises(ValueError, match="sequence_parallel=True needs Transformer Engine"):
        check_options(Parallelism(), sequence_parallel=True, recompute_granularity=None)
    with pytest.raises(ValueError, match="context_parallel_size=2 needs Transformer Engine"):
        check_options(
            Parallelism(context_parallel_size=2),
            sequence_parallel=False,
            recompute_granularity=None,
        )
    with pytest.raises(ValueError, match="valid options: \\['full', 'selective'\\]"):
        check_options(Parallelism(), sequence_parallel=False, recompute_granularity="some")
    assert check_options(
        Parallelism(), sequence_parallel=False, recompute_granularity="selective"
    ) == {
        "sequence_parallel": False,
        "recompute_granularity": "selective",
    }


def test_float16_stops_at_start_naming_bfloat16(tmp_path: Path) -> None:
    from agentgym.trainers.strategies.megatron.strategy import MegatronStrategy

    # before any model work (the folder is empty): megatron-core's fp16 needs loss scaling
    with pytest.raises(ValueError, match="float32 or bfloat16, not dtype='float16'"):
        MegatronStrategy(tmp_path, dtype="float16")


def test_a_short_mini_batch_is_filled_with_masked_copies_for_every_replica() -> None:
    from tests.trainers.test_update_path import ragged_batch

    groups = Groups(0, 4, 0, 2, 0, 1, 0, 2)  # world 4 = TP 2 × DP 2
    batch = ragged_batch()
    parts = [batch.rows(slice(i, i + 2)) for i in range(0, 6, 2)]  # 3 micro-batches
    even = even_micro_batches(parts, groups)
    assert len(even) == 4
    assert all(a is b for a, b in zip(parts, even[:3], strict=False))
    assert torch.equal(even[3].input_ids, parts[2].input_ids)
    assert int(even[3].loss_mask.sum()) == 0 < int(parts[2].loss_mask.sum())
    assert even_micro_batches(parts[:2], groups) == parts[:2]
