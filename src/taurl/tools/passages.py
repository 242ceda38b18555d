"""The search tool's answer: retrieved passages as the model reads them.

Shared by the search env (`taurl.envs.search`) and the proxy's retriever endpoint
(`taurl.proxy.server`), so an agent behind the proxy reads exactly what the env shows. A hit
is anything with ``.doc.title`` and ``.doc.text`` (`taurl.envs.search.retriever.Hit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NO_RESULTS = "No documents matched the query."


def format_hits(hits: Sequence[Any], max_doc_chars: int | None) -> str:
    """Search-R1's passage format: ``Doc i(Title: t) text`` one per line (trailing newline
    stripped, as Search-R1 strips the block)."""
    lines = []
    for i, h in enumerate(hits, 1):
        text = h.doc.text
        if max_doc_chars is not None and len(text) > max_doc_chars:
            text = text[:max_doc_chars].rstrip() + "..."
        lines.append(f"Doc {i}(Title: {h.doc.title}) {text}")
    return "\n".join(lines)
