"""Running the items: the shared context, time budgets, the result rows and the table.

Each item is a function ``(context, deadline) -> figures`` (numbers, plus a few
strings such as the layout). It gets a share of what is left of ``--minutes``; it
stops repeating its measurement when the next repetition would pass its deadline
(it always makes one warm-up and one measured repetition). An item that raises gets
a row with its error, and the suite goes on.
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentgym.plan import ModelShape

from .models import Settings, model_folder, shape_of


class Deadline:
    """The wall-clock time an item should be done by."""

    def __init__(self, seconds: float) -> None:
        self.budget = seconds
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        """Seconds left (negative once passed)."""
        return self.end - time.perf_counter()


@dataclass
class Context:
    """What the items share: the settings, the model folders, the measured peak, and
    whether the train steps profile one more step (``--kernels``)."""

    settings: Settings
    work_dir: Path
    peak_tflops: float | None = None
    kernels: bool = False
    _shapes: dict[str, ModelShape] = field(default_factory=dict)

    def model(self, name: str) -> Path:
        """The model folder of shape ``name`` (built on first use)."""
        return model_folder(name, self.work_dir / "models", self.settings.device)

    def shape(self, name: str) -> ModelShape:
        """The shape ``name``'s dimensions."""
        if name not in self._shapes:
            self._shapes[name] = shape_of(name, self.work_dir / "models", self.settings.device)
        return self._shapes[name]

    def synchronize(self) -> None:
        """Wait for the device's queued work (timings read a host clock)."""
        if self.settings.device.startswith("cuda"):
            torch.cuda.synchronize()

    def release(self) -> None:
        """Free what the last item left on the device."""
        gc.collect()
        if self.settings.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def device_memory_gib(self) -> float:
        """The device's memory (on the CPU: the machine's)."""
        if self.settings.device.startswith("cuda"):
            return torch.cuda.get_device_properties(0).total_memory / 2**30
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def time_reps(
    fn: Callable[[], None], deadline: Deadline, max_reps: int, synchronize: Callable[[], None]
) -> list[float]:
    """Seconds of each measured call of ``fn``, after one warm-up call: at least one,
    at most ``max_reps``, and no more once the next would pass ``deadline``."""
    fn()
    synchronize()
    seconds: list[float] = []
    while True:
        started = time.perf_counter()
        fn()
        synchronize()
        seconds.append(time.perf_counter() - started)
        if len(seconds) >= max_reps or deadline.left() < seconds[-1]:
            return seconds


KERNEL_KINDS = (
    ("attention", ("flash", "fmha", "attention")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "aten::mm", "aten::addmm", "aten::bmm")),
)
"""A kernel's kind by its name (the first kind one of whose words it contains; else
``other``): cuBLAS/CUTLASS matrix products and SDPA's attention kernels on a GPU, the
aten operators that call them on the CPU."""


def kernel_kind(name: str) -> str:
    """``attention``, ``matmul`` or ``other`` (:data:`KERNEL_KINDS`)."""
    lowered = name.lower()
    for kind, words in KERNEL_KINDS:
        if any(word in lowered for word in words):
            return kind
    return "other"


def kernel_profile(
    fn: Callable[[], None], step_s: float, device: str, top: int = 12
) -> dict[str, Any]:
    """One more call of ``fn`` under ``torch.profiler``: where a step's device time
    goes, for finding what keeps MFU down from a single run on a lent machine.

    On a GPU it counts the CUDA kernels' own time; on the CPU the aten operators' self
    time (a kernel's or operator's time is counted once: no parent includes its
    children). ``busy`` is that total against ``step_s`` (the unprofiled median step):
    well under 1 on a GPU means the device waits on the host (launches, Python).

    Returns:
        ``kernels``: the ``top`` names by time with ``ms`` and ``share`` of the total;
        ``busy``; ``matmul_share``, ``attention_share``, ``other_share``
        (:func:`kernel_kind`).
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type != kind:
            continue
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if us > 0:
            times[event.key] = times.get(event.key, 0.0) + us / 1e3
    total = sum(times.values())
    if total <= 0:
        raise RuntimeError("the profiler recorded no kernel time for the step")
    ranked = sorted(times.items(), key=lambda item: -item[1])
    figures: dict[str, Any] = {
        "kernels": [
            {"name": name[:160], "ms": ms, "share": ms / total} for name, ms in ranked[:top]
        ],
        "kernel_ms": total,
        "busy": total / 1e3 / step_s,
    }
    for kind_name in ("matmul", "attention", "other"):
        share = sum(ms for name, ms in times.items() if kernel_kind(name) == kind_name)
        figures[f"{kind_name}_share"] = share / total
    return figures


Item = Callable[[Context, Deadline], dict[str, Any]]


@dataclass
class Row:
    """One item's result: its figures, or the error that stopped it."""

    item: str
    status: str
    seconds: float
    budget_s: float
    figures: dict[str, Any]
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the JSON."""
        return {
            "item": self.item,
            "status": self.status,
            "seconds": self.seconds,
            "budget_s": self.budget_s,
            "figures": self.figures,
            "error": self.error,
        }


def run_item(name: str, item: Item, ctx: Context, budget: float) -> Row:
    """Run ``item`` within ``budget`` seconds; its error becomes the row's."""
    started = time.perf_counter()
    try:
        figures = item(ctx, Deadline(budget))
        return Row(name, "ok", time.perf_counter() - started, budget, figures)
    except Exception as error:
        tail = traceback.format_exc(limit=-3)
        message = f"{type(error).__name__}: {error}"
        print(f"[{name}] failed: {message}\n{tail}", flush=True)
        return Row(name, "error", time.perf_counter() - started, budget, {}, message)
    finally:
        ctx.release()


SHOWN = (
    ("tflops", "TFLOP/s", "{:.3g}"),
    ("mfu", "MFU", "{:.1%}"),
    ("mfu_computed", "MFU of the FLOPs computed", "{:.1%}"),
    ("tokens_per_s", "tokens/s", "{:,.0f}"),
    ("step_s", "step s", "{:.3f}"),
    ("peak_gib", "peak GiB", "{:.1f}"),
    ("activation_gib", "activations GiB", "{:.1f}"),
    ("planned_activation_gib", "planned activations GiB", "{:.1f}"),
    ("activation_vs_planned", "activations ÷ planned", "{:.2f}"),
    ("busy", "device busy", "{:.0%}"),
    ("matmul_share", "matmul share", "{:.0%}"),
    ("attention_share", "attention share", "{:.0%}"),
    ("other_share", "other share", "{:.0%}"),
    ("kernels_error", "kernels", "{}"),
    ("sync_s", "sync s", "{:.3f}"),
    ("pack_s", "pack s", "{:.3f}"),
    ("transfer_s", "transfer s", "{:.3f}"),
    ("load_s", "load s", "{:.3f}"),
    ("checkpoint_publish_s", "checkpoint publish s", "{:.3f}"),
    ("checkpoint_sync_s", "checkpoint sync s", "{:.3f}"),
    ("nccl_publish_s", "nccl publish s", "{:.3f}"),
    ("nccl_sync_s", "nccl sync s", "{:.3f}"),
    ("nccl", "nccl", "{}"),
    ("megabytes", "MB", "{:,.0f}"),
    ("fits_layout", "fits", "{}"),
    ("fits_estimate_gib", "estimated GiB", "{:.1f}"),
    ("fits_measured_gib", "measured GiB", "{:.1f}"),
    ("refused_layout", "refused", "{}"),
    ("refused_ran_out", "refused ran out", "{:.0f}"),
    ("ratio0_step_s", "ratio 0 step s", "{:.3f}"),
    ("ratio1_step_s", "ratio 1 step s", "{:.3f}"),
    ("speedup", "speedup", "{:.2f}×"),
    ("layout", "layout", "{}"),
)
"""Figures the table shows (every figure is in the JSON), in this order."""


def table(rows: list[Row]) -> str:
    """One Markdown table: a row per item, its main figures, its time against its budget."""
    lines = [
        "| item | status | figures | s (budget) |",
        "| --- | --- | --- | ---: |",
    ]
    for row in rows:
        if row.error is not None:
            shown = row.error.replace("|", "/")[:160]
        else:
            shown = ", ".join(
                f"{label} {fmt.format(row.figures[key])}"
                for key, label, fmt in SHOWN
                if row.figures.get(key) is not None
            )
        lines.append(
            f"| {row.item} | {row.status} | {shown} | {row.seconds:.1f} ({row.budget_s:.0f}) |"
        )
    return "\n".join(lines)
