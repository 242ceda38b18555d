"""code-v0 trainable: the expert through the real loop, its quality knobs, the replay
holdout verifier, and the train / validation / holdout splits."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import pytest

from taurl.data.trajectory import StopReason, validate_trajectory
from taurl.envs import make_tasks
from taurl.envs.code import (
    FAMILIES,
    SPLITS,
    CodeEnv,
    ReplayVerifier,
    expert,
    generate_tasks,
    planted_bug,
    reference_source,
    tool_call,
    visible_cases,
)
from taurl.envs.code.tasks import PASS_MARKER, reference_function
from taurl.envs.registry import expert_option_problems, spec
from taurl.errors import ConfigError
from taurl.policy import build_tokenizer
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.synth import ScriptedEngine

CFG = RolloutConfig(max_turns=8, max_action_tokens=4096, max_episode_tokens=8192, max_context=16384,
                    max_observation_tokens=2048)


@pytest.fixture(scope="module")
def one_per_family():
    return [generate_tasks("train", 1, seed=0, families=[f])[0] for f in FAMILIES]


@pytest.fixture(scope="module")
def tok(one_per_family):
    env = CodeEnv()
    texts = [t.prompt for t in one_per_family] + [env.system_prompt, json.dumps(env.tools)]
    texts += [a for t in one_per_family for a in expert(t, random.Random(0))]
    return build_tokenizer(texts, vocab_size=700, model_max_length=16384)


def play(tok, task, actions, seed=0):
    traj = asyncio.run(
        run_episode(
            ScriptedEngine(tok, actions, max_context=16384), CodeEnv(), tok, task, seed=seed,
            config=CFG,
        )
    )
    return validate_trajectory(traj)


def instance(task):
    return task.metadata["family"], json.dumps(task.metadata["params"], sort_keys=True)


# -- the expert ----------------------------------------------------------------------------


def test_perfect_expert_solves_every_family_through_the_real_loop(tok, one_per_family):
    verifier = ReplayVerifier()
    for task in one_per_family:
        actions = expert(task, random.Random(1))
        assert actions == [
            tool_call("write_file", path="solution.py", content=reference_source(task)),
            tool_call("run_tests"),
            tool_call("submit"),
        ]
        traj = play(tok, task, actions)
        assert traj.stop_reason is StopReason.ANSWERED, (task.metadata["family"], traj.stop_reason)
        assert traj.reward_components["outcome"] == 1.0 and not any(t.invalid for t in traj.turns)
        assert PASS_MARKER in traj.turns[1].observation_text
        assert verifier(traj, task) == 1.0, verifier.last_detail


def test_every_planted_bug_is_revealed_by_the_visible_tests(one_per_family):
    for task in one_per_family + generate_tasks("train", 30, seed=3):
        fam = FAMILIES[task.metadata["family"]]
        bug = planted_bug(task, random.Random(task.task_id))
        assert bug is not None and bug != reference_source(task), task.task_id
        ns: dict = {}
        exec(bug, ns)  # our own template with other constants
        assert any(ns[fam.func](*a) != want for a, want in visible_cases(task)), task.task_id
        assert reference_function(fam, task.metadata["params"])  # the reference itself still builds


def test_buggy_drafts_are_repaired_when_tested(tok, one_per_family):
    task = one_per_family[0]
    actions = expert(task, random.Random(0), p_bug=1.0)
    assert [json.loads(a[11:-12])["name"] for a in actions] == [
        "write_file", "run_tests", "write_file", "run_tests", "submit",
    ]
    traj = play(tok, task, actions)
    assert (
        "FAIL" in traj.turns[1].observation_text and PASS_MARKER in traj.turns[3].observation_text
    )
    assert traj.reward_components["outcome"] == 1.0  # the repair loop rescues the draft
    untested = play(tok, task, expert(task, random.Random(0), p_bug=1.0, p_skip_tests=1.0))
    assert len(untested.turns) == 2 and untested.reward_components["outcome"] == 0.0


def test_degraded_expert_is_measurably_worse(tok):
    """Coupled draws: the same per-task rng for both settings, so only degradation differs."""
    tasks = generate_tasks("train", 24, seed=5)
    verifier = ReplayVerifier()
    good, bad, predicted = [], [], 0
    for i, task in enumerate(tasks):
        perfect = play(tok, task, expert(task, random.Random(i)), seed=i)
        degraded = play(
            tok, task, expert(task, random.Random(i), p_bug=0.5, p_skip_tests=0.5), seed=i
        )
        u_bug, u_skip = (r := random.Random(i)).random(), r.random()
        predicted += u_bug < 0.5 and u_skip < 0.5  # the only way a demo fails (expert docstring)
        good.append(perfect.reward_components["outcome"])
        bad.append(degraded.reward_components["outcome"])
        # the verifier agrees
        assert verifier(degraded, task) == degraded.reward_components["outcome"]
    assert sum(good) == len(tasks)
    # 1 − p_bug·p_skip ≈ 0.75 of them pass
    assert predicted >= 3 and sum(bad) == len(tasks) - predicted


def test_expert_knobs_are_checked():
    task = generate_tasks("train", 1)[0]
    with pytest.raises(ConfigError) as e:
        expert(task, random.Random(0), p_bug=1.5, p_skip_tests="often")
    assert len(e.value.problems) == 2
    assert (
        "did you mean 'p_skip_tests'" in expert_option_problems("code-v0", {"p_skip_test": 0.5})[0]
    )
    assert expert_option_problems("code-v0", {"p_bug": 0.3, "p_skip_tests": 0.5}) == []


# -- the holdout verifier --------------------------------------------------------------------


def test_verifier_rejects_tampered_records(tok, one_per_family):
    task = one_per_family[2]
    v = spec("code-v0").make_verifier()
    assert isinstance(v, ReplayVerifier) and v.version.startswith("code-replay-v2+code-hidden-v1")
    good = play(tok, task, expert(task, random.Random(0)))
    assert v(good, task) == 1.0
    failed = play(tok, task, expert(task, random.Random(0), p_bug=1.0, p_skip_tests=1.0))
    assert v(failed, task) == 0.0
    # 1. the reward (and the outcome) edited to a pass
    forged = dataclasses.replace(failed, reward=1.0, reward_components={"outcome": 1.0})
    assert v(forged, task) == 0.0 and "hidden test" in v.last_detail
    # 2. the written solution edited after the fact: the stub's text in place of the reference
    stub = f"def {task.metadata['func']}(*a):\n    return None\n"
    edited_turn = dataclasses.replace(
        good.turns[0], action_text=tool_call("write_file", path="solution.py", content=stub)
    )
    edited = dataclasses.replace(good, turns=(edited_turn, *good.turns[1:]))
    assert v(edited, task) == 0.0
    # 3. the submit cut off (the record still claims it answered)
    assert v(dataclasses.replace(good, turns=good.turns[:-1]), task) == 0.0
    assert "do not end by a submit" in v.last_detail
    # 4. a record judged against another task, or one that did not end by a submit
    assert v(good, one_per_family[3]) == 0.0 and "not" in v.last_detail
    assert v(dataclasses.replace(good, stop_reason=StopReason.MAX_TURNS), task) == 0.0
    # 5. an observation that claims success changes nothing
    lying = dataclasses.replace(failed.turns[0], observation_text=PASS_MARKER)
    assert v(dataclasses.replace(failed, turns=(lying, *failed.turns[1:])), task) == 0.0


def test_verifier_sees_what_run_python_did_to_the_workspace(tok, one_per_family):
    """A solution written by run_python (no write_file) is rebuilt by replaying the call."""
    task = one_per_family[4]
    code = f"open('solution.py', 'w').write({reference_source(task)!r})"
    traj = play(tok, task, [tool_call("run_python", code=code), tool_call("submit")])
    assert traj.reward_components["outcome"] == 1.0 and ReplayVerifier()(traj, task) == 1.0


# -- splits ----------------------------------------------------------------------------------


def test_splits_are_disjoint_by_instance():
    assert SPLITS == ("train", "validation", "holdout")
    by_split = {s: make_tasks("code-v0", s, n=n, seed=0) for s, n in
                (("train", 400), ("validation", 60), ("holdout", 120))}
    keys = {s: {instance(t) for t in ts} for s, ts in by_split.items()}
    for s, ts in by_split.items():
        assert all(t.split == s for t in ts) and len(keys[s]) == len(ts)
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["holdout"]
    assert not keys["validation"] & keys["holdout"]
    # other seeds draw other tasks of the same split, never crossing splits
    more = make_tasks("code-v0", "train", n=200, seed=7)
    assert {instance(t) for t in more} - keys["train"] and not {instance(t) for t in more} & keys[
        "holdout"
    ]
    assert (
        make_tasks("code-v0", "holdout", n=2, seed=0, families=["caesar"])[0].metadata["family"]
        == "caesar"
    )


# -- the env's tool subset and the tokenizer hook ----------------------------------------------


def test_tool_subset_is_declared_recorded_and_replayed(tok, one_per_family):
    env = CodeEnv(tools=["write_file", "run_tests", "submit"])
    assert [t["function"]["name"] for t in env.tools] == ["write_file", "run_tests", "submit"]
    with pytest.raises(ConfigError) as e:
        CodeEnv(tools=["write_fle", "run_tests"])
    assert "did you mean 'write_file'" in str(e.value) and "must include 'submit'" in str(e.value)
    task = one_per_family[4]
    code = f"open('solution.py', 'w').write({reference_source(task)!r})"
    actions = [tool_call("run_python", code=code), tool_call("submit")]
    traj = validate_trajectory(
        asyncio.run(
            run_episode(
                ScriptedEngine(tok, actions, max_context=16384), env, tok, task, seed=0, config=CFG
            )
        )
    )
    assert traj.provenance["tools"] == ["write_file", "run_tests", "submit"]
    # run_python is not offered
    assert traj.turns[0].invalid and traj.reward_components["outcome"] == 0.0
    # ...nor in the replay, which rebuilds the same world
    assert ReplayVerifier()(traj, task) == 0.0
    widened = dataclasses.replace(traj, provenance={"tools": "all of them"})
    assert ReplayVerifier()(widened, task) == 0.0


def test_tokenizer_texts_come_from_the_training_split_only():
    hooks = spec("code-v0").policy_hooks
    train = generate_tasks("train", 12, seed=0)
    texts = hooks.tokenizer_texts(CodeEnv(), train)
    assert any(PASS_MARKER in t for t in texts) and any("FAIL" in t for t in texts)
    held = generate_tasks("holdout", 40, seed=0) + generate_tasks("validation", 40, seed=0)
    joined = "\n".join(texts)
    assert not [t.task_id for t in held if t.prompt in joined]


def test_copy_warmup_strings_hold_the_constants():
    from taurl.envs.code.hooks import copy_strings

    task = generate_tasks("train", 1, families=["affine_filter"])[0]
    p = task.metadata["params"]
    strings = copy_strings(task)
    assert f"{p['a']} * x + {p['b']}" in strings[0] and strings[-1] == json.dumps(
        [p["a"], p["b"], p["m"], p["r"]]
    )
    from taurl.train.copy_warmup import copy_warmup_phase

    assert spec("code-v0").policy_hooks.warmup(None, None, [task], seed=0, lr=1e-3, grad_clip=1.0,
                                               log=lambda *a: None, steps=0,
                                               copy_phase=copy_warmup_phase) == {}


def test_compact_declarations_are_shorter_and_validated_as_before(tok, one_per_family):
    from taurl.rollout.loop import ChatCodec

    names = ["write_file", "run_tests", "submit"]
    full, compact = CodeEnv(tools=names), CodeEnv(tools=names, compact_tools=True)
    assert [t["function"]["name"] for t in compact.tools] == names
    assert compact.tools[0]["function"]["parameters"] == {
        "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"]}
    msgs = [{"role": "user", "content": one_per_family[0].prompt}]
    n = {k: len(tok(ChatCodec(tok, e.tools).render(msgs, True))["input_ids"]) for k, e in
         (("full", full), ("compact", compact))}
    assert n["compact"] < 0.8 * n["full"], n
    task = one_per_family[1]
    # the gate still checks calls against the full schema: an undeclared argument is refused
    actions = [
        tool_call("write_file", path="solution.py", content=reference_source(task), mode="w"),
        tool_call("write_file", path="solution.py", content=reference_source(task)),
        tool_call("submit"),
    ]
    traj = validate_trajectory(
        asyncio.run(
            run_episode(
                ScriptedEngine(tok, actions, max_context=16384), compact, tok, task, seed=0,
                config=CFG,
            )
        )
    )
    assert (
        traj.turns[0].invalid
        and not traj.turns[1].invalid
        and traj.reward_components["outcome"] == 1.0
    )
    assert traj.provenance == {"tools": names, "compact_tools": True, "parser": "hermes_or_json"}
    assert ReplayVerifier()(traj, task) == 1.0
    with pytest.raises(ConfigError, match="compact_tools must be true or false"):
        CodeEnv(compact_tools="yes")


def test_concurrent_demonstrations_equal_sequential_ones(tok):
    """Episodes in the sandbox overlap (astep), yet the records are the sequential ones."""
    from taurl.rollout.synth import demonstrations

    tasks = generate_tasks("train", 10, seed=7)
    options = {"p_bug": 0.5, "p_skip_tests": 0.5}

    def run(concurrency):
        return asyncio.run(
            demonstrations(
                tasks, tok, lambda: CodeEnv(compact_tools=True), expert=expert,
                expert_options=options, seed=3, config=CFG, concurrency=concurrency,
            )
        )

    seq, par = run(1), run(8)
    assert [d.episode_id for d in par] == [f"demo-{i}" for i in range(10)]
    for a, b in zip(seq, par, strict=True):
        assert (a.task_id, a.seed, a.token_ids, a.action_mask, a.reward, a.stop_reason) == \
               (b.task_id, b.seed, b.token_ids, b.action_mask, b.reward, b.stop_reason)
        assert [t.observation_text for t in a.turns] == [t.observation_text for t in b.turns]
    assert 0 < sum(d.reward_components["outcome"] for d in par) < 10  # the knobs made some fail
