"""The FSDP2 strategy against the single-process torch strategy: three GRPO updates
(6 micro-batches each, dealt unevenly over the ranks) give the same metrics,
log-probabilities and weights (1e-5 relative) on 2 and 4 gloo ranks, fully and
hybrid sharded, with reshard_after_forward on and off and CPU offload; each rank
holds 1/N of the parameters, gradients and optimizer state; a sharded checkpoint
resumes exactly on the same, a larger and a smaller number of ranks; the Hugging
Face folder it writes evaluates as the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from agentgym.errors import ConfigError
from agentgym.trainers.strategies import build_strategy
from agentgym.trainers.strategies.fsdp2.checkpoint import write_hf_folder
from agentgym.trainers.strategies.hf_folder import SAFE_INDEX, load_weights, read_weights
from agentgym.trainers.strategies.torch_strategy import TorchStrategy
from tests.trainers.fsdp2.ranks import CONFIGS, SETTINGS, after_one_step, every_config, steps
from tests.trainers.megatron.launch import model_dir, spawn
from tests.trainers.test_update_path import ragged_batch

MASK = ragged_batch(7).attention_mask  # logprobs on padding depend on the micro-batch width


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_dir(tmp_path_factory.mktemp("fsdp2-model"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fsdp2-checkpoints")


@pytest.fixture(scope="module")
def torch_run(qwen_dir: Path) -> Any:
    return steps(TorchStrategy(qwen_dir, **SETTINGS))


@pytest.fixture(scope="module")
def tied_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tied_dir(tmp_path_factory.mktemp("fsdp2-tied"))


@pytest.fixture(scope="module")
def ranks(qwen_dir: Path, checkpoints: Path, tied_folder: Path) -> dict[int, Any]:
    """Every config of 2 ranks, then of 4 (which also resume the 2 ranks' checkpoint);
    both also train the tied model."""
    two = spawn(2, every_config, qwen_dir, checkpoints / "two", None, tied_folder)
    four = spawn(4, every_config, qwen_dir, checkpoints / "four", checkpoints / "two", tied_folder)
    return {2: two, 4: four}


@pytest.fixture
def one_process() -> Iterator[None]:
    """The strategy joins a process group of one; leave none behind."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def assert_same_run(first: Any, second: Any) -> None:
    for one, two in zip(first[0], second[0], strict=True):
        assert one.keys() == two.keys()
        for key in one:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(second[1] * MASK, first[1] * MASK, rtol=1e-5, atol=1e-6)
    assert first[2].keys() == second[2].keys()
    for name, tensor in first[2].items():
        torch.testing.assert_close(second[2][name], tensor, rtol=1e-5, atol=1e-6)


def tail(run: Any) -> Any:
    """Steps 2 and 3 of a three-step run."""
    return run[0][1:], run[1], run[2]


@pytest.mark.parametrize(
    ("world", "name"), [(world, name) for world, configs in CONFIGS.items() for name in configs]
)
def test_three_updates_equal_the_torch_strategy(
    qwen_dir: Path, torch_run: Any, ranks: dict[int, Any], world: int, name: str
) -> None:
    run = ranks[world]["runs"][name]
    assert_same_run(torch_run, run)
    initial = dict(TorchStrategy(qwen_dir, **SETTINGS).export_weights())
    assert all(not torch.equal(run[2][key], initial[key]) for key in initial)  # all moved


def test_each_rank_holds_one_nth(qwen_dir: Path, ranks: dict[int, Any]) -> None:
    whole = after_one_step(TorchStrategy(qwen_dir, **SETTINGS))
    model = TorchStrategy(qwen_dir, **SETTINGS).model
    rows = sum(p[0].numel() * p.element_size() for p in model.parameters())
    steps_bytes = 4 * len(list(model.parameters()))  # Adam's step counters: not sharded
    for world in (2, 4):
        for rank, held in enumerate(ranks[world]["memory"]):
            for kind, size in held.items():
                slack = rows + (steps_bytes if kind == "optimizer" else 0)  # a padding row each
                assert abs(size - whole[kind] / world) <= slack, (world, rank, kind, size, whole)
                assert size < whole[kind] / world * 1.1


def test_only_rank_0_reads_the_checkpoint(ranks: dict[int, Any]) -> None:
    # the others build with meta parameters and receive their shards by broadcast (the
    # equal runs above check what they received); under CPU offload every rank reads
    for world in (2, 4):
        reads = ranks[world]["reads"]
        assert reads["sharded"] == [1] + [0] * (world - 1)
        assert reads["offload"] == [1] * world


def test_tied_embeddings_stay_one_parameter_on_every_rank(
    tied_folder: Path, ranks: dict[int, Any]
) -> None:
    # ranks other than 0 receive the tied weight once; a second, untied copy would be
    # an extra optimizer parameter that the checkpoint's state dict cannot name
    reference = steps(TorchStrategy(tied_folder, **SETTINGS), (1, 2))
    for world in (2, 4):
        tied = ranks[world]["tied"]
        assert_same_run(reference, tied["run"])
        first = tied["ranks"][0]
        assert first["tied"] and first["optimized"] == first["parameters"]
        assert tied["ranks"] == [first] * world


def test_the_reference_is_sharded_like_the_policy(qwen_dir: Path, ranks: dict[int, Any]) -> None:
    torch_reference = TorchStrategy(qwen_dir, **SETTINGS, reference_path=qwen_dir)
    expected = torch_reference.reference_logprobs(ragged_batch(7))
    parameters = list(torch_reference.model.parameters())  # the same model folder
    whole = sum(p.numel() * p.element_size() for p in parameters)
    rows = sum(p[0].numel() * p.element_size() for p in parameters)
    for world in (2, 4):
        reference = ranks[world]["reference"]  # rank 0's share
        torch.testing.assert_close(reference["logprobs"] * MASK, expected * MASK)
        assert abs(reference["bytes"] - whole / world) <= rows


def test_a_checkpoint_resumes_exactly_on_any_number_of_ranks(
    qwen_dir: Path, torch_run: Any, ranks: dict[int, Any], checkpoints: Path, one_process: None
) -> None:
    assert_same_run(tail(torch_run), ranks[2]["resumed"]["same"])
    assert_same_run(tail(torch_run), ranks[4]["resumed"]["same"])
    assert_same_run(tail(torch_run), ranks[4]["resumed"]["other"])  # written by 2 ranks
    alone = build_strategy("fsdp2_train", qwen_dir, {}, **SETTINGS)  # written by 4 ranks
    alone.load(checkpoints / "four")
    assert_same_run(tail(torch_run), steps(alone, (2, 3)))


def test_the_hugging_face_folder_evaluates_as_the_run(
    qwen_dir: Path, ranks: dict[int, Any], checkpoints: Path
) -> None:
    reference = TorchStrategy(qwen_dir, **SETTINGS)
    after_one = steps(reference, (1,))
    folder = checkpoints / "two" / "model"  # written by 2 ranks after step 1
    assert {"config.json", "model.safetensors"} <= {p.name for p in folder.iterdir()}
    exported = TorchStrategy(folder, **SETTINGS)
    for name, tensor in after_one[2].items():
        torch.testing.assert_close(read_weights(folder)[name], tensor, rtol=1e-5, atol=1e-6)
    got = exported.logprobs(ragged_batch(7))
    torch.testing.assert_close(got * MASK, after_one[1] * MASK, rtol=1e-5, atol=1e-6)


def tied_dir(path: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    source = model_dir(path / "source")
    config = AutoConfig.from_pretrained(source)
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path / "tied")
    return path / "tied"


def test_one_process_tied_embeddings_and_a_sharded_folder(
    tmp_path: Path, one_process: None
) -> None:
    folder = tied_dir(tmp_path)
    reference = steps(TorchStrategy(folder, **SETTINGS), (1, 2))
    strategy: Any = build_strategy(
        "fsdp2_train", folder, {"reshard_after_forward": False}, **SETTINGS
    )
    assert type(strategy).__name__ == "FSDP2Strategy"
    assert_same_run(reference, steps(strategy, (1, 2)))
    out = tmp_path / "export"
    write_hf_folder(strategy, out, shard_bytes=100_000)  # several files and their index
    assert (out / SAFE_INDEX).is_file() and len(list(out.glob("model-*.safetensors"))) > 1
    assert "lm_head.weight" not in read_weights(out)  # stored once, as Hugging Face does
    check = TorchStrategy(folder, **SETTINGS)
    load_weights(check.model, out, device="cpu")
    for name, tensor in reference[2].items():
        torch.testing.assert_close(check.model.state_dict()[name], tensor, rtol=1e-5, atol=1e-6)


def test_keys_it_cannot_honour_stop_before_model_work(tmp_path: Path) -> None:
    missing = tmp_path / "no-model"  # never read: the keys are checked first
    config = {
        "fsdp_size": 16,
        "apply_expert_patch": True,
        "apply_tiled_mlp": True,
        "wrap_policy": {"moe_experts": ["Qwen3MoeMLP"]},
        "reshard_after_froward": True,
    }
    with pytest.raises(ConfigError) as error:
        build_strategy("fsdp2_train", missing, config)
    message = str(error.value)
    for named in (
        "apply_expert_patch (ROLL's MoE patches",
        "apply_tiled_mlp (ROLL's tiled-MLP patch",
        "reshard_after_froward is not a key of it. Did you mean 'reshard_after_forward'?",
    ):
        assert named in message
    with pytest.raises(ConfigError, match=r"wrap_policy.moe_experts \(MoE expert units"):
        build_strategy("fsdp2_train", missing, {"wrap_policy": {"moe_experts": ["X"]}})
    with pytest.raises(ConfigError, match=r"param_dtype='bf61' is not a dtype"):
        build_strategy("fsdp2_train", missing, {"param_dtype": "bf61"})
    with pytest.raises(ValueError, match=r"deepspeed_train.*stage 2 -> reshard_after_forward"):
        build_strategy("deepspeed_train", missing, {})
