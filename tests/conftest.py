"""Tiny local models (random Qwen2 weights, BPE trained on env text) for rollout tests,
and how the suite splits over pytest-xdist's workers (``make unit`` runs two)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agentgym
from agentgym.envs.text_env import TextEnv
from agentgym.models.tiny import TinyModelSpec, build_tiny_model


def env_corpus() -> list[str]:
    """Observations, instructions and well-formed answers of the built-in envs."""
    texts = []
    for name in ("sokoban", "frozen_lake"):
        env = agentgym.make(name).unwrapped
        assert isinstance(env, TextEnv)
        for seed in range(8):
            observation, _ = env.reset(seed=seed)
            texts += [observation, env.instructions]
        texts += [f"<answer>{action}</answer>" for action in env.action_names]
    texts += ['<tool_call>{"name": "python", "arguments": {"code": "print(1 + 2)"}}</tool_call>']
    return texts * 4


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ChatML tiny model folder."""
    return build_tiny_model(env_corpus(), TinyModelSpec(), tmp_path_factory.mktemp("tiny-chatml"))


@pytest.fixture(scope="session")
def qwen_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model folder with the Qwen2.5-style tools template."""
    spec = TinyModelSpec(chat_template="qwen2.5", seed=1)
    return build_tiny_model(env_corpus(), spec, tmp_path_factory.mktemp("tiny-qwen"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def masked_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of consecutive ids where ``mask`` is 1: one per model response.

    Responses are decoded one span at a time: a random model may end a
    response inside a multi-byte character, which must not merge with the
    next response's bytes.
    """
    spans: list[list[int]] = []
    previous = 0
    for token, flag in zip(ids, mask, strict=True):
        if flag and not previous:
            spans.append([])
        if flag:
            spans[-1].append(token)
        previous = flag
    return spans


TESTS = Path(__file__).parent
RAY_MODULES = frozenset(
    str(path.relative_to(TESTS.parent))
    for path in TESTS.rglob("test_*.py")
    if "mark.ray" in path.read_text()
)
"""The test modules with a ``ray``-marked test, read from their text (the controller
schedules by node id, without the marks; :func:`pytest_collection_modifyitems` checks
the reading against the marks collected)."""


def module_of(nodeid: str) -> str:
    """A test's module, as the repository-relative path its node id starts with."""
    return nodeid.split("::", 1)[0]


def work_unit(nodeid: str) -> str:
    """The xdist unit of work a test belongs to: its module, or ``ray``."""
    module = module_of(nodeid)
    return "ray" if module in RAY_MODULES else module


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a ``ray``-marked test whose module :data:`RAY_MODULES` missed: under xdist
    it would run beside the other Ray tests."""
    marked = {module_of(item.nodeid) for item in items if item.get_closest_marker("ray")}
    if stray := sorted(marked - RAY_MODULES):
        raise pytest.UsageError(
            f"ray-marked tests in {stray}, which tests/conftest.py's RAY_MODULES (modules "
            "whose text says mark.ray) does not list: mark them with pytest.mark.ray"
        )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make unit``'s split over pytest-xdist workers (``--dist loadgroup``): one unit of
    work per test module, so that a module's fixtures are built once, on one worker, and
    one unit for all of :data:`RAY_MODULES`, so that they never run beside each other:
    two local Ray clusters started at once on one machine may collide, and a Ray driver
    may join another's cluster. A test that starts Ray, in its process or a subprocess,
    carries the ``ray`` mark.

    xdist's own loadgroup cannot do this under pytest 9: it tags a test's group onto
    ``item._nodeid``, which pytest 9's ``nodeid`` no longer reads, so every test was
    scheduled on its own (a module's fixtures built on both workers). This scheduler
    groups by the node id the controller receives, so it needs no marks there.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ModuleGroups(config, log)
