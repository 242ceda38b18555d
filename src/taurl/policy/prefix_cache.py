"""The keys/values of finished sequences, kept for the agent's next turn."""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    """Keys/values of finished sequences, for the agent's next turn (which extends one).

    LRU, bounded in tokens; an entry is used once (the next turn's row replaces it). A
    lookup tries every cached length, longest first: a few hundred tuple compares.
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], list] = OrderedDict()
        self._tokens = 0

    def put(self, ids: list[int], kv: list) -> None:
        if self.max_tokens <= 0 or len(ids) > self.max_tokens or not ids:
            return
        key = tuple(ids)
        if key in self._entries:
            return
        self._entries[key] = kv
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def take(self, prompt: list[int]):
        """The cached KV of the longest cached proper prefix of `prompt`, removed; or None."""
        for n in sorted({len(k) for k in self._entries if len(k) < len(prompt)}, reverse=True):
            key = tuple(prompt[:n])
            if key in self._entries:
                self._tokens -= n
                return self._entries.pop(key)
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
