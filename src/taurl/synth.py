"""Demonstrations: a scripted expert for the search env, run through the real agent loop.

The expert knows which query finds the answer (the task's subject, then for two-hop
questions its bridge entity). It acts through `ScriptedEngine`, an Engine whose
"sampling" encodes the expert's text, so demonstrations are built by the very same
token-exact loop as rollouts: same prompt rendering, same observation encoding, same
masks. Expert actions carry logprob 0 (the expert is deterministic) and policy version 0;
their trajectories say ``metadata["source"] = "expert"``.

`quality` knobs degrade the expert on purpose (documented in the README): with
probability `p_skip_search` it answers without searching (from its own knowledge, which
is right with probability `p_guess_right`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from taurl.envs.core import Task
from taurl.policy.engine import Generation, SamplingParams


@dataclass(frozen=True)
class ExpertQuality:
    p_skip_search: float = 0.0  # share of demos that answer without searching
    p_guess_right: float = 0.5  # when skipping, chance that the guess is right


def expert_actions(task: Task, quality: ExpertQuality = ExpertQuality(), rng: random.Random | None = None) -> list[str]:
    """The expert's actions for `task`, one string per turn (Search-R1 format)."""
    rng = rng or random.Random(0)
    subject = task.metadata.get("subject", task.prompt)
    answer = task.answers[0]
    if rng.random() < quality.p_skip_search:
        guess = answer if rng.random() < quality.p_guess_right else subject
        return [f"<think>I know this.</think>\n<answer>{guess}</answer>"]
    actions = [f"<think>I need to find {subject}.</think>\n<search>{subject}</search>"]
    bridge = task.metadata.get("bridge")
    if bridge:
        kind = task.metadata.get("answer_kind", "")
        query = f"{bridge} {'capital' if kind == 'city' else kind}".strip()
        actions.append(f"<think>{subject} is in {bridge}. Now I need {kind} of {bridge}.</think>\n<search>{query}</search>")
    actions.append(f"<think>I found it.</think>\n<answer>{answer}</answer>")
    return actions


class ScriptedEngine:
    """An Engine that plays a fixed list of action strings, one per call.

    Each action is encoded once with the policy's tokenizer; when the list runs out the
    engine ends the turn with EOS. It serves one episode.
    """

    def __init__(self, tokenizer, actions: Sequence[str], max_context: int = 2048):
        self.tokenizer = tokenizer
        self.actions = list(actions)
        self._max_context = max_context
        self._calls = 0

    @property
    def version(self) -> int:
        return 0

    @property
    def max_context(self) -> int:
        return self._max_context

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        if self._calls < len(self.actions):
            text, reason = self.actions[self._calls], "stop"
        else:
            text, reason = "", "eos"
        self._calls += 1
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
        if reason == "eos":
            ids.append(self.tokenizer.eos_token_id)
        ids = ids[:sampling.max_tokens]
        return Generation(ids, [0.0] * len(ids), reason, 0, prompt_tokens=len(prompt_ids))
