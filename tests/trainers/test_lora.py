"""LoRA on the torch strategy with real peft and the tiny model: ROLL's target rules,
only the adapter trains (parameter count by hand), the reference is the base under
the adapter (no second copy), the engines get merged weights by base name, a resumed
run continues exactly, and the merged export loads in transformers with the run's
log-probabilities."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentgym.builders.recipe import default_grpo_config
from agentgym.builders.strategies import strategy_settings
from agentgym.choices import parse_lora_target
from agentgym.errors import ConfigError
from agentgym.formats.fit import Machine, fit_to_machine
from agentgym.schema import validate
from agentgym.trainers.strategies import build_strategy
from agentgym.trainers.strategies.lora import (
    ADAPTER_DIR,
    LoraSettings,
    lora_settings,
    target_modules,
)
from agentgym.trainers.strategies.optim import OptimizerConfig
from agentgym.trainers.strategies.torch_strategy import TorchStrategy
from agentgym.trainers.updates import update_policy
from tests.forkserver import run_python
from tests.test_config import composed
from tests.test_roll_examples import A, translate
from tests.trainers.test_hf_folder import tied_dir  # noqa: F401
from tests.trainers.test_train_e2e import metrics, train, validation
from tests.trainers.test_update_path import ragged_batch

PROJECTIONS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
RANK = 4
# the tiny model: hidden 128, MLP 512, 4 query heads and 1 key/value head of 32, 2 layers;
# a rank-r adapter on a (in -> out) layer holds r × (in + out) numbers
PER_LAYER = (128 + 128) + (128 + 32) + (128 + 32) + (128 + 128) + 3 * (128 + 512)
TRAINABLE = 2 * RANK * PER_LAYER  # 22,016
CONFIG = default_grpo_config(micro_batch_size=2, gradient_accumulation_steps=3)


def lora_strategy(model_dir: Path, **settings: object) -> TorchStrategy:
    torch.manual_seed(0)
    return TorchStrategy(
        model_dir,
        optimizer=OptimizerConfig(learning_rate=1e-2),
        micro_batch_size=2,
        reference_path=model_dir,
        lora=LoraSettings(("all-linear",), RANK, 2 * RANK),
        **settings,
    )


def test_rolls_targets_read_as_rolls() -> None:
    assert parse_lora_target("q_proj, v_proj,") == ("q_proj", "v_proj")  # ROLL splits on commas
    assert parse_lora_target(["all-linear"]) == ("all-linear",)
    assert parse_lora_target(".*(q|v)_proj") == ".*(q|v)_proj"  # a regular expression, whole
    assert lora_settings("all-linear", 32, None) == LoraSettings(("all-linear",), 32, 64)
    assert lora_settings(None, 32, 32) is None
    with pytest.raises(ValueError, match=r"'all-embedding': LoRA on embeddings is not built"):
        parse_lora_target("all-embedding")
    with pytest.raises(ValueError, match=r"names no module"):
        parse_lora_target(" , ")


def test_all_linear_is_every_linear_layer_but_the_output_layer(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert target_modules(model, ("all-linear",)) == PROJECTIONS  # lm_head is not adapted
    assert target_modules(model, ("v_proj", "q_proj")) == ["q_proj", "v_proj"]
    with pytest.raises(ValueError, match=r"does not have; its linear layers: \['down_proj'"):
        target_modules(model, ("qkv_proj",))


def test_only_the_adapter_trains_and_the_reference_is_the_base(tiny_model_dir: Path) -> None:
    strategy = lora_strategy(tiny_model_dir)
    batch = ragged_batch(0)
    base = TorchStrategy(tiny_model_dir, micro_batch_size=2)
    trainable = [p for p in strategy.model.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == TRAINABLE
    optimized = [p for group in strategy.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimized} == {id(p) for p in trainable}
    # B starts at 0: the policy starts as the base
    torch.testing.assert_close(strategy.logprobs(batch), base.logprobs(batch), rtol=0, atol=0)
    before = {k: v.clone() for k, v in strategy.model.get_base_model().state_dict().items()}
    update_policy(CONFIG, strategy, batch, 1)
    assert not torch.allclose(strategy.logprobs(batch), base.logprobs(batch))
    after = strategy.model.get_base_model().state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items() if ".lora_B" not in k)
    # the reference is the frozen base, computed by the policy's own modules
    assert strategy.reference.model is strategy.model
    torch.testing.assert_close(
        strategy.reference_logprobs(batch), base.logprobs(batch), rtol=0, atol=0
    )
    assert strategy.model.training  # the reference's pass leaves the policy's mode


def test_gradient_checkpointing_reaches_the_adapter(tiny_model_dir: Path) -> None:
    plain, recomputed = (
        lora_strategy(tiny_model_dir, gradient_checkpointing=flag) for flag in (False, True)
    )
    for strategy in (plain, recomputed):
        update_policy(CONFIG, strategy, ragged_batch(0), 1)
    batch = ragged_batch(1)
    torch.testing.assert_close(recomputed.logprobs(batch), plain.logprobs(batch))


def test_the_engines_get_merged_weights_by_base_name(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    strategy = lora_strategy(tiny_model_dir)
    update_policy(CONFIG, strategy, ragged_batch(0), 1)
    engine = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    exported = strategy.export_weights()
    assert iter(exported) is exported  # a generator: one tensor at a time
    weights = dict(exported)
    assert list(weights) == list(engine.state_dict())
    # peft's own merge gives the same tensors
    import copy

    merged = copy.deepcopy(strategy.model).merge_and_unload().state_dict()
    assert all(torch.equal(weights[name], merged[name]) for name in weights)
    engine.load_state_dict(weights)
    served = TorchStrategy(tiny_model_dir, micro_batch_size=2)
    served.model = engine
    batch = ragged_batch(1)
    # base + B·A in one matrix differs from the adapter's two products by rounding only
    torch.testing.assert_close(served.logprobs(batch), strategy.logprobs(batch), atol=1e-5, rtol=0)


def test_a_resumed_lora_run_continues_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    trained = lora_strategy(tiny_model_dir)
    update_policy(CONFIG, trained, ragged_batch(0), 1)
    trained.save(tmp_path)
    adapter = load_file(tmp_path / ADAPTER_DIR / "adapter_model.safetensors")
    assert sum(t.numel() for t in adapter.values()) == TRAINABLE  # the adapter, not the model
    optimizer = torch.load(tmp_path / "optimizer.pt", weights_only=True)
    assert sum(s["exp_avg"].numel() for s in optimizer["state"].values()) == TRAINABLE
    resumed = lora_strategy(tiny_model_dir)
    resumed.load(tmp_path)
    batch = ragged_batch(1)
    torch.testing.assert_close(resumed.logprobs(batch), trained.logprobs(batch), rtol=0, atol=0)
    first, again = (update_policy(CONFIG, s, ragged_batch(2), 2) for s in (trained, resumed))
    assert again == first
    torch.testing.assert_close(resumed.logprobs(batch), trained.logprobs(batch), rtol=0, atol=0)
    other = TorchStrategy(tiny_model_dir, lora=LoraSettings(("q_proj",), RANK, RANK))
    with pytest.raises(ValueError, match=r"holds another adapter: missing \[\], unexpected \["):
        other.load(tmp_path)


def test_the_merged_export_loads_in_transformers_with_the_runs_logprobs(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    strategy = lora_strategy(tiny_model_dir)
    update_policy(CONFIG, strategy, ragged_batch(0), 1)
    strategy.save(tmp_path)
    folder = tmp_path / "model"
    model = AutoModelForCausalLM.from_pretrained(folder)  # plain transformers, no peft
    assert not any("lora" in name for name in model.state_dict())
    assert AutoTokenizer.from_pretrained(folder).chat_template is not None
    exported = TorchStrategy(folder, micro_batch_size=2)
    batch = ragged_batch(1)
    torch.testing.assert_close(
        exported.logprobs(batch), strategy.logprobs(batch), atol=1e-5, rtol=0
    )


def test_a_tied_model_exports_its_merged_weights_and_keeps_its_output_layer_out(
    tied_dir: Path,  # noqa: F811 (test_hf_folder's fixture)
    tmp_path: Path,
) -> None:
    strategy = lora_strategy(tied_dir)
    update_policy(CONFIG, strategy, ragged_batch(0), 1)
    strategy.save(tmp_path)
    exported = TorchStrategy(tmp_path / "model", micro_batch_size=2)
    batch = ragged_batch(1)
    torch.testing.assert_close(
        exported.logprobs(batch), strategy.logprobs(batch), atol=1e-5, rtol=0
    )
    with pytest.raises(ValueError, match=r"adapts the output layer, which this model ties"):
        TorchStrategy(tied_dir, lora=LoraSettings(("q_proj", "lm_head"), RANK, RANK))


@pytest.mark.parametrize("name", ["megatron_train", "fsdp2_train"])
def test_megatron_and_fsdp2_name_the_torch_strategy(name: str, tmp_path: Path) -> None:
    lora = LoraSettings(("all-linear",), 8, 16)
    with pytest.raises(ValueError, match=r"LoRA is built on the torch strategy only; set "):
        build_strategy(name, tmp_path / "no-model", {}, lora=lora)


# ROLL's keys: the schema, the config check, ROLL's LoRA file ----------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor_train.model_args.lora_target=all-embedding"],
            r"actor_train.model_args.lora_target='all-embedding': 'all-embedding': LoRA on emb",
        ),
        (
            ["actor_train.model_args.lora_rank=16"],
            r"actor_train.model_args sets \{'lora_rank': 16\} without lora_target: they apply",
        ),
        (
            ["++critic.model_args.lora_target=all-linear"],
            r"critic.model_args.lora_target='all-linear': LoRA trains actor_train's policy",
        ),
        (
            ["strategy=megatron", "actor_train.model_args.lora_target=all-linear"],
            r"with strategy_name='megatron_train': LoRA is built on the torch strategy only; set",
        ),
    ],
)
def test_the_config_check_names_what_lora_cannot_do(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(composed(*overrides))


def test_rolls_keys_give_the_strategy_its_adapter() -> None:
    config = validate(
        composed(
            "actor_train.model_args.lora_target='q_proj, v_proj'",
            "++actor_train.model_args.lora_rank=4",
        )
    )
    settings = strategy_settings(config, Path("unused"), needs_reference=True)
    assert settings["lora"] == LoraSettings(("q_proj", "v_proj"), 4, 8)  # alpha: 2 × rank
    assert pickle.loads(pickle.dumps(settings)) == settings  # as a rank group sends them
    assert (
        strategy_settings(validate(composed()), Path("unused"), needs_reference=True)["lora"]
        is None
    )


def test_rolls_lora_file_keeps_actor_trains_keys_and_fits_the_torch_strategy_here() -> None:
    translation = translate(A + "agentic_val_sokoban_lora.yaml")
    config = translation.config
    model_args = config["actor_train"]["model_args"]
    assert (model_args["lora_target"], model_args["lora_rank"], model_args["lora_alpha"]) == (
        "all-linear",
        32,
        32,
    )
    assert not {"lora_target", "lora_rank", "lora_alpha"} & set(config["actor_infer"]["model_args"])
    assert (
        "actor_infer.model_args ['lora_alpha', 'lora_rank', 'lora_target'] dropped: the engines "
        "get actor_train's adapter merged into the weights (every backend serves them), not "
        "the adapter"
    ) in translation.notes
    # the file asks for megatron_train: one CPU process is one rank, the torch strategy's
    cpu = fit_to_machine(config, Machine(cuda=False, megatron=True, flash_attn=False))
    assert cpu.config["actor_train"]["strategy_args"] == {
        "strategy_name": "torch",
        "strategy_config": {},
    }
    (change,) = [c for c in cpu.changes if c.key == "actor_train.strategy_args.strategy_name"]
    assert change.why.startswith("one CPU process is one rank, and the torch strategy trains LoRA")
    # on GPUs the file keeps megatron_train, and the config check says what to set
    gpus = fit_to_machine(config, Machine(cuda=True, megatron=True, flash_attn=True))
    with pytest.raises(ConfigError, match=r"LoRA is built on the torch strategy only; set act"):
        validate(gpus.config)


def test_a_lora_run_checkpoints_its_adapter_and_its_export_evaluates_as_it_validated(
    tmp_path: Path,
) -> None:
    # as test_train_e2e's full fine-tuning run: eval reads the run's saved config and,
    # with seeded HF generation, the merged export scores what the run's last validation
    # said (the engines validated on the same merged weights)
    cache, output = tmp_path / "cache", tmp_path / "run"
    lora = ("actor_train.model_args.lora_target=all-linear", "actor_train.model_args.lora_rank=4")
    overrides = ("generation=hf", "val_batch_size=6", "val_env_manager.env_groups=6", *lora)
    train(output, cache, *overrides)
    last = validation(output)[4]
    checkpoint = output / "checkpoints" / "checkpoint-4"
    adapter = load_file(checkpoint / ADAPTER_DIR / "adapter_model.safetensors")
    assert sum(t.numel() for t in adapter.values()) == TRAINABLE
    assert metrics(output)[4]["actor/grad_norm"] > 0
    result = run_python(
        ["-m", "agentgym.eval", f"model.path={output}", "generation=hf",
         f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "checkpoint-4/model" in result.stdout
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())["metrics"]
    assert report["all/trajectories"] == 6.0
    for key in ("all/success", "all/score", "all/turns", "all/invalid_action_rate"):
        assert report[key] == pytest.approx(last[f"val/{key}"], abs=1e-9), key
