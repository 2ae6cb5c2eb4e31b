"""BM25 search over the catalog, as WebShop's Lucene index ranks it, without Java.

WebShop indexes one document per product: the lowercased title, description,
first bullet point and option text (``"color: black, white, and size: s, m"``),
and searches it with pyserini's BM25 (k1 = 0.9, b = 0.4), returning the top 50.
Here the index is built with :mod:`bm25s` (``method="lucene"``, the same
scoring formula) over the same text, analyzed as Lucene's English analyzer
does: words, possessive ``'s`` removed, Lucene's English stop words dropped,
Porter stemming. Ties are broken by catalog position, as Lucene breaks them
by document id. The index is built once per catalog and cached on disk.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import bm25s  # type: ignore[import-untyped]  # no stubs
import numpy as np
import Stemmer  # type: ignore[import-not-found]  # PyStemmer: C extension, no stubs

from agentgym.envs.webshop.catalog import Catalog, Product
from agentgym.envs.webshop.files import atomic_directory

K1 = 0.9
B = 0.4
SEARCH_RETURN_N = 50
INDEX_VERSION = 1
"""Bumped whenever the analyzer or the document text changes; part of the cache key."""

_STOP_WORDS = (
    "a an and are as at be but by for if in into is it no not of on or such that the their "
    "then there these they this to was will with"
)
LUCENE_ENGLISH_STOP_WORDS = frozenset(_STOP_WORDS.split())
_WORD = re.compile(r"\w+(?:['.]\w+)*")
_STEMMER = Stemmer.Stemmer("porter")


def document_text(product: Product) -> str:
    """The text WebShop indexes for a product (lowercased)."""
    option_text = ", and ".join(
        f"{name}: {', '.join(values)}" for name, values in product.options.items()
    )
    parts = [product.title, product.description, product.bullet_points[0], option_text]
    return " ".join(parts).lower()


def analyze(text: str) -> list[str]:
    """Split text into index terms: lowercase words, no possessives, no stop words, stemmed."""
    words = []
    for word in _WORD.findall(text.lower()):
        if word.endswith("'s"):
            word = word[:-2]
        word = word.replace("'", "")
        if word and word not in LUCENE_ENGLISH_STOP_WORDS:
            words.append(word)
    return _STEMMER.stemWords(words)


class SearchEngine:
    """Top-50 BM25 retrieval over a catalog.

    Build with :meth:`build` or :meth:`load_or_build`; query with :meth:`search`.
    """

    def __init__(self, retriever: bm25s.BM25) -> None:
        self._vocab: dict[str, int] = retriever.vocab_dict
        scores = retriever.scores
        self._data = np.asarray(scores["data"], dtype=np.float32)  # [nnz]
        self._indices = np.asarray(scores["indices"], dtype=np.int64)  # [nnz] doc ids
        self._indptr = np.asarray(scores["indptr"], dtype=np.int64)  # [V + 1]
        self.num_docs = int(scores["num_docs"])
        self._retriever = retriever

    @classmethod
    def build(cls, catalog: Catalog) -> SearchEngine:
        """Index every product of ``catalog`` (in catalog order)."""
        corpus = [analyze(document_text(p)) for p in catalog.products]
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        retriever.index(corpus, show_progress=False)
        return cls(retriever)

    @classmethod
    def load_or_build(cls, catalog: Catalog, directory: Path) -> SearchEngine:
        """Load the index cached in ``directory``, or build it and cache it there.

        Args:
            catalog: The catalog the index is for.
            directory: The cache entry (created atomically when missing).

        Returns:
            The engine.
        """
        meta_path = directory / "agentgym_meta.json"
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            if meta == _meta(catalog):
                retriever = bm25s.BM25.load(str(directory), show_progress=False)
                return cls(retriever)
        engine = cls.build(catalog)
        if not meta_path.is_file():
            with atomic_directory(directory) as tmp:
                engine._retriever.save(str(tmp), show_progress=False)
                (tmp / "agentgym_meta.json").write_text(json.dumps(_meta(catalog)))
        return engine

    def scores(self, keywords: str) -> np.ndarray:
        """``[N]`` BM25 score of every product for ``keywords`` (repeated terms count again)."""
        # bm25s keeps "" in its vocabulary with no postings row; skip it (and any such id)
        rows = len(self._indptr) - 1
        ids = [self._vocab[t] for t in analyze(keywords) if t and t in self._vocab]
        ids = [i for i in ids if i < rows]
        if not ids:
            return np.zeros(self.num_docs, dtype=np.float64)
        term = np.asarray(ids, dtype=np.int64)
        starts, ends = self._indptr[term], self._indptr[term + 1]
        docs = np.concatenate([self._indices[s:e] for s, e in zip(starts, ends, strict=True)])
        weights = np.concatenate([self._data[s:e] for s, e in zip(starts, ends, strict=True)])
        return np.bincount(docs, weights=weights, minlength=self.num_docs)

    def search(self, keywords: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Catalog positions of the top ``k`` products for ``keywords``, best first.

        Products that share no term with the query are never returned; equal
        scores are ordered by catalog position.
        """
        scores = self.scores(keywords)
        hits = np.flatnonzero(scores > 0)
        if len(hits) > k:
            kth = np.partition(scores[hits], len(hits) - k)[len(hits) - k]
            hits = hits[scores[hits] >= kth]
        order = np.lexsort((hits, -scores[hits]))
        return [int(i) for i in hits[order[:k]]]


def _meta(catalog: Catalog) -> dict[str, object]:
    first = catalog.products[0].asin if len(catalog) else ""
    last = catalog.products[-1].asin if len(catalog) else ""
    return {"version": INDEX_VERSION, "k1": K1, "b": B, "docs": len(catalog), "ends": [first, last]}
