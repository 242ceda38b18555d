"""search-v0: Search-R1-style retrieval QA over a GeoNames corpus of cities and countries.

Not registered here: `taurl.envs` registers ``search-v0`` with `SearchEnv` as factory.
"""

from taurl.envs.search.corpus import Document, build_corpus, corpus_fingerprint
from taurl.envs.search.env import SearchEnv, parse_action
from taurl.envs.search.questions import FAMILIES, generate_tasks
from taurl.envs.search.retriever import BM25Retriever, Hit, shared_retriever

__all__ = [
    "FAMILIES",
    "BM25Retriever",
    "Document",
    "Hit",
    "SearchEnv",
    "build_corpus",
    "corpus_fingerprint",
    "generate_tasks",
    "parse_action",
    "shared_retriever",
]
