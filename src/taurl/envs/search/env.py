"""search-v0: Search-R1's retrieval QA loop over the GeoNames corpus.

Protocol (Jin et al. 2025, "Search-R1", arXiv:2503.09516, `search_r1/llm_agent/generation.py`):
the whole episode is one assistant message. The model thinks in ``<think>…</think>``,
searches with ``<search>query</search>`` (the engine stops at ``</search>``), receives
``<information>Doc 1(Title: …) …</information>`` inline, and ends with
``<answer>…</answer>``. The reward is exact match of the answer (`taurl.reward`).

Departures from Search-R1, each deliberate:
* the LAST complete ``<search>``/``<answer>`` in the action counts (Search-R1 takes the
  first, but it also cuts the action at the first closing tag, so with the engine
  stopping at `stop` the two agree);
* an empty search query is invalid (Search-R1 would send it to the retriever);
* a search that finds nothing says so instead of an empty ``<information>`` block;
* a retriever failure is survivable: the model is told and the step carries
  ``info["error"]``; `max_search_errors` failures in a row end the episode
  (truncated, ``stop_reason="error"``, an invalid sample for the learner).
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any

from taurl.data.trajectory import ToolReceipt
from taurl.envs.core import Task
from taurl.envs.search.retriever import Retriever, shared_retriever
from taurl.errors import ConfigError, ResetNeeded
from taurl.reward.exact_match import VERIFIER_VERSION, exact_match
from taurl.tools.passages import NO_RESULTS, format_hits

VERSION = "1"  # bump when an observation, the parser or the reward changes meaning

SYSTEM_PROMPT = (
    "Answer the given question. Think inside <think> and </think> every time you get new "
    "information. If you lack knowledge, search with <search> query </search>; the top results "
    "come back between <information> and </information>. You can search several times. When "
    "you know the answer, give it inside <answer> and </answer> without explanation, "
    "for example <answer> Beijing </answer>."
)

# Search-R1's corrective observation, verbatim
INVALID_OBSERVATION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)
SEARCH_FAILED = "The search failed. Try again or give your answer."

SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search an encyclopedia of cities and countries; returns the best matching "
                       "documents.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Words to look for, e.g. a "
                                                                      "city name."}},
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}

_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)  # Search-R1's pattern


def parse_action(text: str) -> dict[str, str]:
    """The last complete action in `text`: {"kind": "search", "query"} | {"kind":
    "answer", "answer"} | {"kind": "invalid"}. An empty query is invalid; an empty
    answer is an answer (it ends the episode with reward 0, as in Search-R1)."""
    matches = list(_ACTION.finditer(text))
    if not matches:
        return {"kind": "invalid"}
    tag, content = matches[-1].group(1), matches[-1].group(2).strip()
    if tag == "search":
        return {"kind": "search", "query": content} if content else {"kind": "invalid"}
    return {"kind": "answer", "answer": content}


class SearchEnv:
    """Retrieval QA with BM25 search (see the module docstring)."""

    name = "search-v0"
    version = VERSION
    verifier_version = VERIFIER_VERSION
    observation_style = "inline"
    stop = ("</search>", "</answer>")
    tools = [SEARCH_TOOL]
    system_prompt = SYSTEM_PROMPT

    def __init__(self, top_k: int = 3, max_turns: int = 4, max_doc_chars: int | None = 400,
                 retriever: Retriever | None = None, max_search_errors: int = 2):
        problems = []
        for key, value, low in (("top_k", top_k, 1), ("max_turns", max_turns, 1),
                                ("max_search_errors", max_search_errors, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                problems.append(f"{key} must be an integer >= {low}, got {value!r}")
        if max_doc_chars is not None and (isinstance(max_doc_chars, bool)
                                          or not isinstance(max_doc_chars, int)
                                          or max_doc_chars < 1):
            problems.append("max_doc_chars must be None (no truncation) or an integer >= 1, got "
                            f"{max_doc_chars!r}")
        if retriever is not None and not callable(getattr(retriever, "search", None)):
            problems.append("retriever must have a search(query, k) -> list[Hit] method")
        if problems:
            raise ConfigError(problems)
        self.top_k, self.max_turns, self.max_doc_chars = top_k, max_turns, max_doc_chars
        self.max_search_errors = max_search_errors
        self.tools = [copy.deepcopy(SEARCH_TOOL)]  # per env: a caller's edit stays local
        # built or loaded once per process and shared by every env (see shared_retriever)
        self.retriever: Retriever = retriever if retriever is not None else shared_retriever()
        self._task: Task | None = None
        self._done = True
        self._turn = 0
        self._errors_in_a_row = 0

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        if task.env != self.name:
            raise ConfigError(f"task {task.task_id!r} is for env {task.env!r}, not {self.name!r}; "
                              "make the env the task names")
        if not task.answers:
            raise ConfigError(f"task {task.task_id!r} has no gold answers; exact match needs at "
                              "least one")
        self._task, self._done, self._turn, self._errors_in_a_row = task, False, 0, 0
        info = {"task_id": task.task_id, "seed": seed, "env": self.name,
                "env_version": self.version, "top_k": self.top_k, "max_turns": self.max_turns,
                "max_doc_chars": self.max_doc_chars, "verifier_version": VERIFIER_VERSION,
                "corpus_fingerprint": getattr(self.retriever, "fingerprint", "")}
        # the world the episode runs in, kept in the trajectory (a custom retriever may not know it)
        info["provenance"] = ({"corpus_fingerprint": info["corpus_fingerprint"]}
                              if info["corpus_fingerprint"] else {})
        return "", info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task is None or self._done:
            raise ResetNeeded("SearchEnv.step called before reset() or after the episode ended; "
                              "call reset(task) first")
        self._turn += 1
        parsed = parse_action(action)
        info: dict[str, Any] = {"action": parsed, "invalid": parsed["kind"] == "invalid",
                                "turn": self._turn}
        obs, reward, terminated, truncated = "", 0.0, False, False
        if parsed["kind"] == "answer":
            reward = exact_match(parsed["answer"], self._task.answers)
            terminated = True
            info.update(stop_reason="answered", reward_components={"outcome": reward},
                        verifier_version=VERIFIER_VERSION)
        elif parsed["kind"] == "search":
            obs, failed = self._search(parsed["query"], info)
            self._errors_in_a_row = self._errors_in_a_row + 1 if failed else 0
            if self._errors_in_a_row >= self.max_search_errors:
                truncated = True
                info["stop_reason"] = "error"
        else:
            obs = INVALID_OBSERVATION
        if not (terminated or truncated) and self._turn >= self.max_turns:
            truncated = True
            info["stop_reason"] = "max_turns"
        self._done = terminated or truncated
        return obs, reward, terminated, truncated, info

    def _search(self, query: str, info: dict[str, Any]) -> tuple[str, bool]:
        """Run one search; fills info["receipt"] (and info["error"]); returns (observation,
        failed)."""
        t0 = time.perf_counter()
        try:
            hits = self.retriever.search(query, self.top_k)
        except Exception as e:  # any retriever failure: the model is told, the episode goes on
            error = f"{type(e).__name__}: {e}"
            info["error"] = error
            info["receipt"] = ToolReceipt(tool="search", arguments={"query": query},
                                          decision="allowed", status="error", reason=error,
                                          latency_s=time.perf_counter() - t0)
            return f"\n\n<information>{SEARCH_FAILED}</information>\n\n", True
        body = format_hits(hits, self.max_doc_chars) if hits else NO_RESULTS
        info["receipt"] = ToolReceipt(
            tool="search", arguments={"query": query}, decision="allowed", status="ok",
            latency_s=time.perf_counter() - t0, output_chars=len(body),
            truncated_output=(self.max_doc_chars is not None
                              and any(len(h.doc.text) > self.max_doc_chars for h in hits)))
        info["doc_ids"] = [h.doc.doc_id for h in hits]
        return f"\n\n<information>{body}</information>\n\n", False
