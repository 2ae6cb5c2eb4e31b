"""The GPU suite (``benchmarks/gpu``) runs end to end: ``python -m benchmarks.gpu --dry-run``
on the CPU with tiny shapes gives every item a row with its figures, so the suite the
first lent GPU machine runs has not rotted. No wall-clock time is asserted."""

from __future__ import annotations

import importlib
import json
import math
import time
from pathlib import Path

import pytest
import torch

from tests.forkserver import run_python

ROOT = Path(__file__).resolve().parents[1]
ITEMS = {
    "peak": ["tflops"],
    "megatron_tp1": ["tokens_per_s", "tflops", "mfu", "step_s", "grad_norm"],
    "megatron_planned": ["tokens_per_s", "tflops", "mfu", "step_s", "grad_norm"],
    "planner_fit": ["fits_estimate_gib", "fits_ran", "usable_gib"],
    "torch_step": ["tokens_per_s", "tflops", "mfu", "step_s", "grad_norm"],
    "fsdp2_step": ["tokens_per_s", "tflops", "mfu", "step_s", "grad_norm"],
    "generation": ["tokens_per_s", "new_tokens"],
    "weight_sync": ["sync_s", "pack_s", "transfer_s", "load_s", "megabytes", "buckets"],
    "decoupled_sync": ["checkpoint_publish_s", "checkpoint_sync_s", "nccl_sync_s", "megabytes"],
    "async_ratio": ["ratio0_step_s", "ratio1_step_s", "speedup"],
}


def test_dry_run_gives_every_item_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "suite.json"
    done = run_python(
        ["-m", "benchmarks.gpu", "--dry-run", "--json", str(out),
         "--work-dir", str(tmp_path / "work"), "--kernels"],
        cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] is True and report["complete"] is True
    rows = {row["item"]: row for row in report["items"]}
    assert list(rows) == ["models", *ITEMS]
    for name, keys in ITEMS.items():
        row = rows[name]
        assert row["status"] == "ok", row["error"]
        for key in keys:
            value = row["figures"][key]
            assert isinstance(value, float) and math.isfinite(value), (name, key, value)
        assert row["figures"].get("reps", 1.0) >= 1.0
    # the figures are the measurement's, not placeholders
    assert rows["peak"]["figures"]["tflops"] > 0
    sync = rows["weight_sync"]["figures"]
    assert sync["max_abs_diff"] == 0.0  # the engine holds the trainer's weights
    assert sync["buckets"] >= 2  # the tiny model (2.4 MB) in 1 MB buckets
    assert sync["pack_s"] + sync["transfer_s"] + sync["load_s"] <= sync["sync_s"] * 1.5
    generation = rows["generation"]["figures"]
    settings = report["settings"]
    assert generation["new_tokens"] == settings["gen_batch"] * settings["gen_new_tokens"]
    tokens = settings["samples"] * settings["seq_len"]
    for name in ("megatron_tp1", "megatron_planned", "torch_step", "fsdp2_step"):
        figures = rows[name]["figures"]
        assert figures["tokens_per_s"] * figures["step_s"] == pytest.approx(tokens)
        assert figures["grad_norm"] > 0  # the step trains: the loss has a gradient
        assert figures["planned_state_gib"] > 0 and figures["planned_activation_gib"] > 0
        # the head skips the prompt: the FLOPs computed are fewer than the model's count
        assert 0 < figures["mfu_computed"] < figures["mfu"]
        # --kernels: one more step profiled, its time split by kernel and by kind
        assert figures["kernels"] and figures["busy"] > 0, figures
        shares = [figures[f"{kind}_share"] for kind in ("matmul", "attention", "other")]
        assert sum(shares) == pytest.approx(1.0) and figures["matmul_share"] > 0
    assert "kernels" not in rows["planner_fit"]["figures"]  # it times no step of its own
    assert "layout" in rows["megatron_planned"]["figures"]
    # the same first step in both strategies (same weights, batch, loss): the same gradient
    torch_norm = rows["torch_step"]["figures"]["grad_norm"]
    assert rows["fsdp2_step"]["figures"]["grad_norm"] == pytest.approx(torch_norm, rel=1e-4)
    decoupled = rows["decoupled_sync"]["figures"]
    assert decoupled["megabytes"] == pytest.approx(sync["megabytes"], rel=0.01)  # every byte
    # the table printed last names every item
    for name in ITEMS:
        assert f"| {name} | ok |" in done.stdout


def test_an_unknown_item_is_refused_with_the_valid_names() -> None:
    done = run_python(
        ["-m", "benchmarks.gpu", "--dry-run", "--only", "torch_stepp"], cwd=ROOT, timeout=120
    )
    assert done.returncode != 0
    assert "did you mean ['torch_step']" in done.stderr


def test_a_failing_item_records_its_error_and_the_suite_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    # imported by name: mypy maps benchmarks/gpu/ (no benchmarks/__init__.py) as ``gpu``
    cli = importlib.import_module("benchmarks.gpu.cli")
    settings = importlib.import_module("benchmarks.gpu.models").DRY
    table = importlib.import_module("benchmarks.gpu.runner").table

    def broken(ctx: object, deadline: object) -> dict[str, float]:
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setitem(cli.ITEMS, "broken", (broken, 0.5))
    seen: list[list[str]] = []
    rows = cli.run_suite(
        ["broken", "peak"],
        settings,
        1.0,
        tmp_path,
        lambda so_far: seen.append([r.item for r in so_far]),
    )
    # the rows so far after each item: a run cut short keeps what it measured
    assert seen == [["models"], ["models", "broken"], ["models", "broken", "peak"]]
    assert [(row.item, row.status) for row in rows] == [
        ("models", "ok"), ("broken", "error"), ("peak", "ok"),
    ]  # fmt: skip
    assert rows[1].error == "RuntimeError: CUDA out of memory (simulated)"
    assert rows[2].figures["tflops"] > 0
    printed = table(rows)
    assert "| broken | error | RuntimeError: CUDA out of memory (simulated) |" in printed
    # each item's budget is its weight's share of what is left of the minute
    assert rows[1].budget_s == pytest.approx(
        (60 - rows[0].seconds) * 0.5 / (0.5 + cli.ITEMS["peak"][1]), rel=0.05
    )


def test_kernel_profile_splits_a_step_by_kernel_and_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    runner = importlib.import_module("benchmarks.gpu.runner")
    a = torch.randn(256, 256)

    def step() -> None:  # matmuls, and an elementwise tail of about their size
        b = a
        for _ in range(8):
            b = torch.tanh(b @ a)

    started = time.perf_counter()
    step()
    figures = runner.kernel_profile(step, time.perf_counter() - started, "cpu", top=3)
    names = [kernel["name"] for kernel in figures["kernels"]]
    assert len(names) == 3 and "aten::mm" in names, names
    assert figures["matmul_share"] > 0 and figures["other_share"] > 0  # tanh
    assert figures["attention_share"] == 0
    assert sum(k["share"] for k in figures["kernels"]) <= 1.0 + 1e-9
    shares = [figures[f"{kind}_share"] for kind in ("matmul", "attention", "other")]
    assert sum(shares) == pytest.approx(1.0)
    # the names a GPU's profile gives (cuBLAS, cuBLASLt on Hopper, SDPA's flash kernel)
    kinds = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matmul",
        "nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_TNT": "matmul",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>": "attention",
        "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>": "other",
    }
    assert {name: runner.kernel_kind(name) for name in kinds} == kinds


def test_the_packages_carried_to_a_gpu_machine_are_the_versions_tested_here() -> None:
    # benchmarks/gpu/wheels.sh downloads these pins for the lent machine's image
    from importlib.metadata import version

    lines = (ROOT / "benchmarks" / "gpu" / "carry.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    assert {"megatron-core", "hydra-core", "pydantic"} <= set(pins)
    assert {name: version(name) for name in pins} == pins
