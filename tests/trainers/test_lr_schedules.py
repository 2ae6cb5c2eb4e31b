"""Learning-rate schedules (lr_scheduler_type, warmup_steps, warmup_ratio) against
hand-computed factors and transformers' get_scheduler, and the run's optimizer-step
count as ROLL computes it."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from agentgym.builders.strategies import strategy_settings
from agentgym.schema import validate
from agentgym.trainers.strategies.optim import (
    LR_SCHEDULERS,
    OptimizerConfig,
    build_optimizer,
    lr_schedule,
    optimizer_steps,
    warmup_steps_of,
)

C = math.cos(math.pi / 4)  # progress 1/4 of the half cosine
# warmup 2, total 6: warmup 0, 1/2; then 4 decay steps (progress 0, 1/4, 1/2, 3/4, 1)
BY_HAND = {
    "constant": [1.0] * 8,
    "constant_with_warmup": [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    "linear": [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0],
    # past the total transformers' cosine rises again: progress 5/4 gives (1 - C) / 2
    "cosine": [0.0, 0.5, 1.0, (1 + C) / 2, 0.5, (1 - C) / 2, 0.0, (1 - C) / 2],
}


@pytest.mark.parametrize("name", sorted(BY_HAND))
def test_schedules_by_hand(name: str) -> None:
    schedule = lr_schedule(name, warmup_steps=2, total_steps=6)
    assert [schedule(step) for step in range(8)] == pytest.approx(BY_HAND[name])


@pytest.mark.parametrize("name", sorted(LR_SCHEDULERS))
@pytest.mark.parametrize(("warmup", "total"), [(0, 1), (0, 7), (3, 10), (10, 10), (4, 3)])
def test_schedules_match_transformers_get_scheduler(name: str, warmup: int, total: int) -> None:
    from transformers import get_scheduler

    ours, our_schedule = build_optimizer(
        torch.nn.Linear(1, 1),
        OptimizerConfig(
            learning_rate=2.0, lr_scheduler_type=name, warmup_steps=warmup, total_steps=total
        ),
    )
    theirs = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    their_schedule = get_scheduler(name, theirs, num_warmup_steps=warmup, num_training_steps=total)
    our_lrs, their_lrs = [], []
    for _ in range(total + 3):
        our_lrs.append(ours.param_groups[0]["lr"])
        their_lrs.append(theirs.param_groups[0]["lr"])
        ours.step()
        theirs.step()
        our_schedule.step()
        their_schedule.step()
    assert our_lrs == pytest.approx(their_lrs, abs=1e-12)


def test_warmup_ratio_is_rolls_rule() -> None:
    assert warmup_steps_of(3, 0.5, 10) == 3  # warmup_steps wins when > 0
    assert warmup_steps_of(0, 0.25, 10) == 3  # ceil(2.5)
    assert warmup_steps_of(0, 0.0, None) == 0
    schedule = lr_schedule("cosine", warmup_ratio=0.25, total_steps=10)  # warmup 3
    assert [schedule(s) for s in (0, 1, 3)] == pytest.approx([0.0, 1 / 3, 1.0])
    with pytest.raises(ValueError, match=r"warmup_ratio=0\.25 needs"):
        warmup_steps_of(0, 0.25, None)


def test_decaying_schedules_need_the_step_count_and_names_are_checked() -> None:
    with pytest.raises(ValueError, match="'cosine' needs the run's optimizer-step count"):
        lr_schedule("cosine", warmup_steps=2)
    with pytest.raises(ValueError, match="'cosin' is not supported; valid options"):
        lr_schedule("cosin")


def test_the_runs_optimizer_steps_as_roll_counts_them() -> None:
    # 5 steps × 8 trajectories × 2 epochs / mini-batches of 4 = 20 updates
    assert optimizer_steps(max_steps=5, rollout_batch_size=8, ppo_epochs=2, mini_batch_size=4) == 20
    assert optimizer_steps(max_steps=1, rollout_batch_size=2, ppo_epochs=1, mini_batch_size=4) == 1
    with initialize_config_module("agentgym.configs", version_base=None):
        composed = compose(
            "config",
            overrides=[
                "max_steps=5",
                "ppo_epochs=2",
                "rollout_batch_size=8",
                "train_env_manager.env_groups=4",
                "train_env_manager.group_size=2",
                "actor_train.training_args.per_device_train_batch_size=2",
                "actor_train.training_args.gradient_accumulation_steps=2",
                "actor_train.training_args.lr_scheduler_type=cosine",
                "actor_train.training_args.warmup_ratio=0.1",
            ],
        )
    config = validate(OmegaConf.to_container(composed, resolve=True))  # type: ignore[arg-type]
    settings = strategy_settings(config, Path("unused"), needs_reference=False)
    optimizer = settings["optimizer"]
    assert (optimizer.total_steps, optimizer.warmup_ratio) == (20, 0.1)
    assert optimizer.lr_scheduler_type == "cosine"
    # a rank group's actors receive the settings pickled
    assert pickle.loads(pickle.dumps(settings)) == settings


def test_adamw_takes_the_multi_tensor_path_with_the_per_tensor_paths_numbers() -> None:
    # torch's CPU default is the per-tensor loop; ours is the multi-tensor one, which must
    # give the same parameters to the bit (weight decay, a warmup schedule, several steps)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50))
    config = OptimizerConfig(
        learning_rate=1e-2, weight_decay=0.1, warmup_steps=2, total_steps=6, betas=(0.9, 0.95)
    )
    ours, schedule = build_optimizer(model, config)
    assert ours.param_groups[0]["foreach"] is True
    reference = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50))
    reference.load_state_dict(model.state_dict())
    theirs = torch.optim.AdamW(
        reference.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), foreach=False
    )
    their_schedule = torch.optim.lr_scheduler.LambdaLR(theirs, config.schedule())
    tokens = torch.randint(0, 50, (4, 7), generator=torch.Generator().manual_seed(1))
    for _ in range(5):
        for net, optimizer, lr in ((model, ours, schedule), (reference, theirs, their_schedule)):
            optimizer.zero_grad()
            net(tokens).logsumexp(-1).mean().backward()
            optimizer.step()
            lr.step()
    for mine, single in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, single)
