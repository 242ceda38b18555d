"""The training proxy: train any agent on the `openai` or `anthropic` SDK unchanged.

* `server.ProxyServer`: ``/rollouts/{episode_id}/v1/chat/completions`` (and ``/completions``)
  in front of any taurl engine, with a reward and an end endpoint per episode; `app` its
  HTTP routes, `responses` the OpenAI Responses API, `messages` Anthropic's Messages API
  (each translated into the chat call it stands for, captured the same way);
* `mcp_endpoint`: each episode's MCP endpoint (streamable HTTP), tools behind the host gate;
* `capture.EpisodeCapture`: token-exact capture of every call (append-only extension,
  new segment chains when the agent rewrites history);
* `runner` / `collect`: the recipe's episodes run by a user's agent (``agent:`` config key);
* `experts`: expert demonstrations in the wire format, served through the agent itself;
* `tools`: MCP servers' tools for the agent, each call through taurl's host gate;
* `admission`: the protocol an async schedule plugs in to answer 429 + Retry-After.

Needs the ``proxy`` extra: ``pip install 'taurl[proxy]'`` (starlette, uvicorn).
"""
