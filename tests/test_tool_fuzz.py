"""Fuzzed tool calls never crash an episode; injected tool failures are all accounted for.

* hypothesis: arbitrary text, malformed JSON, random names and argument values, huge
  arguments — each step returns a clear observation and counts the problem exactly once
  (``invalid``, or a receipt whose status says what happened);
* 1,000 episodes through `run_episodes` where a wrapper makes 30% of tool executions
  raise or hang: every episode comes back as a valid record, and the errors and
  timeouts in the trajectories equal the injected ones, one for one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taurl.data.trajectory import StopReason, validate_trajectory
from taurl.envs.core import Task
from taurl.policy import build_tokenizer
from taurl.policy.engine import Generation
from taurl.reward import ExactMatchVerifier
from taurl.rollout.loop import RolloutConfig, run_episode, run_episodes
from taurl.rollout.synth import ScriptedEngine
from taurl.tools import ToolEnv, ToolSpec, tool


@tool(max_string_chars=1000)
def echo(text: str) -> str:
    """Repeat the text."""
    return text


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def submit(answer: str) -> str:
    """Submit the final answer."""
    return answer


TOOLS = [echo, add, submit]


class FuzzEnv(ToolEnv):
    name = "fuzz-v0"

    def __init__(self, tools: list[ToolSpec] = TOOLS, **kw):
        super().__init__(tools, verifier_factory=ExactMatchVerifier, **kw)


def task(i: int) -> Task:
    return Task(
        f"fz-{i:05d}", f"Task fz-{i:05d}: add 2 and 3, then submit the sum.", ("5",), "train",
        "fuzz-v0",
    )


def call(name, **args) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


# -- hypothesis: one step at a time ------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
NAMES = st.sampled_from(
    ["echo", "add", "submit", "ech0", "Add", "", "rm -rf /", "x" * 300]
) | st.text(max_size=30)
ACTIONS = st.one_of(
    st.text(max_size=200),  # anything at all
    st.text(max_size=200).map(lambda s: f"<tool_call>{s}</tool_call>"),  # malformed JSON
    st.builds(
        lambda n, a: f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>",
        NAMES,
        JSON,
    ),
    st.builds(
        lambda a: call("add", **a),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), JSON, max_size=3),
    ),
    st.integers(1001, 300_000).map(lambda n: call("echo", text="y" * n)),  # huge arguments
    st.builds(
        lambda n, a: f'<tool_call>{{"name": {json.dumps(n)}, "arguments": {a}',
        NAMES,
        st.text(max_size=20),
    ),
)


def check_step(obs, reward, terminated, truncated, info) -> str:
    """The step's one accounted outcome: "invalid", or the receipt's status."""
    assert isinstance(obs, str) and obs
    receipt = info.get("receipt")
    if info["invalid"]:
        assert obs.startswith("Error: ") and len(obs) < 2000  # clear, and short even for huge input
        assert receipt is None or receipt.decision == "denied"
        return "invalid"
    assert receipt is not None and receipt.decision == "allowed"
    if receipt.status != "ok":
        assert info["error"] and obs.startswith("Error: ")
    return receipt.status


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
def test_any_action_gets_a_clear_observation(action):
    env = FuzzEnv()
    env.reset(task(0), 0)
    out = env.step(action)
    outcome = check_step(*out)
    assert outcome in ("invalid", "ok")  # these tools never fail on their own
    if outcome == "invalid" and "<tool_call>" in action and out[4]["action"]["kind"] == "tool_call":
        assert re.match(r"(unknown_tool|schema): ", out[4]["receipt"].reason)


def test_known_problems_say_what_was_wrong():
    env = FuzzEnv()
    cases = {
        '<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>': "is not valid JSON",
        call("ad", a=1, b=2): "Did you mean 'add'?",
        call("add", a="1", b=2): "argument 'a' must be an integer, got string",
        call("add", a=1): "missing required argument 'b'",
        call("echo", text="z" * 5000): "argument 'text' is 5000 characters long; the limit is 1000",
        "just text": "no tool call found",
    }
    for action, says in cases.items():
        env.reset(task(0), 0)
        obs, *_ = env.step(action)
        assert says in obs, (action[:60], obs)


@pytest.fixture(scope="module")
def tok():
    texts = [
        task(0).prompt, call("add", a=2, b=3), call("echo", text="hi"), call("submit", answer="5"),
    ]
    return build_tokenizer(texts, vocab_size=500, model_max_length=8192)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(ACTIONS, min_size=1, max_size=5))
def test_fuzzed_episodes_never_crash(tok, actions):
    cfg = RolloutConfig(
        max_turns=6, max_action_tokens=4096, max_episode_tokens=20000, max_context=8192
    )
    traj = validate_trajectory(
        asyncio.run(
            run_episode(
                ScriptedEngine(tok, actions, max_context=8192), FuzzEnv(), tok, task(0), seed=0,
                config=cfg,
            )
        )
    )
    assert traj.metadata.get("error") is None or "env.step raised" not in traj.metadata["error"]
    for t in traj.turns:
        assert t.invalid or t.receipt is not None or t.finish_reason == "eos"


# -- 1,000 episodes with injected failures -------------------------------------------------


class Injector:
    """Wraps tools so that `rate` of executions raise or hang (half each), seeded."""

    def __init__(self, rate: float, seed: int = 0, hang_timeout_s: float = 0.003):
        self.rate, self.rng, self.hang_timeout_s = rate, random.Random(seed), hang_timeout_s
        self.counts: Counter[str] = Counter()

    def wrap(self, spec: ToolSpec) -> ToolSpec:
        async def run(**kwargs):
            self.counts["executions"] += 1
            roll = self.rng.random()
            if roll < self.rate / 2:
                self.counts["error"] += 1
                raise RuntimeError("injected failure")
            if roll < self.rate:
                self.counts["timeout"] += 1
                await asyncio.Event().wait()  # hangs until the executor's timeout cancels it
            return spec.fn(**kwargs)

        return dataclasses.replace(spec, fn=run, is_async=True, timeout_s=self.hang_timeout_s)


class TaskScriptEngine:
    """Plays each task's script; the turn is the number of tool responses in the prompt."""

    def __init__(self, tok, scripts: dict[str, list[str]]):
        self.tok = tok
        self.scripts = {
            k: [tok(a, add_special_tokens=False)["input_ids"] for a in v]
            for k, v in scripts.items()
        }
        self.response_id = tok.convert_tokens_to_ids("<tool_response>")
        self.start_id = tok.convert_tokens_to_ids("<|im_start|>")
        self.version, self.max_context = 0, 8192

    async def generate(self, prompt_ids, sampling):
        ids = list(prompt_ids)
        # system, then the user's message
        user = [i for i, t in enumerate(ids) if t == self.start_id][1]
        task_id = re.search(r"Task (fz-\d+)", self.tok.decode(ids[user:user + 40])).group(1)
        turn = list(prompt_ids).count(self.response_id)
        script = self.scripts[task_id]
        if turn < len(script):
            return Generation(
                list(script[turn]), [0.0] * len(script[turn]), "stop", 0, len(prompt_ids)
            )
        return Generation([self.tok.eos_token_id], [0.0], "eos", 0, len(prompt_ids))


def test_thousand_episodes_with_injected_failures(tok):
    inj = Injector(rate=0.3)
    tools = [inj.wrap(t) for t in TOOLS]
    tasks = [task(i) for i in range(1000)]
    script = [call("echo", text="start"), call("add", a=2, b=3), call("echo", text="sum is 5"),
              call("submit", answer="5")]
    engine = TaskScriptEngine(tok, {t.task_id: script for t in tasks})
    cfg = RolloutConfig(
        max_turns=6, max_action_tokens=256, max_episode_tokens=2048, max_context=8192
    )
    result = asyncio.run(
        run_episodes(engine, lambda: FuzzEnv(tools), tok, tasks, config=cfg, concurrency=64)
    )

    assert result.failures == [] and len(result.trajectories) == 1000
    assert sorted(t.task_id for t in result.trajectories) == [t.task_id for t in tasks]  # none lost
    seen: Counter[str] = Counter()
    for traj in result.trajectories:
        validate_trajectory(traj)
        for t in traj.turns:
            if t.finish_reason == "eos":  # the script ran out: a message without a tool call
                assert t.invalid and t.receipt is None
                # only more of the same
                assert all(u.finish_reason == "eos" for u in traj.turns[t.index:])
                continue
            assert t.receipt is not None and not t.invalid
            seen[t.receipt.status] += 1
            if t.receipt.status != "ok":
                assert t.error and t.receipt.reason == t.error
                assert t.observation_segment is None or t.observation_text.count("Error: tool") == 1
        if traj.stop_reason is StopReason.ANSWERED:
            assert (
                traj.turns[-1].receipt.tool == "submit" and traj.reward_components["outcome"] == 1.0
            )
        elif traj.stop_reason is StopReason.ERROR:  # three tool failures in a row
            assert [t.receipt.status != "ok" for t in traj.turns[-3:]] == [
                True
            ] * 3 and not traj.valid
        else:  # the submit call itself failed, the script ran out: turns run out on empty messages
            assert traj.stop_reason is StopReason.MAX_TURNS
            assert [u.receipt.tool for u in traj.turns if u.receipt][-1] == "submit"
    assert seen["error"] == inj.counts["error"] and seen["timeout"] == inj.counts["timeout"]
    assert seen["ok"] + seen["error"] + seen["timeout"] == inj.counts["executions"]
    assert 0.25 < (inj.counts["error"] + inj.counts["timeout"]) / inj.counts["executions"] < 0.35
    stops = Counter(t.stop_reason for t in result.trajectories)
    assert (
        stops[StopReason.ANSWERED] > 500
        and stops[StopReason.ERROR] > 0
        and stops[StopReason.MAX_TURNS] > 0
    )
