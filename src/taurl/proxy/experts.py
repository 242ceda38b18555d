"""Expert demonstrations in the proxy's wire format: the same start for an agent's policy.

The built-in demo SFTs its policy on expert episodes run through the real loop. An agent
trained through the proxy gets the same start: the expert's replies are served *through
the proxy to the agent itself* by a per-episode `ReplyEngine`, so the demonstrations are
rendered with the agent's own system prompt, tool schemas and history handling, in the
chat/tool-call format the proxy serves (Hermes ``<tool_call>`` blocks, `taurl.tools.parsers`).

An expert here is ``expert(task, rng, **options) -> [reply text, ...]``, one per model
call: the agent config's ``expert``, else the env's registered ``tool_expert``
(`taurl.envs.spec.EnvSpec`; search-v0's is `taurl.envs.search.expert.search_tool_expert`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taurl.rollout.synth import ScriptedEngine


class ReplyEngine(ScriptedEngine):
    """Plays fixed replies, one per call, each ended by EOS (the model learns to end its turn).

    Not a policy (`source` "expert"): the runner records its actions without logprobs or version.
    """

    def __init__(self, tokenizer: Any, replies: Sequence[str], max_context: int = 2048):
        super().__init__(tokenizer, replies, max_context, source="expert", eos_each=True)
