"""A search agent on the official `openai` SDK, with function calling. It imports
nothing from taurl.

Run it against any OpenAI-compatible server:

    OPENAI_BASE_URL=http://host/v1 TAURL_RETRIEVER_URL=http://host/retriever \
        TAURL_TASK="In which country is Lyon?" python examples/openai_agent.py

`taurl train --config configs/openai_agent.yaml` trains the model inside it through the
taurl proxy: each episode gets its own base URL, and taurl runs the retriever it calls.
"""

from __future__ import annotations

import json
import os
import urllib.request

from openai import DefaultHttpxClient, OpenAI

HTTP = DefaultHttpxClient()  # one connection pool for every run (one per client: ~0.2 s)
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search an encyclopedia of cities and countries.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]},
    },
}


def search(retriever_url: str, query: str) -> str:
    """The retriever service: POST {"query", "k"} -> {"text": passages}."""
    req = urllib.request.Request(f"{retriever_url}/search",
                                 data=json.dumps({"query": query, "k": 1}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)["text"]


def run_agent(task: str, base_url: str | None = None, retriever_url: str | None = None,
              max_steps: int = 4) -> str:
    """Answer `task`, searching when the model asks to; returns the final answer text."""
    client = OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"),
                    max_retries=0, http_client=HTTP)
    retriever_url = retriever_url or os.environ["TAURL_RETRIEVER_URL"]
    messages = [{"role": "user", "content": task}]
    for _ in range(max_steps):
        reply = client.chat.completions.create(model="policy", messages=messages,
                                               tools=[SEARCH]).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            return reply.content or ""
        for call in reply.tool_calls:
            query = json.loads(call.function.arguments).get("query", "")
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": search(retriever_url, query)})
    return ""


if __name__ == "__main__":
    print(run_agent(os.environ["TAURL_TASK"]))
