"""pytest-benchmark: one Python-tool call, our sandbox next to a bare ``python -c``.

Run with ``python -m pytest benchmarks/test_sandbox_latency.py --benchmark-only``;
the ``python-call`` group shows the three side by side with ratios. The
percentile table and calls/s are in ``compare_sandbox_latency.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from compare_sandbox_latency import CODE, EXPECTED, bare_call

from agentgym.envs.tools.sandbox import PythonSandbox, WorkerPool


@pytest.fixture(scope="module", params=[True, False], ids=["zygote", "interpreter-per-call"])
def sandbox(request: pytest.FixtureRequest) -> Iterator[PythonSandbox]:
    pool = WorkerPool(1, prefork=request.param)
    yield PythonSandbox(isolation="namespaces", pool=pool)
    pool.close()


@pytest.mark.benchmark(group="python-call")
def test_bare_python_c_subprocess(benchmark: Any) -> None:
    assert benchmark(bare_call).strip() == EXPECTED


@pytest.mark.benchmark(group="python-call")
def test_sandboxed_call(benchmark: Any, sandbox: PythonSandbox) -> None:
    result = benchmark(sandbox.run, CODE)
    assert result.ok
    assert result.output.strip() == EXPECTED
