"""``python -m agentgym.train`` with ``strategy=fsdp2`` on two Ray ranks: two GRPO steps,
each rank writing its shard of the checkpoint beside a Hugging Face folder, which
``python -m agentgym.eval`` scores exactly as the run validated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.trainers.strategies.hf_folder import read_weights
from tests.forkserver import run_python
from tests.trainers.test_train_e2e import train, validation

pytestmark = pytest.mark.ray


def test_two_ray_ranks_train_two_steps_save_their_shards_and_evaluate_as_they_validated(
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
        "eval_steps=2",  # validates at steps 0 and 2
        "val_batch_size=6",
        "val_env_manager.env_groups=6",
        "validation.renders=6",
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
    # eval reads the run's saved config (env, turns, sampling, validation seeds); with
    # seeded HF generation the exported folder plays what the engines, synced from the
    # two ranks' shards, validated at step 2: the same metrics and, turn by turn, the
    # same transcripts (of which some differ from step 0's: the check sees the update)
    validated = validation(output)
    assert sorted(validated) == [0, 2]
    result = run_python(
        ["-m", "agentgym.eval", f"model.path={checkpoint / 'model'}",
         "generation=hf", "renders=6", f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "playing as the training run validated" in result.stdout
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())["metrics"]
    assert report["all/trajectories"] == 6.0
    for key, value in validated[2].items():
        assert report[key.removeprefix("val/")] == pytest.approx(value, abs=1e-9), key
    renders, played = output / "renders", tmp_path / "eval" / "renders"
    transcripts = sorted(renders.glob("step2_*.html"))
    assert len(transcripts) == 6
    for page in transcripts:
        name = page.name.removeprefix("step2_")
        assert (played / name).read_text() == page.read_text(), name
    before = [renders / page.name.replace("step2_", "step0_", 1) for page in transcripts]
    assert any(b.read_text() != a.read_text() for b, a in zip(before, transcripts, strict=True))
