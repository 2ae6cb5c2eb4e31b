"""BM25 search over a knowledge base's documents (``bm25s``)."""

from __future__ import annotations

import bm25s  # type: ignore[import-untyped]  # no stubs

from agentgym.envs.tools.search_qa.kb import Document


class SearchIndex:
    """A BM25 index of documents (title and text).

    Args:
        documents: The corpus.
    """

    def __init__(self, documents: list[Document]) -> None:
        self.documents = documents
        corpus = [f"{doc.title}\n{doc.text}" for doc in documents]
        self._retriever = bm25s.BM25()
        self._retriever.index(
            bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False
        )

    def search(self, query: str, k: int) -> list[Document]:
        """The ``k`` best documents for ``query`` (fewer when fewer match at all)."""
        tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:
            return []
        k = min(k, len(self.documents))
        ids, scores = self._retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        return [self.documents[int(i)] for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


def format_documents(documents: list[Document]) -> str:
    """Search results as the model sees them: numbered titles and texts."""
    if not documents:
        return "No documents matched the query."
    return "\n\n".join(f"[{i}] {doc.title}\n{doc.text}" for i, doc in enumerate(documents, 1))
