"""A search agent on the OpenAI Agents SDK at its defaults (the Responses API, `Runner.run`).
It imports nothing from taurl.

`taurl train` with ``agent: {callable: examples/agents_sdk_agent.py:run_agent}`` trains the
model inside it through the taurl proxy (docs/compatibility.md): each episode gets its own
base URL, and taurl runs the retriever its tool calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request

from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.models.openai_provider import OpenAIProvider

# traces go to OpenAI's servers by default; this agent talks to a local model
set_tracing_disabled(True)


async def run_agent(task: str, base_url: str | None = None,
                    retriever_url: str | None = None) -> str:
    retriever_url = retriever_url or os.environ["TAURL_RETRIEVER_URL"]

    @function_tool
    def search(query: str) -> str:
        """Search an encyclopedia of cities and countries.

        Args:
            query: Words to look for, e.g. a city name.
        """
        req = urllib.request.Request(f"{retriever_url}/search",
                                     data=json.dumps({"query": query, "k": 1}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)["text"]

    agent = Agent(name="geographer", instructions="Answer in <answer></answer>.", tools=[search])
    provider = OpenAIProvider(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "none"))
    result = await Runner.run(agent, task, max_turns=4,
                              run_config=RunConfig(model_provider=provider))
    return str(result.final_output)


if __name__ == "__main__":
    print(asyncio.run(run_agent(os.environ["TAURL_TASK"], os.environ.get("OPENAI_BASE_URL"))))
