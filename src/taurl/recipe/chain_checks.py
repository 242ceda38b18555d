"""Configs whose episodes can be chains of token streams, and the learners that refuse chains.

An episode becomes a chain of several token streams (`taurl.data.streams`) when the context
is compacted (``rollout.compaction``), when the chat template re-renders history it cannot
extend (a Qwen3-style template that drops earlier ``<think>`` blocks, on a chat env), or when
an agent behind the proxy rewrites its history (``agent:``). Three learners read one stream
per episode and refuse a chain: DPO (a pair compares two streams), distillation (the
teacher scores one stream) and a value-based estimator (``gae``: its critic reads V(s_t) off
one stream). They refused it at their first update, after the demonstrations and SFT were
paid for; `chain_problems` refuses the combination when the config is validated, before
any work, and says how to fix it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from taurl.errors import ContractError


def chain_sources(cfg: Any) -> list[str]:
    """What in `cfg` can make an episode a chain of token streams, in words (none: [])."""
    out = []
    if cfg.compaction.on:
        out.append(f"rollout.compaction (policy {cfg.compaction.policy}) begins a new token "
                   "stream when the context fills")
    if cfg.agent:
        out.append("agent: (your agent through the proxy) begins a new token stream when it "
                   "rewrites its history")
    if cfg.model and _chat_env(cfg.env) and template_rewrites_history(cfg.model):
        out.append(f"the chat template of {cfg.model} re-renders history (it drops earlier "
                   "<think> blocks), so a user message begins a new token stream")
    return out


def chain_problems(cfg: Any, stage: str) -> list[str]:
    """The problem of a learner that reads one token stream per episode meeting a config whose
    episodes can be chains; `stage` is `taurl.recipe.stages.stage_name(cfg)`."""
    from taurl.credit.registry import needs_values

    if stage == "dpo" and cfg.dpo.data:  # offline: the episodes are the file's
        chained = _chained_rows(cfg.dpo.data)
        return [f"rl.dpo.data {cfg.dpo.data} holds episodes of several token streams "
                f"({chained} rows, e.g. compacted ones); DPO compares one stream per episode: "
                "give episodes sampled without compaction"] if chained else []
    learner = {"dpo": "rl.objective: dpo compares two episodes as one token stream each",
               "distill": "rl.teacher (distillation) scores one token stream per episode",
               }.get(stage)
    fixes = ("drop rollout.compaction (raise max_context instead), agent:, or the model's "
             "history-rewriting template")
    if stage == "rl" and needs_values(cfg.estimator):
        learner = f"estimator: {cfg.estimator} fits a critic on one token stream per episode"
        fixes += ", or use an outcome estimator (grpo, rloo, gigpo)"
    if learner is None or not (sources := chain_sources(cfg)):
        return []
    return [f"{learner}, but {'; '.join(sources)}: {fixes}"]


def template_rewrites_history(model: str) -> bool:
    """Whether the chat template of the model directory `model` cannot take a user message as
    a delta after a thinking action (the loop would begin a new stream there). Probed as the
    loop appends: the prompt with the generation prompt, the action, then the next message."""
    from taurl.policy.tokenizer import load_tokenizer
    from taurl.rollout.stream import ChatCodec

    if not (Path(model) / "tokenizer_config.json").is_file():
        return False  # not a local directory (a hub id): the learner still refuses a chain
    try:
        codec = ChatCodec(load_tokenizer(model))
        first = [{"role": "user", "content": "q"}]
        stream = codec.render(first, add_generation_prompt=True) + "<think>t</think>a"
        action = {"role": "assistant", "content": "<think>t</think>a"}
        codec.delta(stream, [*first, action, {"role": "user", "content": "o"}], True)
    except ContractError:
        return True
    except Exception:  # noqa: BLE001 — a template that cannot render the probe: the loop says so
        return False
    return False


def _chat_env(env: str) -> bool:
    """False only for an env known to be inline (one assistant message: no user message follows)."""
    from taurl.envs import registry

    try:
        factory = registry.spec(env).factory
    except Exception:  # noqa: BLE001 — an unknown env is reported by the env checks
        return True
    return getattr(factory, "observation_style", "messages") != "inline"


def _chained_rows(path: str) -> int:
    """Rows of the JSONL trajectory file `path` that are chains (non-empty stream_starts)."""
    if not Path(path).is_file():
        return 0  # reported by the stage checks
    n = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                n += bool(line.strip() and json.loads(line).get("stream_starts"))
            except (ValueError, AttributeError):
                continue  # a broken row is reported when the file is read
    return n
