"""Hugging Face folders in every layout: a tied-embedding model saved in several
shards resumes exactly (the torch strategy and the critic); a folder that does not
match the model is refused by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from agentgym.builders.recipe import default_grpo_config
from agentgym.trainers.strategies import hf_folder
from agentgym.trainers.strategies.optim import OptimizerConfig
from agentgym.trainers.strategies.torch_critic import TorchCritic
from agentgym.trainers.strategies.torch_strategy import TorchStrategy
from agentgym.trainers.updates import update_critic, update_policy
from tests.trainers.test_critic import with_targets
from tests.trainers.test_update_path import ragged_batch

CONFIG = default_grpo_config(micro_batch_size=2, gradient_accumulation_steps=3)


@pytest.fixture(scope="module")
def tied_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model's shape with ``tie_word_embeddings`` (its tokenizer beside it)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("tied")
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    for file in tiny_model_dir.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, folder / file.name)
    return folder


@pytest.fixture
def small_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_folder, "MAX_SHARD_SIZE", "100KB")


LR_1E_2 = OptimizerConfig(learning_rate=1e-2)


def policy(model_dir: Path) -> TorchStrategy:
    return TorchStrategy(model_dir, optimizer=LR_1E_2, micro_batch_size=2)


def test_a_tied_sharded_policy_resumes_exactly(tied_dir: Path, tmp_path: Path, small_shards: None):
    trained = policy(tied_dir)
    assert tuple(hf_folder.tied_aliases(trained.model).items()) == (
        ("lm_head.weight", "model.embed_tokens.weight"),
    )
    update_policy(CONFIG, trained, ragged_batch(0), 1)
    trained.save(tmp_path)
    files = hf_folder.weight_files(tmp_path / "model")
    assert len(files) > 1, "the save is sharded"
    assert "lm_head.weight" not in hf_folder.read_weights(tmp_path / "model")  # stored once

    resumed = policy(tied_dir)
    resumed.load(tmp_path)
    assert resumed.model.lm_head.weight is resumed.model.model.embed_tokens.weight  # still tied
    for one, two in zip(trained.export_weights(), resumed.export_weights(), strict=True):
        assert one[0] == two[0]
        assert torch.equal(one[1], two[1]), one[0]
    # the optimizer continues: the next update is the same on both
    first = update_policy(CONFIG, trained, ragged_batch(1), 2)
    second = update_policy(CONFIG, resumed, ragged_batch(1), 2)
    assert first == second
    for one, two in zip(trained.export_weights(), resumed.export_weights(), strict=True):
        assert torch.equal(one[1], two[1]), one[0]


def test_a_sharded_critic_resumes_exactly(tied_dir: Path, tmp_path: Path, small_shards: None):
    config = default_grpo_config(adv_estimator="gae")
    batch = with_targets(ragged_batch())
    torch.manual_seed(0)
    trained = TorchCritic(tied_dir, micro_batch_size=2, optimizer=LR_1E_2)
    update_critic(config, trained, batch, step=1)
    trained.save(tmp_path)
    assert len(hf_folder.weight_files(tmp_path / "model")) > 1
    torch.manual_seed(1)
    resumed = TorchCritic(tied_dir, micro_batch_size=2, optimizer=LR_1E_2)
    resumed.load(tmp_path)
    torch.testing.assert_close(resumed.values(batch), trained.values(batch), rtol=0, atol=0)
    update_critic(config, trained, batch, step=2)
    update_critic(config, resumed, batch, step=2)
    torch.testing.assert_close(resumed.values(batch), trained.values(batch), rtol=0, atol=0)


def test_a_folder_of_another_model_is_refused_by_name(tied_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "model").mkdir()
    save_file({"model.norm.weight": torch.ones(3)}, str(tmp_path / "model" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['model.embed_tokens.weight'"):
        hf_folder.load_weights(policy(tied_dir).model, tmp_path / "model", device="cpu")
    (tmp_path / "config-only").mkdir()
    shutil.copy(tied_dir / "config.json", tmp_path / "config-only")
    with pytest.raises(FileNotFoundError, match=r"holds no model weights.*'config.json'"):
        hf_folder.weight_files(tmp_path / "config-only")


def test_an_empty_share_of_rows_gives_an_empty_result(tied_dir: Path) -> None:
    """A rank of a group with more ranks than rows is called with no rows."""
    batch = ragged_batch(0).rows(slice(0, 0), width=1)
    assert policy(tied_dir).logprobs(batch).shape == (0, 1)
    critic = TorchCritic(tied_dir, micro_batch_size=2)
    assert critic.values(batch).shape == (0, 1)


def test_stored_weights_read_each_tensor_when_asked(
    tied_dir: Path, tmp_path: Path, small_shards: None
) -> None:
    trained = policy(tied_dir)
    trained.save(tmp_path)  # several shards of 100 KB
    folder = tmp_path / "model"
    assert len(hf_folder.weight_files(folder)) > 1
    everything = hf_folder.read_weights(folder)
    stored = hf_folder.StoredWeights(folder)
    assert sorted(stored) == sorted(everything) and len(stored) == len(everything)
    for name, tensor in everything.items():
        assert torch.equal(stored[name], tensor), name
    with pytest.raises(KeyError):
        stored["lm_head.weight"]  # stored once, under the embedding's name
