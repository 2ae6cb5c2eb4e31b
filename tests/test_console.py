"""library_logs: the libraries' logs and warnings go to a file, ours stay on the console."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgym.console import echo
from agentgym.library_logging import library_logs, library_of, redirect_output
from agentgym.log_summary import LibraryLogSummary, RepeatedMessage


def bare_root(monkeypatch: pytest.MonkeyPatch) -> logging.Logger:
    """The root logger as a plain script has it: no handlers, WARNING.

    Called in the test's body: pytest adds its handlers to the root in each phase.
    """
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", logging.WARNING)
    return root


@pytest.fixture
def shown_warnings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The warnings that reach ``warnings.showwarning`` (the console), every time."""
    shown: list[str] = []

    def record(message: Any, category: Any, filename: str, lineno: int, *args: Any) -> None:
        shown.append(str(message))

    monkeypatch.setattr(warnings, "showwarning", record)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        yield shown


def test_library_logs_and_warnings_go_to_the_file_and_the_summary(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch, shown_warnings
) -> None:
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    assert logging.getLogger("torch").handlers, "torch prints its warnings with its own handler"
    torch_handlers = list(logging.getLogger("torch").handlers)
    propagates = logging.getLogger("transformers").propagate  # as earlier tests left it
    root = bare_root(monkeypatch)
    log_file = tmp_path / "run" / "libraries.log"
    with library_logs(log_file) as logs:
        engine = logging.getLogger("vllm.model_executor.layers")
        for _ in range(3):
            engine.warning("RotaryEmbedding: Failed to load weights")
        engine.warning("Reloading weights took %.2f seconds", 0.10)
        engine.warning("Reloading weights took %.2f seconds", 0.02)
        hf_logging.get_logger("transformers.modeling_utils").warning("Some weights are new")
        logging.getLogger("torch._dynamo").warning("Triton not available")
        warnings.warn_explicit(
            "`reduce_op` is deprecated", FutureWarning, transformers.__file__, 12
        )
        engine.error("EngineCore died")
        logging.getLogger("agentgym.trainers.checkpoint").warning("checkpoint folder is full")
        warnings.warn("our own warning", UserWarning, stacklevel=1)
        assert torch.tensor(1).item() == 1

    out, err = capfd.readouterr()
    console = out + err
    for hidden in ("RotaryEmbedding", "Reloading", "Some weights", "Triton", "reduce_op"):
        assert hidden not in console
    assert "EngineCore died" in err  # a library's error is shown as well
    assert "checkpoint folder is full" in err  # ours are shown
    assert shown_warnings == ["our own warning"]

    text = log_file.read_text()
    assert " WARNING vllm.model_executor.layers: RotaryEmbedding: Failed to load weights" in text
    assert " WARNING transformers.modeling_utils: Some weights are new" in text
    assert " WARNING transformers: FutureWarning: `reduce_op` is deprecated" in text
    assert "checkpoint folder is full" not in text
    assert logs.counts() == {"ERROR": 1, "WARNING": 8}
    assert logs.messages()[:2] == [
        RepeatedMessage("vllm", "WARNING", "RotaryEmbedding: Failed to load weights", 3),
        RepeatedMessage("vllm", "WARNING", "Reloading weights took 0.10 seconds", 2),
    ]
    assert logs.summary(top=3).splitlines() == [
        f"library logs: 9 records (1 ERROR, 8 WARNING) in {log_file}",
        "  1× vllm ERROR: EngineCore died",
        "  3× vllm WARNING: RotaryEmbedding: Failed to load weights (expected at each weight "
        "sync: no checkpoint holds the rotary cache, and vLLM puts its own back)",
        "  2× vllm WARNING: Reloading weights took 0.10 seconds",
        "  ... 3 more kinds of warnings and errors",
    ]

    # everything is back as it was
    assert root.handlers == []
    assert logging.getLogger("torch").handlers == torch_handlers
    assert logging.getLogger("transformers").propagate == propagates
    assert hf_logging.is_progress_bar_enabled()
    assert "VLLM_LOGGING_CONFIG_PATH" not in os.environ
    logging.getLogger("vllm.engine").warning("after the run")
    assert "after the run" not in log_file.read_text()


def test_a_hydra_like_console_and_train_log_keep_only_our_records(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stdout)
    train_log = logging.FileHandler(tmp_path / "train.log")
    monkeypatch.setattr(root, "handlers", [console, train_log])
    monkeypatch.setattr(root, "level", logging.INFO)
    for name in ("httpx", "filelock", "agentgym.trainers.checkpoint"):  # as in a fresh process
        logger = logging.getLogger(name)  # (earlier tests' libraries may have configured them)
        monkeypatch.setattr(logger, "level", logging.NOTSET)
        monkeypatch.setattr(logger, "disabled", False)
        monkeypatch.setattr(logger, "propagate", True)
        monkeypatch.setattr(logger, "handlers", [])
    root.setLevel(logging.INFO)  # clears the loggers' cached levels (monkeypatch restores it)

    with library_logs(tmp_path / "libraries.log") as logs:
        logging.getLogger("httpx").info("HTTP Request: GET http://localhost")
        logging.getLogger("filelock").info("Lock acquired")
        logging.getLogger("agentgym.trainers.checkpoint").info("Saved checkpoint-2")
    train_log.close()

    out = capfd.readouterr().out
    assert out == "Saved checkpoint-2\n"
    assert (tmp_path / "train.log").read_text() == "Saved checkpoint-2\n"
    assert logs.counts() == {"INFO": 2}
    assert console.filters == [] and train_log.filters == []


def test_a_resumed_run_summarizes_only_its_own_records(tmp_path: Path, monkeypatch) -> None:
    bare_root(monkeypatch)
    log_file = tmp_path / "libraries.log"
    with library_logs(log_file):
        logging.getLogger("vllm").warning("first run")
    with library_logs(log_file) as logs:
        logging.getLogger("vllm").warning("second run")
    assert [m.message for m in logs.messages()] == ["second run"]
    assert "first run" in log_file.read_text()


def test_an_exception_prints_the_summary_after_putting_things_back(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch
) -> None:
    bare_root(monkeypatch)

    def run() -> None:
        with library_logs(tmp_path / "lib.log"):
            logging.getLogger("vllm").warning("KV cache too small")
            raise RuntimeError("engine dead")

    with pytest.raises(RuntimeError, match="engine dead"):
        run()
    err = capfd.readouterr().err
    assert f"library logs: 1 records (1 WARNING) in {tmp_path / 'lib.log'}" in err
    assert "1× vllm WARNING: KV cache too small" in err


def test_the_summary_of_nothing_says_so(tmp_path: Path) -> None:
    assert LibraryLogSummary(tmp_path / "none.log").summary() == (
        f"library logs: none ({tmp_path / 'none.log'})"
    )


def test_multi_line_records_count_once(tmp_path: Path) -> None:
    path = tmp_path / "lib.log"
    path.write_text(
        "2026-11-23 12:55:36,152 4884 ERROR vllm.engine: Engine failed\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "2026-11-23 12:55:37,001 5056 INFO vllm.core: Loading weights took 0.01 seconds\n"
    )
    assert LibraryLogSummary(path).counts() == {"ERROR": 1, "INFO": 1}


@pytest.mark.parametrize(
    ("filename", "library"),
    [
        ("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", "torch"),
        ("/usr/lib/python3/dist-packages/six.py", "six"),
        ("<frozen importlib._bootstrap>", "python"),
        (logging.__file__, "python"),
        ("/work/main/agentgym/trainers/grpo.py", None),
        ("train_script.py", None),
    ],
)
def test_library_of_a_warning_location(filename: str, library: str | None) -> None:
    assert library_of(filename) == library


def test_vllm_and_its_engine_process_log_to_the_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch
) -> None:
    # vLLM reads VLLM_LOGGING_CONFIG_PATH into its LoggingConfig, which its
    # engine applies, in the engine core's process too (spawned on CPU): a new
    # process here, doing as the engine does.
    pytest.importorskip("vllm")
    bare_root(monkeypatch)
    for name in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    code = (
        "from vllm.config.logging import LoggingConfig\n"
        "from vllm.logger import configure_logging_if_needed, init_logger\n"
        "configure_logging_if_needed(LoggingConfig())\n"
        "log = init_logger('vllm.v1.engine.core')\n"
        "log.info('Initializing a V1 LLM engine')\n"
        "log.error('EngineCore failed')\n"
    )
    with library_logs(tmp_path / "libraries.log") as logs:
        subprocess.run([sys.executable, "-c", code], check=True)
    assert "VLLM_LOGGING_CONFIG_PATH" not in os.environ
    err = capfd.readouterr().err
    assert "Initializing" not in err and "EngineCore failed" in err
    assert logs.counts() == {"ERROR": 1, "INFO": 1}
    assert " INFO vllm.v1.engine.core: Initializing a V1 LLM engine" in logs.path.read_text()


def test_redirect_output_sends_what_a_child_process_writes_to_the_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # as vLLM's engine core, spawned during the block and writing after it
    log_file = tmp_path / "libraries.log"
    code = (
        "import sys, time; print('child starts', flush=True); time.sleep(0.5); "
        "print('[W utils.cpp:68] Warning: NUMA binding', file=sys.stderr)"
    )
    with redirect_output(log_file):
        child = subprocess.Popen([sys.executable, "-c", code])
        os.write(1, b"parent inside\n")  # the descriptor: pytest's sys.stdout is not fd 1
    os.write(1, b"parent after\n")
    assert child.wait(timeout=30) == 0
    out, err = capfd.readouterr()
    assert (out, err) == ("parent after\n", "")
    assert log_file.read_text().splitlines() == [
        "parent inside",
        "child starts",
        "[W utils.cpp:68] Warning: NUMA binding",
    ]


def test_echo_prints_at_once_and_appends_to_the_log(tmp_path: Path) -> None:
    log_file = tmp_path / "train.log"
    log_file.write_text("[hydra] earlier\n")
    stream = io.StringIO()
    echo("validation success: 0.285 -> 0.459\nfinished in 580 s", log_file, stream)
    assert stream.getvalue() == "validation success: 0.285 -> 0.459\nfinished in 580 s\n"
    assert log_file.read_text().splitlines() == [
        "[hydra] earlier",
        "validation success: 0.285 -> 0.459",
        "finished in 580 s",
    ]
