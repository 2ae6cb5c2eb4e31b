"""Every agentic example file of ROLL runs by one rule: it trains 2 steps, or stops before
any model work with a named error (the table below is today's state).

tests/data/roll_examples/ holds ROLL's files as they are, each with its source path,
commit and license line on top (ROLL's ``examples/qwen2.5-0.5B-agentic/``,
``examples/qwen2.5-7B-agentic_megatron/`` and the ``config/*.yaml`` their
``defaults:`` include, in ROLL's layout so that ``../config/...`` resolves). ROLL's
``qwen2.5-0.5B-agentic/agentic_val_webshop.yaml`` is empty (0 bytes) at that commit:
there is nothing to run, so it is not copied. ``examples/agentic_demo/`` is copied too;
its Atropos file includes ``config/deepspeed_zero2.yaml``, which ROLL removed (7f9d4d38)
and which is copied from the commit before, so that the file composes as it did.

The rule (:func:`shrink`) changes only the model path, the log folders and the batch
sizes, and shrinks the shapes for a CPU: one env group of 2 per train tag, one of the
file's group size per validation tag, mini-batches of 2, 2 steps, sequence_length at
most the tiny model's 4096 positions, and ROLL's own ``max_tokens_per_step`` and
``max_actions_per_traj`` at 16 tokens and 3 turns, and ``drop_zero_variance_groups``
off (the random tiny model scores a group alike, which would leave no sample to
update on). Generation runs on the transformers
backend (``actor_infer.strategy_args.strategy_name=hf``): vLLM's start on a CPU would
double each run (59 s against 26 s on the 2-core machine); what the files ask of vLLM
(a strategy_config) is read by the schema either way. A file whose env plays on a server
(:data:`SERVED`: ROLL's ``sokoban_sandbox``, whose ``env_config.base_url`` is ROLL's ROCK
service) gets one more override: ``base_url`` pointed at an agentgym env server of
``sokoban`` that the test starts (docs/http_envs.md).

ROLL's ``examples/qwen3_agentic_gem/`` (GEM's envs) name hub datasets: the rule points
each ``dataset_name`` at a local stand-in with the hub dataset's columns
(tests/data/gem/, :data:`GEM_LOCAL`), and gives a search tool the corpus its retrieval
server would serve (``tool_args.corpus``, searched in process), as a machine without the
hub must.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from agentgym.choices import ROLL_PG_VARIANTS
from agentgym.envs.http.server import EnvServer, EnvServerThread, env_config_kwargs
from agentgym.errors import ConfigError
from agentgym.formats.roll import Translation, from_roll, interpolated_keys
from agentgym.formats.roll_training import PG_VARIANT_KEYS
from agentgym.train import check
from tests.envs.trainrun import run_python

EXAMPLES = Path(__file__).parent / "data" / "roll_examples"
TINY_POSITIONS = 4096

A = "qwen2.5-0.5B-agentic/"
M = "qwen2.5-7B-agentic_megatron/"
D = "agentic_demo/"
G = "qwen3_agentic_gem/"
TRAINS = None
TOOL_ENVS = (
    "agentgym's tool envs (env=mcp_tools: the tools of an MCP server you start; env=sql, "
    "env=math_tool: commands in agentgym's sandbox), or your env as an agentgym env "
    "(CONTRIBUTING.md); agent-native envs: env=sokoban_native agent=native "
    "(docs/native_envs.md)"
)
ROCK = (
    "custom_envs.{tag}.env_type='rock_tb_native_env' needs ROLL's ROCK sandbox service (a "
    "ROCK server at env_config.sandbox_base_url running SWE-bench / terminal-bench containers "
    "and the iflow CLI agent), which agentgym neither runs nor speaks. Use " + TOOL_ENVS
)
EXPECTED: dict[str, str | None] = {
    A + "agent_val_frozen_lake.yaml": TRAINS,
    A + "agent_val_frozen_lake_amd.yaml": TRAINS,
    A + "agent_val_frozen_lake_async.yaml": TRAINS,
    A + "agent_val_frozen_lake_async_amd.yaml": TRAINS,
    A + "agentic_val_sokoban.yaml": TRAINS,
    M + "agentic_val_webshop.yaml": TRAINS,
    M + "agentic_val_webshop_amd.yaml": TRAINS,
    A + "agent_val_frozen_lake_gigpo.yaml": TRAINS,
    A + "agentic_val_sokoban_gigpo.yaml": TRAINS,
    M + "agentic_val_webshop_gigpo.yaml": TRAINS,
    A + "agent_val_frozen_lake-pg_var.yaml": TRAINS,
    A + "agent_val_frozen_lake-pg_var_is_correct.yaml": TRAINS,
    A + "agentic_val_sokoban_dynamic_batching.yaml": TRAINS,
    A + "agentic_val_sokoban_lora.yaml": TRAINS,
    A + "agentic_val_sokoban_agent_runner.yaml": TRAINS,  # through the proxy (agent=proxy)
    A + "agentic_sokoban_rollout_mock_dump.yaml": TRAINS,  # each step's batch dumped
    A + "agentic_val_sokoban_sandbox.yaml": TRAINS,  # on an env server (SERVED)
    D + "agent_val_sokoban_sandbox.yaml": TRAINS,  # on an env server (SERVED)
    # GEM's envs (env=gem), with local stand-ins for the hub data (GEM_LOCAL)
    G + "gem_game_guess_the_number.yaml": TRAINS,
    G + "gem_rg_letter_counting.yaml": TRAINS,
    G + "gem_math_dapo.yaml": TRAINS,
    G + "gem_math_dapo_python_code.yaml": TRAINS,  # python_code in agentgym's sandbox
    G + "gem_math_hotpotqa.yaml": TRAINS,
    G + "gem_math_hotpotqa_search.yaml": TRAINS,  # search over a local corpus
    # ROLL's own envs and tools
    A + "agentic_val_sokoban_native.yaml": TRAINS,  # agent=native, step_reinforce
    A + "agentic_rollout_sokoban.yaml": (
        "this ROLL file has no actor_train: it configures ROLL's rollout pipeline "
        "(examples/start_agentic_rollout_pipeline.py), which plays and dumps episodes and "
        "trains nothing. Here that is python -m agentgym.eval env=<env> model.path=<model> "
        "rollout_dump_dir=<dir> (agentgym's keys)"
    ),
    # ROLL's agentic demos: frozen lake on one node and on two (fitted to this machine)
    D + "agent_val_frozen_lake_single_node_demo.yaml": TRAINS,
    D + "agent_val_frozen_lake_multi_nodes_demo.yaml": TRAINS,
    D + "agent_rollout_rock_swe.yaml": ROCK.format(tag="swebench_native_verified"),
    D + "agent_val_rock_swe.yaml": ROCK.format(tag="RockTBNativeEnvTrain"),
    D + "agent_val_rock_swe_qwen35_2b.yaml": ROCK.format(tag="RockTBNativeEnvTrain"),
    D + "atropos_gsm8k_grpo_qwen25_0.5b.yaml": (
        "custom_envs.AtroposGSM8KTrain.env_type='atropos_env' needs an Atropos environment "
        "server (NousResearch's atropos, env_config.atropos_env_path served by its API), which "
        "agentgym neither runs nor speaks. For GSM8K-style math use env=math_workflow (task "
        "sets from local JSONL or Parquet) or env=math_tool"
    ),
    D + "openreward_endless_terminals_reinforce_qwen35_2b.yaml": (
        "custom_envs.OpenRewardEndlessTerminalsTrain.env_type='openreward_env' needs the "
        "OpenReward environment service (env_config.environment_name, reached over the "
        f"network), which agentgym neither runs nor speaks. Use {TOOL_ENVS}"
    ),
}
"""Each file → None (trains 2 steps) or the exact error it stops with today."""

SERVED = {
    A + "agentic_val_sokoban_sandbox.yaml": "SokobanSandbox",
    D + "agent_val_sokoban_sandbox.yaml": "SokobanSandbox",
}
"""Files whose env plays on an env server → their tag: the test starts the server."""
GEM_DATA = Path(__file__).parent / "data" / "gem"
GEM_LOCAL = {
    "open-r1/DAPO-Math-17k-Processed": GEM_DATA / "dapo_math.jsonl",
    "axon-rl/HotpotQA": GEM_DATA / "hotpotqa.jsonl",
}
"""Hub datasets of ROLL's GEM files → their local stand-ins (tests/data/gem/README.md)."""
GEM_CORPUS = GEM_DATA / "wiki_corpus.jsonl"
"""The retrieval server's corpus, searched in process (a search tool's ``corpus``)."""


def composed(name: str, overrides: list[str] | None = None) -> DictConfig:
    path = EXAMPLES / name
    with initialize_config_dir(str(path.parent), version_base=None):
        return compose(path.stem, overrides=overrides or [])


def shrink(cfg: DictConfig, out: Path, model: Path) -> list[str]:
    """The one rule's overrides for a composed ROLL file (see the module docstring)."""
    raw: dict[str, Any] = OmegaConf.to_container(cfg, resolve=False)  # type: ignore[assignment]
    overrides = [
        f"++pretrain={model}",
        "++actor_infer.strategy_args.strategy_name=hf",
        f"++output_dir={out}",
        f"++logging_dir={out}/logs",
        "++max_steps=2",
        "++drop_zero_variance_groups=false",
        "++max_tokens_per_step=16",
        "++max_actions_per_traj=3",
    ]
    if "render_save_dir" in raw:
        overrides.append(f"++render_save_dir={out}/render")
    if "log_dir" in (raw.get("tracker_kwargs") or {}):
        overrides.append(f"++tracker_kwargs.log_dir={out}/tracker")
    if isinstance(raw.get("sequence_length"), int):
        overrides.append(f"++sequence_length={min(raw['sequence_length'], TINY_POSITIONS)}")
    train = raw.get("train_env_manager") or {}
    tags = len(train.get("tags", []))
    overrides += [
        f"++train_env_manager.num_env_groups={tags}",
        f"++train_env_manager.num_groups_partition={[1] * tags}",
        "++train_env_manager.group_size=2",
        f"++rollout_batch_size={2 * tags}",
    ]
    val = raw.get("val_env_manager")
    if val:
        tags, size = len(val.get("tags", [])), val.get("group_size", 1)
        overrides += [
            f"++val_env_manager.num_env_groups={tags}",
            f"++val_env_manager.num_groups_partition={[1] * tags}",
            f"++val_batch_size={tags * size}",
        ]
    if "actor_train" in raw:
        overrides += [
            "++actor_train.training_args.per_device_train_batch_size=2",
            "++actor_train.training_args.gradient_accumulation_steps=1",
        ]
    return overrides + local_data(raw)


def local_data(node: Any, path: str = "") -> list[str]:
    """The rule's local data: each hub ``dataset_name`` of :data:`GEM_LOCAL` pointed at its
    file, and each search tool's retrieval server given :data:`GEM_CORPUS` (its corpus)."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "dataset_name" and value in GEM_LOCAL:
                found.append(f"++{where}={GEM_LOCAL[value]}")
            elif key == "tool_configs":
                found += [
                    f"++{where}.{i}.tool_args.corpus={GEM_CORPUS}"
                    for i, tool in enumerate(value)
                    if tool.get("tool_id") == "search"
                ]
            else:
                found += local_data(value, where)
    return found


def test_the_table_holds_every_copied_file() -> None:
    files = [*EXAMPLES.glob("qwen*/*.yaml"), *EXAMPLES.glob(D + "*.yaml")]
    copied = {str(p.relative_to(EXAMPLES)) for p in files}
    assert copied == set(EXPECTED)
    for path in EXAMPLES.rglob("*.yaml"):
        source, license_line = path.read_text().splitlines()[:2]
        assert source.startswith("# alibaba/ROLL examples/") and " at " in source, path
        assert license_line == "# Apache-2.0, Copyright Alibaba", path


@pytest.mark.parametrize("name", [n for n, error in EXPECTED.items() if error is not TRAINS])
def test_a_file_that_cannot_train_yet_stops_before_model_work_naming_why(
    name: str, tmp_path: Path
) -> None:
    cfg = composed(name, shrink(composed(name), tmp_path, tmp_path / "model"))
    with pytest.raises(ConfigError) as error:
        check(cfg)  # the run's first step: nothing is built before it passes
    assert str(error.value) == EXPECTED[name]


TRAINING = [n for n, error in EXPECTED.items() if error is TRAINS]


def train_file(name: str, root: Path, overrides: list[str]) -> tuple[Path, str | None]:
    """Train ``name`` two steps in ``root`` with ``overrides`` (:func:`shrink`'s); its
    output folder and, on failure, stderr."""
    root.mkdir(parents=True)
    out = root / "run"
    path = EXAMPLES / name
    result = run_python(
        ["-m", "agentgym.train", "--config-path", str(path.parent), "--config-name", path.stem,
         *overrides],
        cwd=root,
    )  # fmt: skip
    return out, (None if result.returncode == 0 else result.stderr[-4000:])


@pytest.fixture(scope="module")
def trained(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, str | None]]:
    """Every file that trains, two runs at a time (each is a separate process; most
    of a run is one core's Python, so two share the machine's two cores well)."""
    root = tmp_path_factory.mktemp("roll-examples")
    overrides = {  # composed here: Hydra's global state is not for threads
        name: shrink(composed(name), root / f"{i}" / "run", tiny_model_dir)
        for i, name in enumerate(TRAINING)
    }
    server = EnvServerThread(EnvServer("sokoban", env_config_kwargs("sokoban")))
    for name, tag in SERVED.items():
        overrides[name].append(f"++custom_envs.{tag}.env_config.base_url={server.url}")
    with server, ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(train_file, name, root / f"{i}", overrides[name])
            for i, name in enumerate(TRAINING)
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINING)
def test_a_file_trains_two_steps(name: str, trained: dict[str, tuple[Path, str | None]]) -> None:
    out, failure = trained[name]
    assert failure is None, failure
    lines = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").open()]
    assert {line["step"] for line in lines if "train/all/trajectories" in line} == {1, 2}
    assert [line["step"] for line in lines if "actor/loss" in line] == [1, 2]  # both updated
    # the run folder records what ran: the translation's notes and the fitting table
    meta = json.loads((out / "meta.json").read_text())
    assert meta["backend"] == "hf" and meta["engine"].startswith("transformers ")
    assert any(note.startswith("ROLL config: ") for note in meta["notes"])
    assert any(note.startswith("machine fitting") for note in meta["notes"]), meta["notes"]
    log = (out / "train.log").read_text()
    assert all(note in log for note in meta["notes"]) and "== resolved config ==" in log
    if "rollout_mock_dump" in name:  # its dump_dir, relative to where it ran
        dump = out.parent / "output" / "rollout_dumps" / "baseline_v1"
        assert sorted(p.name for p in dump.glob("step_*.pkl")) == [
            "step_000001.pkl", "step_000002.pkl",
        ]  # fmt: skip
    if name in SERVED:  # played on the server, none failed
        played = [line for line in lines if f"train/{SERVED[name]}/failed" in line]
        assert [line[f"train/{SERVED[name]}/failed"] for line in played] == [0.0, 0.0]
    proxied = [line for line in lines if "train/proxy/requests" in line]
    assert bool(proxied) == ("agent_runner" in name)  # ProxyEnvManager: through the proxy
    assert all(line["train/proxy/requests"] >= 1 for line in proxied)


VARIANT_METRICS = {
    "vanilla": set(),
    "ppo": {"actor/clipfrac", "actor/clipfrac_low", "actor/clipfrac_high"},
    "tis": {"actor/tis_lower_clipfrac", "actor/tis_upper_clipfrac", "actor/tis_weight_mean"},
    "topr": {"actor/topr_positive_frac", "actor/topr_negative_clipfrac"},
    "cispo": {
        "actor/cispo_lower_clipfrac",
        "actor/cispo_upper_clipfrac",
        "actor/cispo_weight_mean",
    },
    "kimi15": {"actor/kimi15_reg"},
}
"""The metrics only each variant's loss reports: their presence says which loss trained."""


@pytest.mark.slow
@pytest.mark.parametrize("variant", ROLL_PG_VARIANTS)
def test_each_pg_variant_trains_two_steps_from_rolls_pg_var_file(
    variant: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    # In this process, on the torch strategy (the file's megatron_train runs it above, as
    # a subprocess): the loss is what differs between variants, not the strategy.
    from agentgym.builders.train import build_train
    from agentgym.trainers.grpo import train

    name = A + "agent_val_frozen_lake-pg_var.yaml"
    out = tmp_path / "run"
    overrides = [
        *shrink(composed(name), out, tiny_model_dir),
        f"actor_train.pg_variant={variant}",
        "actor_train.strategy_args.strategy_name=torch",
        "~actor_train.strategy_args.strategy_config",
        "eval_steps=0",
    ]
    config, resolved = check(composed(name, overrides))
    assert config.pg_variant == variant
    grpo, parts = build_train(config, resolved)
    train(grpo, parts)
    lines = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").open()]
    updates = [line for line in lines if "actor/loss" in line]
    assert [line["step"] for line in updates] == [1, 2]
    every = set().union(*VARIANT_METRICS.values())
    for line in updates:
        assert every & set(line) == VARIANT_METRICS[variant]
        assert math.isfinite(line["actor/loss"]) and math.isfinite(line["actor/grad_norm"])


# The translation pieces these files need, on the files themselves ------------------------


def translate(name: str, *overrides: str) -> Translation:
    cfg = composed(name, ["pretrain=null", *overrides])
    resolved: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    return from_roll(resolved, helpers=interpolated_keys(cfg))


def test_interpolated_keys_are_the_roots_of_key_paths_not_resolvers() -> None:
    unresolved = {
        "a": "${custom_env.SimpleSokoban}",
        "b": ["x ${max_steps} y ${oc.env:HOME,.}", {"c": "${rows[0]}"}],
        "d": "${.relative}",
    }
    assert interpolated_keys(unresolved) == {"custom_env", "max_steps", "rows"}


def test_a_helper_variable_is_dropped_with_a_note_and_its_value_read() -> None:
    translation = translate(A + "agentic_val_sokoban_gigpo.yaml")
    assert "default_history_length" not in translation.config
    assert (
        "default_history_length=5 dropped: a helper variable, read through "
        "${default_history_length} interpolations (resolved above)"
    ) in translation.notes
    assert translation.config["history_length"] == 5  # each entry's history_length
    assert "custom_envs.*.history_length → history_length=5" in translation.notes
    # a top-level key that no interpolation reads is not a helper: the schema names it
    typo = translate(A + "agentic_val_sokoban_gigpo.yaml", "++default_history_lenght=5")
    assert typo.config["default_history_lenght"] == 5


def test_gigpo_is_grpo_with_the_anchor_state_step_term() -> None:
    translation = translate(M + "agentic_val_webshop_gigpo.yaml")
    config = translation.config
    assert (config["adv_estimator"], config["rollout_mode"]) == ("grpo", "step")
    assert (config["step_advantage_weight"], config["step_gamma"]) == (1.0, 0.95)
    assert not {"batch_adjust_mode", "episode_reward_weight", "step_reward_weight"} & set(config)
    with pytest.raises(ConfigError, match=r"episode_reward_weight=2.0: here GiGPO's episode"):
        translate(A + "agentic_val_sokoban_gigpo.yaml", "episode_reward_weight=2.0")
    with pytest.raises(ConfigError, match=r"\['step_reward_gamma'\] only apply with adv_est"):
        translate(A + "agentic_val_sokoban.yaml", "++step_reward_gamma=0.9")


def test_the_pg_worker_gives_pg_variant_and_its_knobs_as_top_level_keys() -> None:
    name = A + "agent_val_frozen_lake-pg_var.yaml"
    translation = translate(name, "++actor_train.topr_negative_weight=0.5")
    config = translation.config
    assert (config["pg_variant"], config["topr_negative_weight"]) == ("topr", 0.5)
    assert not {"worker_cls", "pg_variant", "topr_negative_weight"} & set(config["actor_train"])
    assert (
        translation.notes.count(
            "actor_train.worker_cls=...agentic_actor_pg_worker.ActorWorker → pg_variant=topr; "
            "actor_train's topr_negative_weight=0.5 → top-level keys"
        )
        == 1
    )
    assert translate(name, "~actor_train.pg_variant").config["pg_variant"] == "vanilla"  # ROLL's
    with pytest.raises(ConfigError, match=r"pg_variant='cispoo' is not valid. Did you mean 'ci"):
        translate(name, "actor_train.pg_variant=cispoo")
    with pytest.raises(ConfigError, match=r"sets \['pg_variant'\], which only ROLL's pg worker"):
        translate(name, "~actor_train.worker_cls")
    with pytest.raises(ConfigError, match=r"worker_cls='my.Worker' has no counterpart here"):
        translate(name, "actor_train.worker_cls=my.Worker")
    with pytest.raises(ConfigError, match=r"sets \['topr_positive_weight'\], which only ROLL"):
        translate(A + "agentic_val_sokoban.yaml", "++actor_train.topr_positive_weight=2.0")


def test_the_translated_knobs_are_the_pg_variants_keyword_arguments() -> None:
    from agentgym.trainers.pg_variants import PG_VARIANT_KNOBS

    trinity = {"opmd_tau", "topr_advantage_threshold"}  # Trinity-RFT's knobs, not ROLL's
    knobs = {key for name, keys in PG_VARIANT_KNOBS.items() if name != "ppo" for key in keys}
    assert knobs - trinity == set(PG_VARIANT_KEYS)


def test_per_role_system_envs_join_the_top_level_ones() -> None:
    name = A + "agentic_val_sokoban.yaml"
    translation = translate(name, "++actor_train.system_envs.NVTE_FUSED_ATTN='0'")
    assert translation.config["system_envs"] == {"USE_MODELSCOPE": "1", "NVTE_FUSED_ATTN": "0"}
    assert "system_envs" not in translation.config["actor_train"]
    assert "actor_train.system_envs ['NVTE_FUSED_ATTN'] → system_envs (every process here)" in (
        translation.notes
    )
    with pytest.raises(ConfigError, match=r"reference.system_envs.USE_MODELSCOPE='0', but sys"):
        translate(name, "++reference.system_envs.USE_MODELSCOPE='0'")


def test_dynamic_batching_keys_stay_on_their_roles_and_the_reference_runs_on_actor_train() -> None:
    name = A + "agentic_val_sokoban_dynamic_batching.yaml"
    translation = translate(name)
    actor, reference = translation.config["actor_train"], translation.config["reference"]
    assert (
        actor["use_dynamic_batching_in_train"],
        actor["max_tokens_per_microbatch_in_train"],
        actor["sequence_length_round_in_train"],
        actor["max_tokens_per_microbatch_in_infer"],
    ) == (True, 8192, 128, 16384)
    assert reference["max_tokens_per_microbatch_in_infer"] == 16384
    assert (
        "reference.strategy_args.strategy_name=megatron_infer: the reference runs forward "
        "passes in actor_train's ranks on its strategy (megatron_train)"
    ) in translation.notes
    # with its switch off, ROLL ignores a budget: so does the translation, with a note
    off = translate(name, "actor_train.use_dynamic_batching_in_train=false")
    assert "max_tokens_per_microbatch_in_train" not in off.config["actor_train"]
    assert (
        "actor_train.max_tokens_per_microbatch_in_train=8192 dropped: ROLL reads it only with "
        "use_dynamic_batching_in_train on"
    ) in off.notes


def test_old_logprobs_recompute_is_the_trainers_old_logprobs() -> None:
    translation = translate(A + "agent_val_frozen_lake-pg_var_is_correct.yaml")
    assert translation.config["old_logprobs"] == "trainer"
    assert "enable_old_logprobs_recompute" not in translation.config


def test_the_native_env_manager_is_agent_native_with_step_reinforce() -> None:
    translation = translate(A + "agentic_val_sokoban_native.yaml")
    config = translation.config
    assert (config["agent"]["kind"], config["rollout_mode"]) == ("native", "step")
    assert (config["adv_estimator"], config["step_score"], config["step_gamma"]) == (
        "step_reinforce", "return", 1.0,
    )  # fmt: skip
    assert (config["step_advantage_weight"], config["old_logprobs"]) == (0.0, "trainer")
    assert config["reward_normalization"] == {
        "grouping": "state", "norm_mean_type": "group", "norm_std_type": "batch",
        "method": "identity",
    }  # fmt: skip
    tags = config["train_env_manager"]["env_configs"]["SokobanNativeEnv"]
    assert tags == {"name": "sokoban_native", "kwargs": {"max_steps": 10, "format_penalty": -0.15}}
    with pytest.raises(ConfigError, match=r"\['train_env_manager SimpleSokoban'\] use another env"):
        translate(
            A + "agentic_val_sokoban_native.yaml",
            "train_env_manager.tags=[SokobanNativeEnv,SimpleSokoban]",
            "train_env_manager.num_groups_partition=[64,64]",
        )


def test_a_gem_entry_is_env_gem_with_its_tool_wrapper_templates_and_local_data() -> None:
    name = G + "gem_math_dapo_python_code.yaml"
    translation = translate(name, *local_data(OmegaConf.to_container(composed(name))))
    env = translation.config["train_env_manager"]["env_configs"]["dapo_17k_with_python_code"]
    assert env["name"] == "gem"
    kwargs = env["kwargs"]
    assert (kwargs["env_id"], kwargs["dataset_name"]) == ("roll_math", str(GEM_LOCAL[
        "open-r1/DAPO-Math-17k-Processed"]))  # fmt: skip
    assert (kwargs["question_key"], kwargs["answer_key"]) == ("prompt", "solution")
    assert kwargs["tool_wrapper"]["wrapper_args"]["max_tool_uses"] == 1
    assert kwargs["tool_wrapper"]["tool_configs"][0]["tool_id"] == "python_code"
    assert kwargs["instructions"].startswith("Please reason step by step")
    assert kwargs["observation_template"].startswith("{observation}\nEnsure that your response")
    generating = translation.config["actor_infer"]["generating_args"]
    assert generating["stop_strings"] == ["</code>"]
    assert not {"gem_math", "math_agent_template"} & set(translation.config)
    rg = translate(G + "gem_rg_letter_counting.yaml")
    assert rg.config["rollout_mode"] == "step"  # StepConcatEnvManager
    assert rg.config["actor_infer"]["generating_args"]["top_k"] == -1  # the schema reads it as 0
    assert "default_history_length=1 dropped: no custom_envs entry reads it" in rg.notes
