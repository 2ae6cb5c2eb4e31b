"""Question answering over a generated fictional knowledge base, with a BM25 ``search`` tool."""

from agentgym.envs.tools.search_qa.env import SearchQAEnv
from agentgym.envs.tools.search_qa.kb import KnowledgeBase, generate_kb
from agentgym.envs.tools.search_qa.questions import (
    QUESTION_TYPES,
    QAQuestion,
    exact_match,
    f1_score,
    normalize_answer,
)
from agentgym.envs.tools.search_qa.search import SearchIndex

__all__ = [
    "QUESTION_TYPES",
    "KnowledgeBase",
    "QAQuestion",
    "SearchIndex",
    "SearchQAEnv",
    "exact_match",
    "f1_score",
    "generate_kb",
    "normalize_answer",
]
