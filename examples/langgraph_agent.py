"""A LangGraph ReAct search agent (`create_react_agent` + `ChatOpenAI`). It imports
nothing from taurl.

`taurl train` with ``agent: {callable: examples/langgraph_agent.py:run_agent}`` trains the
model inside it through the taurl proxy (docs/compatibility.md).
"""

from __future__ import annotations

import json
import os
import urllib.request

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


def run_agent(task: str, base_url: str | None = None, retriever_url: str | None = None) -> str:
    retriever_url = retriever_url or os.environ["TAURL_RETRIEVER_URL"]

    @tool
    def search(query: str) -> str:
        """Search an encyclopedia of cities and countries."""
        req = urllib.request.Request(f"{retriever_url}/search",
                                     data=json.dumps({"query": query, "k": 1}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)["text"]

    model = ChatOpenAI(model="policy", base_url=base_url,
                       api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=2)
    agent = create_react_agent(model, [search])
    state = agent.invoke({"messages": [("user", task)]}, {"recursion_limit": 8})
    return state["messages"][-1].content


if __name__ == "__main__":
    print(run_agent(os.environ["TAURL_TASK"], os.environ.get("OPENAI_BASE_URL")))
