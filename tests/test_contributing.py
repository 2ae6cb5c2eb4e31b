"""CONTRIBUTING.md's "Where new pieces go": each of its Python examples (an
advantage estimator, a loss, a rollout source, a strategy) runs and its asserts hold."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

CONTRIBUTING = (Path(__file__).resolve().parents[1] / "CONTRIBUTING.md").read_text()
SECTION = CONTRIBUTING[CONTRIBUTING.index("## 5. Where new pieces go") :]
EXAMPLES = dict(
    re.findall(r"^### (5\.\d [^\n]+)\n.*?^```python\n(.*?)^```", SECTION, re.DOTALL | re.M)
)


def test_the_section_has_an_example_for_each_kind_of_piece() -> None:
    assert [title.split(" ", 1)[1] for title in EXAMPLES] == [
        "An advantage estimator",
        "A loss",
        "A rollout source",
        "A training strategy",
    ]


@pytest.mark.parametrize("title", list(EXAMPLES))
def test_the_example_runs(title: str, tiny_model_dir: Path) -> None:
    from agentgym.trainers.advantages import ADVANTAGE_ESTIMATORS

    namespace: dict[str, Any] = {"model_dir": tiny_model_dir, "__name__": "contributing"}
    try:
        exec(compile(EXAMPLES[title], f"CONTRIBUTING.md {title}", "exec"), namespace)
    finally:
        ADVANTAGE_ESTIMATORS.pop("sign", None)  # the estimator example registers one
