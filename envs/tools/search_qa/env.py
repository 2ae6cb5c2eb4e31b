"""SearchQA: answer questions about a fictional world by searching its documents."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from agentgym.envs.text_env import require_reset
from agentgym.envs.tools.search_qa.kb import generate_kb
from agentgym.envs.tools.search_qa.questions import (
    GENERATORS,
    QUESTION_TYPES,
    QAQuestion,
    exact_match,
    f1_score,
)
from agentgym.envs.tools.search_qa.search import SearchIndex, format_documents
from agentgym.envs.tools.tool_env import ToolEnv, task_kinds
from agentgym.envs.tools.tools import Tool

REWARD_METRICS = ("em", "f1")
"""Reward of an answer: exact match or token F1 against the gold answer."""
SEARCH_DESCRIPTION = "Search the knowledge base; returns the best-matching documents (BM25)."


def search_parameters(default_k: int, max_k: int) -> dict[str, Any]:
    """JSON schema of the ``search`` tool's arguments: a query and an optional ``k``."""
    return {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to search for."},
            "k": {
                "type": "integer",
                "description": f"How many documents to return (default {default_k}).",
                "minimum": 1,
                "maximum": max_k,
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }


class SearchQAEnv(ToolEnv):
    """SearchQA: answer a question about a fictional world; a search tool finds documents.

    Every seed generates a new world (people, companies, cities and countries
    with made-up names; see :mod:`agentgym.envs.tools.search_qa.kb`), one
    document per entity, and a question: single-hop, bridge (two facts in a
    chain) or comparison. The ``search`` tool returns the ``k`` best documents
    by BM25. The answer is scored by exact match (default) or token F1 after
    SQuAD normalization; ``info`` has both.

    Args:
        question_types: Types to draw from (of
            :data:`~agentgym.envs.tools.search_qa.questions.QUESTION_TYPES`); default all.
        reward_metric: ``"em"`` or ``"f1"``.
        default_k: Documents returned when a search gives no ``k``.
        max_k: Largest ``k`` a search may ask for.
        max_turns: Responses per episode.
        max_tool_calls: Tool calls per episode.
        **kwargs: :class:`~agentgym.envs.tools.tool_env.ToolEnv`'s own options.

    Raises:
        ValueError: If a question type or the reward metric is unknown, or
            ``default_k`` is outside ``[1, max_k]``.
    """

    generator_version: ClassVar[int | None] = 1
    answer_format: ClassVar[str] = (
        "the answer only (a name, a place, a year, ...), e.g. <answer>Lakehaven</answer>."
    )

    def __init__(
        self,
        *,
        question_types: Sequence[str] | None = None,
        reward_metric: str = "em",
        default_k: int = 3,
        max_k: int = 10,
        max_turns: int = 6,
        max_tool_calls: int = 8,
        **kwargs: Any,
    ) -> None:
        search = Tool(
            "search", SEARCH_DESCRIPTION, search_parameters(default_k, max_k), self._search
        )
        super().__init__([search], max_turns=max_turns, max_tool_calls=max_tool_calls, **kwargs)
        types = task_kinds("question_types", question_types, QUESTION_TYPES)
        if reward_metric not in REWARD_METRICS:
            raise ValueError(
                f"reward_metric={reward_metric!r} is not supported; valid options: "
                f"{list(REWARD_METRICS)}"
            )
        if not 1 <= default_k <= max_k:
            raise ValueError(f"default_k must be in [1, max_k={max_k}], got {default_k}")
        self.question_types = types
        self.reward_metric = reward_metric
        self.default_k = default_k
        self.index: SearchIndex | None = None
        self.task: QAQuestion | None = None
        self.last_scores: dict[str, float] = {}

    @property
    def _rules(self) -> str:
        return (
            "Answer the question in the user's message about a fictional world. Facts are only "
            "in its documents, which the search tool finds; some questions need two searches, "
            "the second about what the first found."
        )

    def _search(self, query: str, k: int | None = None) -> str:
        """The ``search`` tool: the ``k`` best documents of the episode's world."""
        index = require_reset(self.index)
        return format_documents(index.search(query, k or self.default_k))

    def _new_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        kb = generate_kb(self.np_random)
        self.index = SearchIndex(kb.documents)
        kind = self.question_types[int(self.np_random.integers(len(self.question_types)))]
        self.task = GENERATORS[kind](self.np_random, kb)
        self.last_scores = {}
        return f"Question: {self.task.question}", {"question_type": kind}

    def _info(self) -> dict[str, Any]:
        return {**super()._info(), **self.last_scores}

    def _score(self, answer: str) -> tuple[float, bool]:
        if self.task is None:
            return 0.0, False
        self.last_scores = {
            "em": exact_match(answer, self.task.answer),
            "f1": f1_score(answer, self.task.answer),
        }
        return self.last_scores[self.reward_metric], self.last_scores["em"] == 1.0

    def oracle_response(self) -> str:
        """What an expert writes now: the next planned searches, then the answer."""
        task = require_reset(self.task, "oracle_response()")
        done = self.toolbox.num_tool_calls
        for queries in task.plan:
            if done == 0:
                return self._expert(
                    "Search for it.", calls=[("search", {"query": q}) for q in queries]
                )
            done -= len(queries)
        return self._expert("Search for it.", answer=task.answer)
