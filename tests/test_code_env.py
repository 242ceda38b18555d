"""code-v0: tasks and splits, the hidden-test verifier, the tools, check_env, the real loop."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from taurl.data.trajectory import StopReason, validate_trajectory
from taurl.envs import check_env, make, registered
from taurl.envs.checker import check_tool
from taurl.envs.code import (
    FAMILIES,
    CodeEnv,
    HiddenTestVerifier,
    Submission,
    generate_tasks,
    hidden_cases,
    make_verifier,
    reference_source,
    visible_cases,
)
from taurl.envs.code.env import CALL_EXAMPLE
from taurl.envs.code.tasks import HIDDEN_CASES, VISIBLE_TEST_FILE, cases_sha256, visible_test_source
from taurl.envs.code.verifier import _sha256
from taurl.errors import ConfigError
from taurl.policy import build_tokenizer
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.synth import ScriptedEngine
from taurl.tools import SandboxConfig, SandboxLimits


def call(name: str, **args) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


def clean_files(task) -> dict[str, str]:
    return {VISIBLE_TEST_FILE: _sha256(visible_test_source(task))}


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks("train", 20, seed=0)


# -- tasks -------------------------------------------------------------------------------


def test_generate_tasks_is_deterministic_balanced_and_split(tasks):
    assert [t.task_id for t in generate_tasks("train", 20, seed=0)] == [t.task_id for t in tasks]
    assert [t.task_id for t in generate_tasks("train", 20, seed=1)] != [t.task_id for t in tasks]
    assert len({t.task_id for t in tasks}) == 20 and all(
        t.env == "code-v0" and t.split == "train" for t in tasks
    )
    assert {t.metadata["family"] for t in tasks[:len(FAMILIES)]} == set(FAMILIES)  # round robin
    holdout = generate_tasks("holdout", 60, seed=0)
    train = generate_tasks("train", 300, seed=0)
    key = lambda t: (  # noqa: E731
        t.metadata["family"], json.dumps(t.metadata["params"], sort_keys=True)
    )
    assert not {key(t) for t in holdout} & {key(t) for t in train}  # no instance in both splits
    assert all(t.split == "holdout" for t in holdout)


def test_generate_tasks_reports_all_problems():
    with pytest.raises(ConfigError) as e:
        generate_tasks("dev", -1, families=["caesr"])
    text = str(e.value)
    assert len(e.value.problems) == 3 and "did you mean 'caesar'" in text
    with pytest.raises(ConfigError, match="only"):
        generate_tasks("holdout", 500, families=["caesar"])  # 25 shifts in all


def test_hidden_cases_are_pinned_and_differ_from_visible(tasks):
    for t in tasks:
        hidden, visible = hidden_cases(t), visible_cases(t)
        assert len(hidden) == HIDDEN_CASES and len(visible) == 3
        assert cases_sha256(hidden) == t.metadata["hidden_sha256"]
        assert not {json.dumps(a) for a, _ in visible} & {json.dumps(a) for a, _ in hidden}


# -- the verifier ------------------------------------------------------------------------


def test_reference_passes_and_stub_fails_for_every_family():
    verifier = HiddenTestVerifier()
    for family in FAMILIES:
        task = generate_tasks("train", 1, seed=0, families=[family])[0]
        ok = verifier.verify(task, Submission(reference_source(task), clean_files(task)))
        assert ok.passed and ok.violations == () and ok.metrics["cases_passed"] == HIDDEN_CASES, (
            family,
            ok.detail,
        )
    stub = f"def {task.metadata['func']}(*a):\n    raise NotImplementedError\n"
    bad = verifier.verify(task, Submission(stub, clean_files(task)))
    assert (
        bad.score == 0
        and "hidden test 1 of 12 raised NotImplementedError" in bad.detail
        and not bad.violations
    )


def test_first_failure_is_reported():
    task = generate_tasks("train", 1, seed=0, families=["caesar"])[0]
    wrong = "def shift(s):\n    return s if s else ''\n"  # right only for the empty string (case 1)
    v = make_verifier().verify(task, Submission(wrong, clean_files(task)))
    assert v.score == 0 and v.metrics["cases_passed"] == 1
    assert v.detail.startswith("hidden test 2 of 12 failed: shift('xyz') returned 'xyz', expected")


def test_verifier_runs_in_a_fresh_sandbox_with_only_the_solution():
    """A helper module from the episode's workspace does not follow the solution."""
    task = generate_tasks("train", 1, seed=0, families=["caesar"])[0]
    env = CodeEnv()
    env.reset(task, 0)
    helper = reference_source(task).replace("def shift", "def real_shift")
    env.step(call("write_file", path="helper.py", content=helper))
    env.step(
        call("write_file", path="solution.py", content="from helper import real_shift as shift\n")
    )
    obs, *_ = env.step(call("run_tests"))
    assert "ALL VISIBLE TESTS PASSED" in obs  # works in the episode's workspace
    obs, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and info["reward_components"]["outcome"] == 0
    assert "No module named 'helper'" in info["verdict"]["detail"]


def test_hidden_tests_are_out_of_the_agents_reach():
    """Every file the agent can read outside the system's /usr holds no hidden test.

    The probe reads regular files only and lists where symlinks lead instead of reading
    through them: /etc/alternatives links to 1 MB binaries in /usr, and reading those
    from a cold page cache ran past the sandbox's 5 s on a fresh CI machine."""
    task = generate_tasks("train", 1, seed=0, families=["run_length"])[0]
    needles = [task.metadata["hidden_sha256"], json.dumps(hidden_cases(task))[:40]]
    probe = (
        f"import os, stat\nneedles = {needles!r}\nhits, links = [], set()\n"
        "for top in ('/workspace', '/tmp', '/etc', '/dev/shm', '/proc/self'):\n"
        "    for d, _, files in os.walk(top):\n"
        "        for f in files:\n"
        "            path = os.path.join(d, f)\n"
        "            try:\n"
        "                if os.path.islink(path):\n"
        "                    links.add(os.path.realpath(path).split('/')[1])\n"
        "                    continue\n"
        "                if not stat.S_ISREG(os.lstat(path).st_mode):\n"
        "                    continue\n"
        "                data = open(path, errors='replace').read(1 << 20)\n"
        "            except OSError:\n                continue\n"
        "            hits += [path for n in needles if n in data]\n"
        "print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
        "print('files', sorted(os.listdir('/workspace')))\nprint('hits', hits)\n"
        "print('links', sorted(links))\n")
    env = CodeEnv()
    env.reset(task, 0)
    obs, *_ = env.step(call("run_python", code=probe))
    assert "hits []" in obs and "files ['solution.py', 'test_visible.py']" in obs, obs
    # symlinks lead only into the system, the sandbox's own trees or nowhere readable
    links = set(json.loads(obs.split("links ")[1].split("\n")[0].replace("'", '"')))
    assert links <= {"usr", "proc", "dev", "etc", "tmp", "workspace"}, links
    pids = json.loads(obs.split("pids ")[1].split("\n")[0])
    assert max(pids) < 10  # only the sandbox's own processes are visible
    env.close()


def test_changed_hidden_tests_make_the_sample_invalid():
    task = generate_tasks("train", 1, seed=0, families=["caesar"])[0]
    drifted = dataclasses.replace(task, metadata={**task.metadata, "hidden_sha256": "0" * 64})
    env = CodeEnv()
    env.reset(drifted, 0)
    env.step(call("write_file", path="solution.py", content=reference_source(task)))
    _, reward, terminated, truncated, info = env.step(call("submit"))
    assert truncated and not terminated and info["stop_reason"] == "error" and reward == 0
    assert "hash differs" in info["error"]


# -- the env -----------------------------------------------------------------------------


def test_registered_and_declared():
    assert "code-v0" in registered()
    env = make("code-v0")
    assert env.observation_style == "messages" and env.stop == ("</tool_call>",)
    assert [t["function"]["name"] for t in env.tools] == [
        "write_file", "read_file", "run_python", "run_tests", "submit",
    ]
    for t in env.tools:
        check_tool(t)
    assert env.verifier_version == "code-hidden-v1"
    with pytest.raises(ConfigError, match="unsafe"):
        CodeEnv(sandbox_config=SandboxConfig(unsafe_no_isolation=True))


def test_check_env(tasks):
    check_env(CodeEnv(max_turns=3), tasks[0])
    check_env(
        CodeEnv(),
        tasks[1],
        actions=[
            call("run_tests"),
            call("read_file", path="solution.py"),
            call("write_file", path="solution.py", content=reference_source(tasks[1])),
            call("submit"),
        ],
    )


def test_timeouts_and_errors_are_observations(tasks):
    env = CodeEnv(sandbox_config=SandboxConfig(limits=SandboxLimits(timeout_s=0.5, cpu_s=2)))
    env.reset(tasks[0], 0)
    obs, _, _, truncated, info = env.step(call("run_python", code="while True: pass"))
    assert obs.startswith("killed: timed out") and not truncated and info["receipt"].status == "ok"
    obs, _, _, _, info = env.step(call("read_file", path="../../etc/passwd"))
    assert info["receipt"].status == "error" and "must be relative to the workspace" in obs
    obs, _, _, _, info = env.step(call("read_file", path="missing.py"))
    assert (
        info["error"].startswith("tool 'read_file' failed: SandboxError") and "No such file" in obs
    )
    obs, *_ = env.step(call("run_python", code="import sys; print('x' * 100000); sys.exit(3)"))
    assert obs.startswith("exit status 3\n--- stdout (cut) ---")
    env.step(call("write_file", path="solution.py", content="x = 1\n"))
    obs, _, _, _, info = env.step(
        call("run_python", code="open('big', 'wb').write(b'x' * (40 << 20))")
    )
    assert info["receipt"].status == "error" and "over its 32 MiB quota; it was reset" in obs
    assert sorted(p.name for p in env._sb.workspace.iterdir()) == ["solution.py", "test_visible.py"]
    assert "NotImplementedError" in env._sb.read_file("solution.py").decode()  # the stub again
    env.close()


def test_honest_episode_through_the_real_loop(tasks):
    task = tasks[2]
    env = CodeEnv()
    tok = build_tokenizer([task.prompt, env.system_prompt, json.dumps(env.tools)], vocab_size=700,
                          model_max_length=16384)
    actions = [
        "I will read the stub first.", call("read_file", path="solution.py"),
        call("write_file", path="solution.py", content=reference_source(task)), call("run_tests"),
        call("submit"),
    ]
    cfg = RolloutConfig(
        max_turns=8, max_action_tokens=4096, max_episode_tokens=8192, max_context=16384,
        max_observation_tokens=2048,
    )
    traj = validate_trajectory(
        asyncio.run(
            run_episode(
                ScriptedEngine(tok, actions, max_context=16384), env, tok, task, seed=0, config=cfg
            )
        )
    )
    # -0.02 + 0.02 shaping
    assert traj.stop_reason is StopReason.ANSWERED and traj.reward == pytest.approx(1.0)
    assert traj.reward_components["outcome"] == 1.0 and traj.verifier_version == "code-hidden-v1"
    assert [t.invalid for t in traj.turns] == [True, False, False, False, False]
    assert [t.receipt.tool for t in traj.turns[1:]] == [
        "read_file", "write_file", "run_tests", "submit",
    ]
    prompt = tok.decode(list(traj.segments[0].token_ids))
    assert "<tools>" in prompt and '"name": "run_tests"' in prompt  # tools rendered by the template
    assert traj.messages[3] == {
        "role": "tool",
        "content": "Error: no tool call found; call a tool as " + CALL_EXAMPLE,
    }
    # token-exact in the messages style too: the ids decode to the chat rendering of the messages
    rendered = tok.apply_chat_template(list(traj.messages), tools=env.tools, tokenize=False)
    assert tok.decode(traj.token_ids, skip_special_tokens=False) == rendered
    assert sum(traj.action_mask) == sum(
        len(s.token_ids) for s in traj.segments if s.kind == "action"
    )
