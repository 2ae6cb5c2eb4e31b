"""The Megatron model against the Hugging Face one: logits within 1e-5 (fp32, CPU) and
the weights' round trip HF → Megatron → HF exact, at TP=1 (DP=2), TP=2 and PP=2 over gloo
(two spawned ranks rebuild megatron-core's groups for each layout)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from agentgym.trainers.strategies.torch_strategy import forward
from tests.trainers.megatron.launch import model_dir, spawn
from tests.trainers.megatron.ranks import LAYOUTS, SETTINGS, forward_every_layout
from tests.trainers.test_update_path import ragged_batch


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_dir(tmp_path_factory.mktemp("megatron-qwen2"))


@pytest.fixture(scope="module")
def megatron_runs(qwen_dir: Path) -> dict:
    return spawn(2, forward_every_layout, qwen_dir)  # one pair of processes for all layouts


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_megatron_matches_hugging_face(qwen_dir: Path, megatron_runs: dict, layout: str) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(qwen_dir, dtype=torch.float32).eval()
    batch = ragged_batch(0)
    with torch.no_grad():
        expected = forward(hf, batch, temperature=SETTINGS["temperature"], scored_only=True)
    logprobs, logits, exported = megatron_runs[layout]

    real = batch.attention_mask.bool()
    torch.testing.assert_close(logprobs[real], expected.logprobs[real], rtol=0, atol=1e-5)
    assert torch.all(logprobs[~real] == 0)
    if logits is not None:  # [B, T, V_padded], untempered, against the HF model's raw logits
        hf_logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        torch.testing.assert_close(
            logits[..., : hf.config.vocab_size][real], hf_logits[real].detach(), rtol=0, atol=1e-5
        )
    source = load_file(str(qwen_dir / "model.safetensors"))
    assert exported.keys() == source.keys()
    for name, tensor in source.items():
        assert torch.equal(exported[name], tensor), name
