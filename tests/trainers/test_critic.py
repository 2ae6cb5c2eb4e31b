"""The torch critic: a value head on the policy's body, values aligned with the tokens,
exact gradient accumulation of the value loss, a save/load round trip; the recipe's
critic update and the checkpoint of the critic, the KL coefficient and the reward moments."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import torch

from agentgym.builders.recipe import default_grpo_config, kl_controller
from agentgym.trainers.grpo import TrainParts
from agentgym.trainers.objectives import ValueLoss
from agentgym.trainers.rewards import RunningMoments
from agentgym.trainers.run_state import CRITIC_DIR, checkpoint, restore
from agentgym.trainers.strategies import micro_batches
from agentgym.trainers.strategies.optim import OptimizerConfig
from agentgym.trainers.strategies.torch_critic import TorchCritic
from agentgym.trainers.updates import update_critic
from agentgym.trajectory import RolloutBatch
from tests.trainers.test_update_path import ragged_batch


def critic(model_dir: Path, learning_rate: float = OptimizerConfig.learning_rate) -> TorchCritic:
    torch.manual_seed(0)
    optimizer = OptimizerConfig(learning_rate=learning_rate, max_grad_norm=None)
    return TorchCritic(model_dir, micro_batch_size=2, optimizer=optimizer)


def with_targets(batch: RolloutBatch) -> RolloutBatch:
    generator = torch.Generator().manual_seed(3)
    mask = batch.loss_mask.float()
    batch.values = torch.randn(batch.loss_mask.shape, generator=generator) * mask
    batch.returns = torch.randn(batch.loss_mask.shape, generator=generator) * mask
    return batch


def test_the_value_model_is_the_policys_body_with_a_one_output_head(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    value = critic(tiny_model_dir).model
    body = dict(value.model.named_parameters())
    for name, parameter in policy.model.named_parameters():
        torch.testing.assert_close(body[name], parameter, rtol=0, atol=0)
    assert value.score.out_features == 1


def test_values_are_the_head_at_the_previous_position(tiny_model_dir: Path) -> None:
    batch = ragged_batch()
    model = critic(tiny_model_dir)
    got = model.values(batch)  # micro-batches of 2 rows, each trimmed
    for row in range(len(batch)):
        length = int(batch.attention_mask[row].sum())
        with torch.no_grad():
            head = model.model(input_ids=batch.input_ids[row : row + 1, :length]).logits[0, :, 0]
        assert got[row, 0] == 0
        torch.testing.assert_close(got[row, 1:length], head[: length - 1], atol=1e-5, rtol=1e-5)


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("value_clip", [None, 0.05])
def test_micro_batches_give_the_whole_mini_batch_value_gradient(
    tiny_model_dir: Path, value_clip: float | None
) -> None:
    batch = with_targets(ragged_batch())
    config = default_grpo_config(adv_estimator="gae", value_clip=value_clip)
    counts = {"num_tokens": batch.loss_mask.sum(), "num_seqs": (batch.loss_mask.sum(1) > 0).sum()}
    whole, split = critic(tiny_model_dir), critic(tiny_model_dir)
    full = whole.train_step([batch], ValueLoss(config.loss, **counts))
    accumulated = split.train_step(list(micro_batches(batch, 2)), ValueLoss(config.loss, **counts))
    for name, grad in gradients(whole.model).items():
        torch.testing.assert_close(gradients(split.model)[name], grad, atol=1e-6, rtol=1e-5)
    for key, metric in full.items():
        assert accumulated[key].value == pytest.approx(metric.value, rel=1e-5, abs=1e-6), key
    assert full["vf_loss"].value > 0
    assert ("vf_clipfrac" in full) == (value_clip is not None)


def test_update_critic_takes_one_pass_and_fits_the_returns(tiny_model_dir: Path) -> None:
    batch = with_targets(ragged_batch())
    config = default_grpo_config(
        adv_estimator="gae", critic_micro_batch_size=2, critic_gradient_accumulation_steps=2
    )
    model = critic(tiny_model_dir, learning_rate=1e-2)
    first = update_critic(config, model, batch, step=1)
    assert first["critic/updates"] == 2.0  # 6 rows in mini-batches of 4: one pass
    for step in range(2, 30):
        last = update_critic(config, model, batch, step=step)
    assert last["critic/vf_error"] < first["critic/vf_error"] / 2


def test_save_and_load_restore_the_values_and_the_optimizer(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    batch = with_targets(ragged_batch())
    config = default_grpo_config(adv_estimator="gae")
    trained = critic(tiny_model_dir, learning_rate=1e-2)
    update_critic(config, trained, batch, step=1)
    trained.save(tmp_path / "critic")
    loaded = critic(tiny_model_dir, learning_rate=1e-2)
    assert not torch.allclose(loaded.values(batch), trained.values(batch))
    loaded.load(tmp_path / "critic")
    torch.testing.assert_close(loaded.values(batch), trained.values(batch), rtol=0, atol=0)
    # the optimizer continues: the next update is the same on both
    update_critic(config, trained, batch, step=2)
    update_critic(config, loaded, batch, step=2)
    torch.testing.assert_close(loaded.values(batch), trained.values(batch), rtol=0, atol=0)


class SavingPart:
    """Strategy or critic stand-in: writes and reads one marker file."""

    def __init__(self, payload: str) -> None:
        self.payload = payload

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "part.txt").write_text(self.payload)

    def load(self, directory: Path) -> None:
        self.payload = (directory / "part.txt").read_text()


def recipe_parts(tmp_path: Path, payload: str) -> TrainParts:
    settings = default_grpo_config(add_token_level_kl=True, target_kl=0.1, kl_horizon=100)
    source = SimpleNamespace(
        state_dict=lambda step: {"cursor": 3}, load_state_dict=lambda state: None
    )
    return cast(
        TrainParts,
        SimpleNamespace(
            strategy=SavingPart(f"policy {payload}"), critic=SavingPart(f"critic {payload}"),
            kl_controller=kl_controller(settings), reward_moments=RunningMoments(),
            source=source, tracker=SimpleNamespace(run_id="run"),
            meta={"config": {}}, checkpoint_dir=tmp_path / "checkpoints",
        ),
    )  # fmt: skip


def test_a_checkpoint_restores_the_critic_the_kl_coefficient_and_the_moments(
    tmp_path: Path,
) -> None:
    saved = recipe_parts(tmp_path, "saved")
    assert saved.kl_controller is not None and saved.reward_moments is not None
    saved.kl_controller.update(current_kl=1.0, n_steps=10)  # 0.001 * (1 + 0.2 * 10 / 100)
    saved.reward_moments.update(torch.tensor([1.0, 3.0]))
    path = checkpoint(saved, step=5)
    assert (path / CRITIC_DIR / "part.txt").read_text() == "critic saved"
    state = json.loads((path / "trainer_state.json").read_text())
    assert state["kl_controller"] == {"value": pytest.approx(0.00102)}

    fresh = recipe_parts(tmp_path, "fresh")
    assert restore(fresh, True) == 5
    assert cast(SavingPart, fresh.critic).payload == "critic saved"
    assert cast(SavingPart, fresh.strategy).payload == "policy saved"
    assert fresh.kl_controller is not None and fresh.reward_moments is not None
    assert fresh.kl_controller.value == pytest.approx(0.00102)
    assert [fresh.reward_moments.mean, fresh.reward_moments.count] == pytest.approx([2.0, 2.0])


def test_resuming_a_checkpoint_without_a_critic_into_a_gae_run_says_so(tmp_path: Path) -> None:
    saved = recipe_parts(tmp_path, "saved")
    saved.critic = None
    checkpoint(saved, step=1)
    with pytest.raises(FileNotFoundError, match="holds no critic/"):
        restore(recipe_parts(tmp_path, "fresh"), True)


def test_the_fresh_head_is_seeded_and_the_global_rng_left_alone(tiny_model_dir: Path) -> None:
    batch = ragged_batch()
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = TorchCritic(tiny_model_dir, seed=7)
    assert torch.rand(1) == before  # building it drew nothing from the global RNG
    torch.testing.assert_close(
        TorchCritic(tiny_model_dir, seed=7).values(batch), first.values(batch), rtol=0, atol=0
    )
    assert not torch.equal(TorchCritic(tiny_model_dir, seed=8).values(batch), first.values(batch))
