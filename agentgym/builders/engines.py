"""The generation backend: one engine in this process, an OpenAI-compatible server, or
engine actors behind a router on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym.cluster import Cluster, device_type
from agentgym.library_logging import LIBRARY_LOG_FILE, redirect_output
from agentgym.rollout.backends import GenerationBackend, make_backend
from agentgym.rollout.engines import spawn_engines
from agentgym.rollout.limits import RequestCap
from agentgym.rollout.router import Router
from agentgym.schema import TrainConfig


def generation_backend(
    config: TrainConfig,
    path: Path,
    *,
    dtype: str,
    device: str,
    sync_dir: Path | None = None,
    cluster: Cluster | None = None,
) -> GenerationBackend:
    """The generation backend for the policy at ``path`` (``sync_dir``: where weights
    for a server are written, which it must be able to read).

    On a Ray cluster, ``actor_infer``'s engines (one per ``num_gpus_per_worker``
    devices of its ``device_mapping``) run as actors behind a :class:`Router`; an
    OpenAI-compatible server is reached from the driver. ``max_running_requests``
    caps the requests in flight to each engine.
    """
    generation = config.generation
    per_request_seed = generation.per_request_seed
    if per_request_seed is None:
        import torch

        per_request_seed = torch.cuda.is_available()
    name = config.backend_name
    settings: dict[str, Any] = {
        "dtype": dtype,
        "device": device,
        "max_model_len": config.sequence_length,
        "max_batch_size": generation.max_batch_size,
    }
    if name == "vllm":
        settings["engine_options"] = vllm_options(config)
    cap = config.max_running_requests
    if cluster is None or cluster.kind == "local" or name == "openai":
        if device_type(device) == "cuda":  # the engine's GPUs: those this process sees
            settings["tensor_parallel_size"] = config.actor_infer.num_gpus_per_worker
        backend = make_backend(
            name,
            str(path),
            **settings,
            seed=config.seed,
            base_url=generation.base_url,
            served_model_name=generation.served_model_name,
            per_request_seed=per_request_seed,
            weight_sync_dir=str(sync_dir) if sync_dir is not None else None,
        )
        return backend if cap is None else RequestCap(backend, cap)
    engines = config.placement.workers["actor_infer"]
    if engines[0].gpu:  # each engine's GPUs: one model split over them
        settings["tensor_parallel_size"] = config.actor_infer.num_gpus_per_worker
    clients = spawn_engines(
        cluster,
        len(engines),
        name,
        str(path),
        nodes=[engine.node for engine in engines],
        visible_devices=[engine.visible_devices if engine.gpu else None for engine in engines],
        gpu=engines[0].gpu,
        seeds=[config.seed + 1000 * engine.rank for engine in engines],
        **settings,
    )
    return Router(clients, share=cluster.share, max_running_requests=cap)


def vllm_options(config: TrainConfig) -> dict[str, Any]:
    """``actor_infer.strategy_args.strategy_config``: vLLM's engine arguments (ROLL's
    ``gpu_memory_utilization``, ``block_size``, ``load_format``, ...; each engine keeps
    those vLLM takes, :func:`~agentgym.rollout.backends.vllm.engine_arguments`). An
    engine that shares its GPUs with the trainer takes at most half of each (ROLL's
    share assumes its engines sleep while the trainer works; these stay resident)."""
    options = dict(config.actor_infer.strategy_args.strategy_config or {})
    share = options.get("gpu_memory_utilization")
    if share is not None and float(share) > COLOCATED_SHARE and config.colocated:
        print(
            f"actor_infer.strategy_args.strategy_config.gpu_memory_utilization={share}: the "
            "engines share their GPUs with the trainer and stay resident (nothing sleeps "
            f"here); they take {COLOCATED_SHARE}",
            flush=True,
        )
        options["gpu_memory_utilization"] = COLOCATED_SHARE
    return options


COLOCATED_SHARE = 0.5
"""The GPU memory share of an engine beside the trainer (nothing is offloaded)."""


def run_engines(
    config: TrainConfig, path: Path, output_dir: Path, workers: Cluster
) -> GenerationBackend:
    """The run's generation backend for ``path``, an engine process's own output in the
    run's library log."""
    with redirect_output(output_dir / LIBRARY_LOG_FILE):
        return generation_backend(
            config,
            path,
            dtype=config.actor_infer.model_args.dtype,
            device=config.model.device,
            sync_dir=output_dir,
            cluster=workers,
        )
