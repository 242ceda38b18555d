"""Agents built on the field's frameworks, unchanged, train through `taurl train
--config ... agent:`.

Each framework from the registry (the ``ecosystem`` extra): the OpenAI Agents SDK at its
defaults (the Responses API, `Runner.run`), a LangGraph ReAct agent (`create_react_agent` +
`ChatOpenAI`, Chat Completions) and an agent on the `anthropic` SDK (the Messages API). The
agents are the repository's examples (examples/*_agent.py, importing nothing from taurl).
Each run: expert demonstrations served through the agent (tool calls in the framework's own
format), SFT, 2 RL updates, evaluation — a tiny policy and a few tasks, so each run takes
seconds. Then every row of the ledger is checked token-exact against what the engines
actually produced: each mask-1 run is one engine call's sampled ids, sampled after exactly
the row's tokens before it (nothing re-tokenized), and the policy's rows' logprobs,
recomputed with the checkpoint of the version that sampled them, match within 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.data.trajectory import POLICY_SOURCE

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = {  # name: (the packages it needs, the example agent)
    "openai-agents": (("agents", "openai"), "examples/agents_sdk_agent.py:run_agent"),
    "langgraph": (("langgraph", "langchain_openai"), "examples/langgraph_agent.py:run_agent"),
    "anthropic": (("anthropic",), "examples/anthropic_agent.py:run_agent"),
}


def config(agent: str) -> dict:
    return {
        "env": "search-v0",
        "env_config": {"top_k": 1, "max_doc_chars": 60},
        "system_prompt": "",
        "task_options": {"families": ["city_country"], "split_by": "city"},
        "agent": {"callable": str(ROOT / agent), "timeout_s": 60, "max_calls": 3},
        "policy": {
            "size": "tiny",
            "vocab_size": 512,
            "chat_template": "chatml-compact",
            "warmup_options": {"steps": 2, "batch_size": 8},
            "tokenizer_texts": 1500,
        },
        "torch_threads": 1,
        "sft": {"demos": 4, "epochs": 1, "batch_size": 4, "warmup_steps": 1},
        "rollout": {
            "max_turns": 3,
            "max_action_tokens": 32,
            "max_episode_tokens": 96,
            "max_context": 1024,
            "concurrency": 4,
        },
        "rl": {"updates": 2, "tasks_per_update": 2, "group_size": 2, "keep_checkpoints": 0},
        "eval": {"tasks": 2, "trials": 1},
    }


class Calls:
    """Every engine call of the run: (prompt ids, sampled ids, logprobs), policy and scripted."""

    def __init__(self, monkeypatch):
        from taurl.policy.local_engine import LocalEngine
        from taurl.rollout.synth import ScriptedEngine

        self.seen: list[tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]] = []
        for cls in (LocalEngine, ScriptedEngine):
            inner = cls.generate

            async def generate(engine, prompt_ids, sampling, _inner=inner):
                g = await _inner(engine, prompt_ids, sampling)
                self.seen.append((tuple(prompt_ids), tuple(g.token_ids), tuple(g.logprobs)))
                return g

            monkeypatch.setattr(cls, "generate", generate)


def streams(t) -> list[list]:
    """A row's token streams (a new one at each prompt segment: a chain's,
    docs/long_horizons.md)."""
    out: list[list] = []
    for seg in t.segments:
        if seg.kind == "prompt" or not out:
            out.append([])
        out[-1].append(seg)
    return out


def check_token_exact(run: RunDir, calls: Calls) -> dict[str, int]:
    """Every ledger row against the engine calls (module docstring); counts of what was checked."""
    from taurl.policy.model import load_policy

    by_prompt = {(p, ids): lps for p, ids, lps in calls.seen}
    models: dict[int, object] = {}
    counts = {"rows": 0, "policy_rows": 0, "actions": 0, "tool_calls": 0}
    with Ledger(run.ledger) as ledger:
        rows = list(ledger.iter_query())
    for t in rows:
        counts["rows"] += 1
        counts["tool_calls"] += t.num_tool_calls
        for stream in streams(t):
            ids: list[int] = []
            mask: list[int] = []
            lps: list[float] = []
            for seg in stream:
                # one engine call's sampled ids, after exactly the stream's tokens so far
                if seg.kind == "action":
                    key = (tuple(ids), tuple(seg.token_ids))
                    assert key in by_prompt, (
                        f"{t.episode_id}: an action no engine call sampled after this prefix"
                    )
                    if t.source == POLICY_SOURCE:
                        # stored as float32
                        assert seg.logprobs == pytest.approx(by_prompt[key], abs=1e-6)
                        lps += seg.logprobs
                    counts["actions"] += 1
                ids += seg.token_ids
                mask += [int(seg.kind == "action")] * len(seg.token_ids)
            if t.source == POLICY_SOURCE:
                (version,) = {s.policy_version for s in stream if s.kind == "action"}
                if version not in models:
                    models[version] = load_policy(run.checkpoint(version))[0]
                x = torch.tensor([ids])
                with torch.no_grad():  # temperature 1.0, the config's
                    lp = torch.log_softmax(models[version](input_ids=x).logits[0, :-1].float(), -1)
                got = lp.gather(-1, x[0, 1:, None])[:, 0][torch.tensor(mask[1:], dtype=torch.bool)]
                assert float((got - torch.tensor(lps)).abs().max()) <= 1e-4, t.episode_id
        counts["policy_rows"] += t.source == POLICY_SOURCE
    return counts


# LangGraph 1.x's; still the documented agent
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_an_unchanged_framework_agent_trains_two_updates_token_exact(
    framework, tmp_path, monkeypatch, capsys
):
    from taurl.cli.main import main

    modules, agent = FRAMEWORKS[framework]
    for m in modules:
        pytest.importorskip(m)
    calls = Calls(monkeypatch)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config(agent)))
    code = main(
        [
            "train", "--config", str(tmp_path / "cfg.yaml"), "--run-dir", str(tmp_path / "run"),
            "--no-progress",
        ]
    )
    assert code == 0, capsys.readouterr().err[-3000:]
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["train"]["updates"] == 2
    counts = check_token_exact(RunDir(tmp_path / "run"), calls)
    # demos (4) + 2 updates x 2 tasks x 2 + evaluations, every one checked; the demos' tool
    # calls went through the framework's own tool-call format and came back as receipts
    assert counts["rows"] >= 12 and counts["policy_rows"] >= 8 and counts["tool_calls"] >= 2, counts
