"""BM25 retrieval over the corpus (bm25s), built once and cached on disk.

Scoring is bm25s's default Okapi BM25 ("lucene" variant, k1=1.5, b=0.75; Robertson &
Zaragoza 2009). Text is accent-folded and lowercased before it is split into words of
two or more letters, and English stop words are dropped, so "Sao Paulo" finds "São Paulo".

Title words count three times (`TITLE_WEIGHT`). The index lives in
``$TAURL_CACHE/bm25/<corpus fingerprint>-bm25s<version>-<INDEX_VERSION>/`` (default
``~/.cache/taurl``); a second construction over the same corpus loads it instead of
rebuilding (`loaded_from_cache` says which happened). `shared_retriever()` keeps one
retriever per corpus per process, so many envs share one index.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import bm25s
from bm25s.stopwords import STOPWORDS_EN

from taurl.envs.search.corpus import Document, build_corpus, corpus_fingerprint, fold

_WORD = re.compile(r"(?u)\b\w\w+\b")  # bm25s's default token pattern
_STOP = frozenset(STOPWORDS_EN)
# Title words count TITLE_WEIGHT times, a poor man's BM25F (Robertson et al. 2004, "Simple
# BM25 extension to multiple weighted fields"): without it the short city documents that
# mention a country ("… is a city in Austria") outrank the country's own document.
TITLE_WEIGHT = 3
INDEX_VERSION = "t1"  # bump when tokenize() or the indexed text changes
_DONE = "taurl-complete"  # written last: a directory without it is a half-written index


def tokenize(text: str) -> list[str]:
    """The index's words for `text`: folded, lowercased, 2+ letters, no stop words."""
    return [w for w in _WORD.findall(fold(text).lower()) if w not in _STOP]


@dataclass(frozen=True)
class Hit:
    doc: Document
    score: float


@runtime_checkable
class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[Hit]: ...


def cache_root() -> Path:
    """$TAURL_CACHE, else ~/.cache/taurl."""
    return Path(os.environ.get("TAURL_CACHE") or Path.home() / ".cache" / "taurl")


class BM25Retriever:
    """Top-k BM25 search over `docs`. `search` is safe to call from many threads."""

    def __init__(self, docs: list[Document], cache_dir: str | os.PathLike[str] | None = None):
        if not docs:
            raise ValueError("BM25Retriever needs at least one document; pass build_corpus()")
        self.docs = list(docs)
        self.fingerprint = corpus_fingerprint(self.docs)
        root = Path(cache_dir) if cache_dir is not None else cache_root()
        # the key names everything the index depends on: the corpus, bm25s and our tokenization
        self.index_dir = (root / "bm25"
                          / f"{self.fingerprint}-bm25s{bm25s.__version__}-{INDEX_VERSION}")
        self._lock = threading.Lock()
        self.loaded_from_cache = False
        if (self.index_dir / _DONE).exists():
            try:
                self._bm25 = bm25s.BM25.load(str(self.index_dir), show_progress=False, verbosity=0)
                self.loaded_from_cache = True
            except Exception:  # a corrupt cache is rebuilt, never trusted
                shutil.rmtree(self.index_dir, ignore_errors=True)
        if not self.loaded_from_cache:
            self._bm25 = self._build()
            self._save()
        self._vocab = self._bm25.vocab_dict

    def _build(self) -> bm25s.BM25:
        bm25 = bm25s.BM25()
        bm25.index([tokenize(" ".join([d.title] * TITLE_WEIGHT + [d.text])) for d in self.docs],
                   show_progress=False)
        return bm25

    def _save(self) -> None:
        """Write to a temporary sibling, then rename: readers never see half an index."""
        self.index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.index_dir.parent))
        try:
            self._bm25.save(str(tmp), show_progress=False)
            (tmp / _DONE).write_text(self.fingerprint)
            # an OSError means another process finished first; its index is the same
            with contextlib.suppress(OSError):
                tmp.rename(self.index_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def search(self, query: str, k: int) -> list[Hit]:
        """The best `k` documents for `query` (score > 0), best first; [] when no word of
        the query is in the index (empty, stop words only, unknown words)."""
        if k <= 0:
            return []
        words = [w for w in tokenize(query) if w in self._vocab]
        if not words:
            return []
        k = min(k, len(self.docs))
        with self._lock:
            # bm25s keeps no per-call state we rely on, but is not documented thread-safe
            ids, scores = self._bm25.retrieve([words], k=k, show_progress=False, n_threads=0)
        return [Hit(self.docs[int(i)], float(s))
                for i, s in zip(ids[0], scores[0], strict=False) if s > 0]


_SHARED: dict[str, BM25Retriever] = {}
_SHARED_LOCK = threading.Lock()


def shared_retriever(docs: list[Document] | None = None) -> BM25Retriever:
    """One BM25Retriever per corpus per process (default corpus: `build_corpus()`)."""
    with _SHARED_LOCK:  # held while building, so two threads never build the same index
        # the default corpus skips hashing 34k documents on every call
        key = "default" if docs is None else corpus_fingerprint(docs)
        if key not in _SHARED:
            _SHARED[key] = BM25Retriever(build_corpus() if docs is None else docs)
        return _SHARED[key]
