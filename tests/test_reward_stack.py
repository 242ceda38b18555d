"""The reward stack: layers, clipping, voiding; a ToolEnv's components through the real loop."""

from __future__ import annotations

import asyncio
import json

import pytest

from taurl.data.trajectory import StopReason, validate_trajectory
from taurl.envs.core import Task
from taurl.errors import ConfigError
from taurl.policy import build_tokenizer
from taurl.reward import ExactMatchVerifier, RewardStack, Violation
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.synth import ScriptedEngine
from taurl.tools import GateConfig, ToolEnv, tool

STACK = RewardStack(shaping_weights={"invalid_actions": -0.02, "tests": 0.05}, shaping_clip=0.1)


def test_layers_sum_to_the_total():
    b = STACK.combine(1.0, [], {"invalid_actions": 2}, verifier_version="v")
    assert b.components == {"outcome": 1.0, "constraint": 0.0, "shaping": pytest.approx(-0.04)}
    assert b.total == pytest.approx(0.96) and b.verifier_version == "v"
    assert b.info()["reward_components"] == b.components and b.info()["violations"] == []


def test_shaping_is_clipped_and_unknown_signals_count_zero():
    assert STACK.shaping({"invalid_actions": 100}) == -0.1  # -2.0 clipped to -c
    assert STACK.shaping({"tests": 10}) == 0.1
    assert STACK.shaping({"unknown": 5}) == 0.0


def test_violations_add_penalties_and_may_void_the_outcome():
    cheat = Violation("tests_modified", "edited", penalty=-1.0)
    b = STACK.combine(1.0, [cheat], verifier_version="v")
    assert b.components["outcome"] == 0.0 and b.components["constraint"] == -1.0 and b.total == -1.0
    soft = Violation("max_calls", "budget", penalty=-0.25, voids_outcome=False)
    b = STACK.combine(1.0, [soft, soft], verifier_version="v")
    assert b.components["outcome"] == 1.0 and b.total == pytest.approx(0.5)
    assert [v["rule"] for v in b.info()["violations"]] == ["max_calls", "max_calls"]


def test_bad_configuration_is_refused():
    with pytest.raises(ConfigError) as e:
        RewardStack(outcome_weight=0.0, shaping_clip=2.0, shaping_weights={"x": float("nan")})
    assert len(e.value.problems) == 3
    with pytest.raises(ConfigError, match="penalty"):
        Violation("r", "d", penalty=0.5)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        STACK.combine(1.5, verifier_version="v")


# -- a tiny ToolEnv through run_episode ----------------------------------------------------


class AnswerEnv(ToolEnv):
    """Answer a question with a lookup tool and submit(answer); exact match decides."""

    name = "answer-v0"

    def __init__(self, factory=ExactMatchVerifier, **kw):
        super().__init__(
            [tool(self.lookup), tool(self.submit), tool(self.delete_all, scopes=("destructive",))],
            verifier_factory=factory,
            **kw,
        )

    def lookup(self, key: str) -> str:
        """Look a key up."""
        return {"capital": "Paris"}.get(key, "unknown")

    def submit(self, answer: str) -> str:
        """Submit the final answer."""
        return answer

    def delete_all(self) -> str:
        """Delete everything."""
        return "deleted"


TASK = Task("q1", "What is the capital of France?", ("Paris",), "train", "answer-v0")


def call(name: str, **args) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(
        [TASK.prompt, call("lookup", key="capital"), "Paris unknown"], vocab_size=600
    )


def episode(tok, env, actions):
    return asyncio.run(run_episode(ScriptedEngine(tok, actions), env, tok, TASK, seed=0,
                                   config=RolloutConfig(max_turns=8, max_action_tokens=200)))


def test_components_reach_the_trajectory(tok):
    traj = validate_trajectory(episode(tok, AnswerEnv(), [
        "let me see", call("lookup", key="capital"), call("submit", answer="paris")]))
    assert traj.stop_reason is StopReason.ANSWERED
    assert traj.reward_components == {
        "outcome": 1.0,
        "constraint": 0.0,
        "shaping": pytest.approx(-0.02),
    }
    assert traj.reward == pytest.approx(0.98) and traj.verifier_version == "em-v1"
    assert [t.invalid for t in traj.turns] == [True, False, False]
    assert [t.receipt.status if t.receipt else None for t in traj.turns] == [None, "ok", "ok"]


def test_hard_violation_truncates_with_a_penalty(tok):
    traj = validate_trajectory(
        episode(tok, AnswerEnv(), [call("delete_all"), call("submit", answer="Paris")])
    )
    assert traj.truncated and traj.stop_reason is StopReason.TOOL_BUDGET and len(traj.turns) == 1
    # + shaping
    assert traj.reward_components["constraint"] == -1.0 and traj.reward == pytest.approx(-1.02)
    assert traj.turns[0].receipt.decision == "denied" and traj.turns[0].action["violations"] == [
        "scope"
    ]
    assert traj.valid  # the agent's own doing: a valid sample that teaches the penalty


def test_budget_runs_out(tok):
    env = AnswerEnv(gate=GateConfig(max_calls=1))
    traj = validate_trajectory(
        episode(tok, env, [call("lookup", key="x"), call("lookup", key="capital")])
    )
    assert traj.stop_reason is StopReason.TOOL_BUDGET and traj.turns[-1].receipt.reason.startswith(
        "max_calls:"
    )
    # budgets truncate without a penalty by default
    assert traj.reward_components["constraint"] == 0.0


def test_max_turns_and_a_fresh_verifier_per_episode(tok):
    made = []

    def factory():
        made.append(ExactMatchVerifier())
        return made[-1]

    env = AnswerEnv(factory, max_turns=2)
    traj = validate_trajectory(episode(tok, env, ["a", "b", "c"]))
    assert traj.stop_reason is StopReason.MAX_TURNS and traj.reward == pytest.approx(-0.04)
    episode(tok, env, [call("submit", answer="Paris")])
    episode(tok, env, [call("submit", answer="Paris")])
    assert len(made) == 3 and len({id(v) for v in made}) == 3  # 1 at init (version), 1 per submit
    assert env.make_verifier() is not env.make_verifier()


def test_astep_lets_episodes_overlap():
    """Two episodes awaited together: the async step runs tools on the caller's loop."""

    async def one(answer: str):
        env = AnswerEnv()
        env.reset(TASK, 0)
        await env.astep(call("lookup", key="capital"))
        return await env.astep(call("submit", answer=answer))

    async def both():
        return await asyncio.gather(one("Paris"), one("Lyon"))

    right, wrong = asyncio.run(both())
    assert (
        right[1] == 1.0
        and right[2]
        and wrong[1] == 0.0
        and wrong[4]["verdict"]["detail"] == "'Lyon' is not a gold answer"
    )


def test_a_broken_verifier_ends_the_episode_as_invalid(tok):
    class Broken:
        version = "broken-v0"

        def verify(self, task, submission):
            raise KeyError("oops")

    traj = validate_trajectory(episode(tok, AnswerEnv(Broken), [call("submit", answer="Paris")]))
    assert traj.stop_reason is StopReason.ERROR and not traj.valid and traj.reward == 0.0
    assert (
        "verifier raised KeyError" in traj.metadata["error"]
        and traj.verifier_version == "broken-v0"
    )
