"""A search agent on the `anthropic` SDK (the Messages API, tool use). It imports
nothing from taurl.

`taurl train` with ``agent: {callable: examples/anthropic_agent.py:run_agent}`` trains the
model inside it through the taurl proxy, which serves ``/v1/messages`` (docs/compatibility.md).
"""

from __future__ import annotations

import json
import os
import urllib.request

import anthropic

SEARCH = {"name": "search", "description": "Search an encyclopedia of cities and countries.",
          "input_schema": {"type": "object", "properties": {"query": {"type": "string"}},
                           "required": ["query"]}}


def search(retriever_url: str, query: str) -> str:
    req = urllib.request.Request(f"{retriever_url}/search",
                                 data=json.dumps({"query": query, "k": 1}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["text"]


def run_agent(task: str, base_url: str | None = None, retriever_url: str | None = None, *,
              anthropic_base_url: str | None = None, max_steps: int = 4) -> str:
    client = anthropic.Anthropic(base_url=anthropic_base_url,
                                 api_key=os.environ.get("ANTHROPIC_API_KEY", "none"))
    retriever_url = retriever_url or os.environ["TAURL_RETRIEVER_URL"]
    messages = [{"role": "user", "content": task}]
    for _ in range(max_steps):
        reply = client.messages.create(model="policy", max_tokens=256, messages=messages,
                                       tools=[SEARCH])
        messages.append({"role": "assistant", "content": reply.content})
        uses = [b for b in reply.content if b.type == "tool_use"]
        if not uses:
            return "".join(b.text for b in reply.content if b.type == "text")
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": u.id,
             "content": search(retriever_url, u.input.get("query", ""))}
            for u in uses]})
    return ""


if __name__ == "__main__":
    print(run_agent(os.environ["TAURL_TASK"]))
