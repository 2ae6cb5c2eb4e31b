"""``python -m agentgym.train`` with ``strategy=fsdp2`` on two Ray ranks: two GRPO steps,
each rank writing its shard of the checkpoint beside a Hugging Face folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.trainers.strategies.hf_folder import read_weights
from tests.trainers.test_train_e2e import train

pytestmark = pytest.mark.ray


def test_two_ray_ranks_train_two_steps_and_save_their_shards(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a Ray of its own
    output = tmp_path / "run"
    train(
        output,
        tmp_path / "cache",
        f"pretrain={tiny_model_dir}",  # the session's tiny model: none built here
        "generation=hf",
        "strategy=fsdp2",
        "max_steps=2",
        "save_steps=2",
        "eval_steps=0",
        "distributed=ray",
        "num_gpus_per_node=0",
        "++actor_train.device_mapping=[0,1]",
        "actor_train.training_args.per_device_train_batch_size=2",  # 2 × 2 × 2 ranks = 8
    )
    lines = [json.loads(line) for line in (output / "logs" / "metrics.jsonl").open()]
    norms = [line["actor/grad_norm"] for line in lines if "actor/grad_norm" in line]
    assert len(norms) == 2 and all(norm > 0 for norm in norms)
    checkpoint = output / "checkpoints" / "checkpoint-2"
    assert {p.name for p in (checkpoint / "fsdp2").glob("*.distcp")} == {
        "__0_0.distcp",
        "__1_0.distcp",
    }
    weights = read_weights(checkpoint / "model")
    assert "lm_head.weight" in weights and "model.embed_tokens.weight" in weights  # untied
    assert (checkpoint / "model" / "chat_template.jinja").is_file()
