"""``agentgym plan``: its bytes against what the strategies allocate, its activations
against a memory profile of a training step, ROLL's batch rule and the command."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentgym.plan import Devices, Layout, Workload, activation_bytes, load_shape, search
from agentgym.plan.command import main
from agentgym.plan.memory import state_bytes, total_parameters
from agentgym.plan.search import roll_batch_rule
from agentgym.trajectory import RolloutBatch
from tests.plan_ranks import activation_peak, storage_bytes

SMALL: dict[str, Any] = {
    "vocab_size": 1000,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
"""The small shape: tied embeddings, 4 layers, GQA 4:2 (the tiny one is untied)."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.trainers.megatron.launch import model_dir

    root = tmp_path_factory.mktemp("plan")
    torch.manual_seed(0)
    small = root / "small"
    Qwen2ForCausalLM(Qwen2Config(**SMALL)).save_pretrained(small)
    return {"tiny": model_dir(root / "tiny"), "small": small}


def close(planned: float, measured: float, tolerance: float) -> bool:
    return abs(planned - measured) <= tolerance * measured


def test_named_shapes_have_the_published_parameter_counts() -> None:
    # The model cards: 0.49B, 1.54B and 7.61B parameters (cut, not rounded: 7.6156B).
    for name, centi in (("Qwen2.5-0.5B", 49), ("Qwen2.5-1.5B", 154), ("Qwen2.5-7B", 761)):
        assert total_parameters(load_shape(name)) // 10**7 == centi


def test_megatron_bytes_match_what_each_rank_allocates(folders: dict[str, Path]) -> None:
    pytest.importorskip("megatron.core")
    from tests.plan_ranks import every_layout
    from tests.trainers.megatron.launch import spawn

    configs: dict[str, tuple[str, dict[str, Any]]] = {
        "tiny dp2": ("tiny", {}),
        "tiny dp2 dist-opt": ("tiny", {"use_distributed_optimizer": True}),
        "tiny tp2": ("tiny", {"tensor_model_parallel_size": 2}),
        "tiny pp2": ("tiny", {"pipeline_model_parallel_size": 2}),
        "small tp2": ("small", {"tensor_model_parallel_size": 2}),
        "small pp2": ("small", {"pipeline_model_parallel_size": 2}),
        "small dp2 dist-opt": ("small", {"use_distributed_optimizer": True}),
    }
    measured = spawn(
        2, every_layout, [(name, folders[f], config) for name, (f, config) in configs.items()]
    )
    for name, (folder, config) in configs.items():
        tp = config.get("tensor_model_parallel_size", 1)
        pp = config.get("pipeline_model_parallel_size", 1)
        layout = Layout(
            tp=tp,
            pp=pp,
            dp=2 // (tp * pp),
            distributed_optimizer=config.get("use_distributed_optimizer", False),
        )
        for rank in measured[name]:
            planned = state_bytes(
                load_shape(str(folders[folder])),
                layout,
                strategy="megatron",
                dtype="float32",
                stage=rank["pp_rank"],
            )
            figures = {
                k: (getattr(planned, k), rank[k]) for k in ("weights", "gradients", "optimizer")
            }
            print(json.dumps({"layout": name, "pp_rank": rank["pp_rank"], **figures}))
            for kind in ("weights", "gradients", "optimizer"):
                assert close(getattr(planned, kind), rank[kind], 0.02), (name, kind, planned, rank)


def test_torch_strategy_bytes_match_what_it_allocates(folders: dict[str, Path]) -> None:
    from agentgym.trainers.strategies.torch_strategy import TorchStrategy
    from agentgym.trainers.updates import update_policy
    from tests.trainers.megatron.ranks import grpo_config
    from tests.trainers.test_update_path import ragged_batch

    for folder in folders.values():
        strategy = TorchStrategy(folder)
        update_policy(grpo_config(), strategy, ragged_batch(0), 1)
        params = list(strategy.model.parameters())
        moments = [v for s in strategy.optimizer.state.values() for v in s.values() if v.dim()]
        planned = state_bytes(load_shape(str(folder)), Layout(), strategy="torch", dtype="float32")
        assert close(planned.weights, storage_bytes(params), 0.02)
        assert close(planned.gradients, storage_bytes([p.grad for p in params]), 0.02)
        assert close(planned.optimizer, storage_bytes(moments), 0.02)


def full_batch(rows: int, width: int, vocab: int) -> RolloutBatch:
    ids = torch.randint(0, vocab, (rows, width), generator=torch.Generator().manual_seed(0))
    ones = torch.ones(rows, width, dtype=torch.long)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=ones,
        position_ids=torch.arange(width).expand(rows, width).contiguous(),
        loss_mask=ones,
        engine_logprobs=torch.zeros(rows, width),
        token_rewards=torch.zeros(rows, width),
        scores=torch.zeros(rows),
        group_ids=torch.zeros(rows, dtype=torch.long),
        tags=["t"] * rows,
    )


def torch_activation_peak(folder: Path, batch: RolloutBatch, recompute: str) -> int:
    """:func:`~tests.plan_ranks.activation_peak` of the torch strategy's forward and
    backward."""
    from agentgym.trainers.strategies.torch_strategy import TorchStrategy, forward

    strategy = TorchStrategy(folder, gradient_checkpointing=recompute == "full")
    strategy.model.train()

    def step() -> None:
        outputs = forward(strategy.model, batch, temperature=0.7, scored_only=True)
        (outputs.logprobs * batch.loss_mask).sum().backward()

    return activation_peak(step, strategy.model)


@pytest.mark.parametrize(
    ("strategy", "recompute", "prompt"),
    [
        ("torch", "none", 0),
        ("torch", "full", 0),
        ("megatron", "none", 0),
        ("megatron", "full", 0),
        ("torch", "none", 128),
        ("megatron", "none", 128),
    ],
)
def test_activation_estimate_is_within_a_quarter_of_the_profiled_peak(
    folders: dict[str, Path], strategy: str, recompute: str, prompt: int
) -> None:
    """A training step's forward and backward (the head from the first scored token on:
    ``prompt`` tokens scored by no loss) against the planner's estimate."""
    rows, width = 4, 256
    batch = full_batch(rows, width, SMALL["vocab_size"])
    batch.loss_mask = batch.loss_mask.clone()  # the attention mask stays all ones
    batch.loss_mask[:, :prompt] = 0
    if strategy == "torch":
        measured = torch_activation_peak(folders["small"], batch, recompute)
    else:
        pytest.importorskip("megatron.core")
        from tests.plan_ranks import megatron_activation_peak
        from tests.trainers.megatron.launch import spawn

        granularity = None if recompute == "none" else recompute
        measured = spawn(1, megatron_activation_peak, folders["small"], batch, granularity)
    planned = activation_bytes(
        load_shape(str(folders["small"])),
        Layout(recompute=recompute, micro_batch_size=rows),
        width,
        dtype="float32",
        prompt_len=prompt,
    )
    figures = {"strategy": strategy, "recompute": recompute, "prompt": prompt}
    print(json.dumps({**figures, "planned": planned, "measured": measured}))
    assert close(planned, measured, 0.25), (planned, measured)


def test_roll_batch_rule() -> None:
    # 64 prompts × 8 samples = 512: 4 × 8 × 16 = 512 divides, 3 × 8 × 16 = 384 does not.
    assert roll_batch_rule(512, 4, 8, 16) is None
    assert "ROLL's batch rule" in (roll_batch_rule(512, 3, 8, 16) or "")


def test_search_refuses_what_does_not_fit_and_keeps_memory_ordered() -> None:
    shape = load_shape("Qwen2.5-7B")
    work = Workload(seq_len=4096, rollout_batch_size=32, num_return_sequences=8)
    plans = search(shape, Devices(8, 80.0), work)
    kept = [p for p in plans if not p.refused]
    assert kept and all(p.peak_gib <= 76.0 for p in kept)
    # 7B in bf16 with fp32 Adam is 18 bytes a parameter: no layout without splitting fits.
    single = [
        p for p in plans if p.layout.tp == p.layout.pp == 1 and not p.layout.distributed_optimizer
    ]
    assert single and all(any("memory" in r for r in p.refused) for p in single)
    # Splitting the optimizer state over DP never costs memory.
    for plan in kept:
        if plan.layout.distributed_optimizer:
            twin = [
                p
                for p in plans
                if p.layout == dataclasses.replace(plan.layout, distributed_optimizer=False)
            ]
            assert all(t.peak_gib >= plan.peak_gib for t in twin)


def test_sequence_splits_are_planned_only_for_transformer_engine() -> None:
    shape = load_shape("Qwen2.5-7B")
    work = Workload(seq_len=4096, rollout_batch_size=32, num_return_sequences=8)
    ours = [plan.layout for plan in search(shape, Devices(8, 80.0), work)]
    # agentgym's Megatron strategy refuses SP and CP (local layer spec): never planned
    assert any(lay.tp > 1 for lay in ours)
    assert not any(lay.sequence_parallel or lay.cp > 1 for lay in ours)
    with_te = dataclasses.replace(work, split_sequence=True)
    theirs = [plan.layout for plan in search(shape, Devices(8, 80.0), with_te)]
    assert all(lay.sequence_parallel == (lay.tp > 1) for lay in theirs)
    assert any(lay.cp > 1 for lay in theirs) and len(theirs) > len(ours)


def test_command_prints_the_table_and_roll_keys(capsys: pytest.CaptureFixture[str]) -> None:
    main(
        [
            "--model",
            "Qwen2.5-0.5B",
            "--devices",
            "4",
            "--seq-len",
            "2048",
            "--rollout-batch-size",
            "16",
            "--num-return-sequences",
            "8",
            "--colocate",
        ]
    )
    out = capsys.readouterr().out
    assert "strategy_name: megatron_train" in out
    assert "tensor_model_parallel_size:" in out
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "--model",
                "Qwen2.5-7B",
                "--devices",
                "1",
                "--memory-gib",
                "24",
                "--seq-len",
                "4096",
                "--rollout-batch-size",
                "8",
            ]
        )
    assert exit_info.value.code == 1


def test_strategy_config_auto_applies_the_winner_and_keeps_the_mini_batch(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omegaconf import OmegaConf

    from agentgym.plan.auto import planned
    from agentgym.schema import validate
    from agentgym.train import check
    from tests.test_config import composed
    from tests.test_data_parallel import TRAJECTORIES

    overrides = (
        *TRAJECTORIES,
        f"pretrain={tiny_model_dir}",
        "distributed=ray",
        "num_gpus_per_node=0",
        "++actor_train.device_mapping=[0,1,2,3]",
        "strategy=megatron",
    )
    resolved, plans = planned(composed(*overrides, "strategy.strategy_config=auto"))
    block = resolved["actor_train"]["strategy_args"]["strategy_config"]
    assert block == resolved["strategy"]["strategy_config"]  # both places that said auto
    winner = plans[0]
    assert block["tensor_model_parallel_size"] == winner.layout.tp
    config = validate(resolved)
    args = config.actor_train.training_args
    # the mini-batch the config asked for: 4 per device × 2 accumulated × 4 ranks
    mini = args.per_device_train_batch_size * args.gradient_accumulation_steps
    assert mini * config.data_parallel["actor_train"] == 32
    # the same through the entry point's check, from the spelling
    cfg = OmegaConf.create(composed(*overrides, "actor_train.strategy_args.strategy_config=auto"))
    checked, _ = check(cfg)
    assert checked.actor_train.strategy_args.strategy_config == block
    assert "strategy_config=auto: the first row (tensor_model_parallel_size=" in (
        capsys.readouterr().out
    )


def test_strategy_config_auto_needs_megatron_and_a_layout_that_fits(tiny_model_dir: Path) -> None:
    from agentgym.errors import ConfigError
    from agentgym.plan.auto import planned
    from tests.test_config import composed

    auto = ("actor_train.strategy_args.strategy_config=auto", f"pretrain={tiny_model_dir}")
    with pytest.raises(ConfigError, match="plans Megatron layouts; the strategy is 'torch'"):
        planned(composed(*auto))
    with pytest.raises(ConfigError, match=r"no layout of \S+ fits"):
        planned(composed(*auto, "strategy=megatron", "sequence_length=2000000000"))
