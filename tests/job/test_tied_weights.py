"""A tied model's weights (``lm_head.weight`` is ``embed_tokens.weight``: Qwen2.5-0.5B and
-1.5B) reach safetensors as separate tensors: safetensors refuses tensors that share
memory, and on the CPU ``.cpu()`` hands back the very tensor."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentgym.job.published_weights import FolderChannel, WeightPublisher
from agentgym.rollout.backends.buckets import unshared


def tied_model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


def test_shared_tensors_are_copied_once_and_others_left_as_they_are() -> None:
    model = tied_model()
    state = model.state_dict()
    shared = {
        state[n].untyped_storage().data_ptr()
        for n in ("lm_head.weight", "model.embed_tokens.weight")
    }
    assert len(shared) == 1  # one tensor under two names
    tensors = unshared(state.items())
    assert list(tensors) == list(state)
    head, embed = tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]
    assert torch.equal(head, embed)
    assert head.untyped_storage().data_ptr() != embed.untyped_storage().data_ptr()
    # everything else is the model's own tensor: no copy where none is needed
    norm = "model.norm.weight"
    assert tensors[norm].untyped_storage().data_ptr() == state[norm].untyped_storage().data_ptr()


def test_a_tied_model_publishes_through_the_folder_channel(tmp_path: Path) -> None:
    model = tied_model()
    channel = FolderChannel(tmp_path)
    WeightPublisher(channel, groups_per_step=1).publish(0, model.state_dict().items())
    published = channel.latest()
    assert published is not None
    read = dict(channel.read(published))
    assert read.keys() == model.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(read[name], tensor), name
