"""reasoning-gym as a taurl env (taurl.envs.rgym), with the real `reasoning-gym` package:
any family by name (names drawn from the package's own registry, not written here),
disjoint splits, `score_answer` as reward and verifier, the sandboxed Python tool, and
`taurl train --env reasoning-gym` for 2 updates with provenance in records and summary."""

from __future__ import annotations

import json
import random
import sys
from importlib.metadata import version
from types import SimpleNamespace

import pytest

from taurl import envs
from taurl.errors import ConfigError

rg = pytest.importorskip("reasoning_gym", reason="pip install 'taurl[ecosystem]' (reasoning-gym)")
from reasoning_gym.factory import DATASETS  # noqa: E402

# families left out of the random pick, each for a reason of its own (docs/compatibility.md):
# composite needs its sub-datasets named; futoshiki, zebra_puzzles, intermediate_integration and
# puzzle24 take 0.1-2 s per instance (a split draw reads ~10 per task); for these five the gold
# "answer" is one solution of several, or an example (score_answer checks a solution), so it
# need not score 1; codeio's draw is not a function of the seed (its programs may use the
# global random module)
NOT_PICKED = {
    "composite", "futoshiki", "zebra_puzzles", "intermediate_integration", "puzzle24", "codeio",
    "boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour",
}


def families(k: int) -> list[str]:
    """`k` family names picked from reasoning-gym's registry by a seed of this test run's
    own choosing, so the adapter is exercised on names no test writes down."""
    names = sorted(set(DATASETS) - NOT_PICKED)
    return random.Random(sum(map(ord, "".join(names)))).sample(names, k)


def short_family() -> str:
    """A family picked as `families` does, among those whose questions fit the tiny test
    policy's context (arc_agi's grids do not: an episode with no room to act trains nothing)."""
    names = sorted(set(DATASETS) - NOT_PICKED)
    rng = random.Random(len(names))
    while len(rg.create_dataset(name := rng.choice(names), seed=0, size=3)[0]["question"]) > 300:
        pass
    return name


@pytest.mark.parametrize("name", families(6))
def test_any_family_splits_are_disjoint_and_gold_scores_one(name):
    cfg = {"dataset": name}
    by = {s: envs.make_tasks("reasoning-gym", s, 12, seed=5, env_config=cfg)
          for s in ("train", "validation", "holdout")}
    keys = {s: {(t.prompt, t.answers[0]) for t in ts} for s, ts in by.items()}
    assert all(len(k) == 12 for k in keys.values())  # distinct within a split
    assert not keys["train"] & keys["holdout"] and not keys["train"] & keys["validation"]
    assert not keys["validation"] & keys["holdout"]
    again = envs.make_tasks("reasoning-gym", "holdout", 12, seed=5, env_config=cfg)
    # deterministic in the seed
    assert [t.task_id for t in again] == [t.task_id for t in by["holdout"]]
    task = by["holdout"][0]
    env = envs.make("reasoning-gym", **cfg)
    _, info = env.reset(task, seed=0)
    assert info["provenance"]["package"] == "reasoning-gym" and info["provenance"]["env_id"] == name
    obs, r, term, trunc, step = env.step(f"<answer>{task.answers[0]}</answer>")
    assert (r, term, step["stop_reason"]) == (1.0, True, "answered")


def test_unknown_family_and_option_are_clear_errors():
    with pytest.raises(ConfigError, match="did you mean 'letter_counting'"):
        envs.make_tasks("reasoning-gym", "train", 2, env_config={"dataset": "leter_counting"})
    with pytest.raises(ConfigError, match="did you mean 'min_words'"):
        envs.make("reasoning-gym", dataset="letter_counting", min_word=2)
    with pytest.raises(ConfigError, match="needs env_config 'dataset'"):
        envs.make_tasks("reasoning-gym", "train", 2)
    with pytest.raises(ConfigError, match="adapter chooses the dataset's seed"):
        envs.make("reasoning-gym", dataset="gcd", seed=3)


def test_reward_and_verifier_are_score_answer():
    task = envs.make_tasks("reasoning-gym", "validation", 1, env_config={"dataset": "gcd"})[0]
    ds = rg.create_dataset("gcd", seed=0, size=1)
    env = envs.make("reasoning-gym", dataset="gcd", max_turns=2)
    verifier = envs.spec("reasoning-gym").make_verifier()
    for answer in (task.answers[0], str(int(task.answers[0]) + 1), "not a number"):
        env.reset(task, seed=0)
        obs, r, term, trunc, info = env.step(f"<answer>{answer}</answer>")
        assert r == ds.score_answer(answer, task.metadata["entry"])
        record = SimpleNamespace(
            task_id=task.task_id, terminated=term, turns=[SimpleNamespace(action=info["action"])]
        )
        assert verifier(record, task) == r
    env.reset(task, seed=0)
    obs, r, term, trunc, info = env.step("no tags")
    assert info["invalid"] and not term and "<answer>" in obs
    assert (
        env.step("still none")[3]
        and verifier(SimpleNamespace(task_id=task.task_id, terminated=False, turns=[]), task) == 0.0
    )


def test_python_tool_runs_in_the_sandbox_with_a_receipt():
    task = envs.make_tasks(
        "reasoning-gym", "holdout", 1, env_config={"dataset": "basic_arithmetic"}
    )[0]
    env = envs.make("reasoning-gym", dataset="basic_arithmetic", tools="python", max_turns=3)
    assert "</python>" in env.stop and env.tools[0]["function"]["name"] == "python"
    env.reset(task, seed=0)
    obs, r, term, trunc, info = env.step("<python>import os; print(6 * 7, os.getuid())</python>")
    assert obs.startswith("\n<information>42 ") and info["receipt"].tool == "python"
    assert info["receipt"].status == "ok" and not term
    obs, *_, info = env.step(
        "<python>import socket; socket.create_connection(('1.1.1.1', 53), 2)</python>"
    )
    assert info["receipt"].status == "error" and "exit status" in obs  # no network in the sandbox
    assert env.step(f"<answer>{task.answers[0]}</answer>")[1] == 1.0
    plain = envs.make("reasoning-gym", dataset="basic_arithmetic")
    plain.reset(task)
    assert plain.step("<python>print(1)</python>")[4]["invalid"]  # no tool unless offered


def test_the_sandbox_workspace_is_removed_when_the_loop_ends_the_episode():
    """Issue 38: the env removed its sandbox only when the episode ended by the env; one the
    loop ended on its own budget (here its turn budget, after a python run) left the
    workspace on disk. The runner now closes every episode's env, and the env its sandbox."""
    import asyncio

    from taurl.policy import build_tokenizer
    from taurl.rollout.episodes import EpisodeSpec
    from taurl.rollout.loop import RolloutConfig
    from taurl.rollout.runner import run_one
    from taurl.rollout.synth import ScriptedEngine

    task = envs.make_tasks("reasoning-gym", "holdout", 1,
                           env_config={"dataset": "basic_arithmetic"})[0]
    workspaces = []
    env = envs.make("reasoning-gym", dataset="basic_arithmetic", tools="python", max_turns=4)
    run_python = env._run_python

    async def remembering(code):  # the real run; the test notes where its workspace is
        result = await run_python(code)
        workspaces.append(env._sandbox.workspace)
        return result

    env._run_python = remembering
    action = "<python>print(6 * 7)</python>"
    tok = build_tokenizer([task.prompt, env.system_prompt, action] * 4, vocab_size=300)
    spec = EpisodeSpec("e0", task, 0, "g0")
    traj = asyncio.run(run_one(ScriptedEngine(tok, [action]), lambda: env,
                               tok, spec, config=RolloutConfig(max_turns=1), run_id="r"))
    assert str(traj.stop_reason) == "max_turns" and traj.turns[0].receipt.status == "ok"
    assert workspaces and not workspaces[0].exists() and env._sandbox is None


@pytest.mark.slow  # ~30 s idle (the recipe end to end); minutes on a loaded machine
def test_taurl_train_two_updates_with_provenance(tmp_path, monkeypatch, capsys):
    """`taurl train --env reasoning-gym --env-config '{"dataset": NAME}'` end to end (tiny
    policy): 2 updates, holdout figures and provenance in summary.json and every record."""
    from taurl.cli.main import main
    from taurl.data.ledger import Ledger

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = short_family()
    assert (
        main(
            [
                "train", "--env", "reasoning-gym", "--env-config", json.dumps({"dataset": name}),
                "--run-dir", "r", "--no-progress", "--demos", "16", "--sft-epochs", "1",
                "--updates", "2", "--tasks-per-update", "2", "--group-size", "2", "--eval-tasks",
                "4", "--eval-trials", "1", "--max-turns", "1", "--max-action-tokens", "8",
                "--max-episode-tokens", "8", "--vocab-size", "300",
            ]
        )
        == 0
    ), capsys.readouterr().err[-3000:]
    summary = json.loads((tmp_path / "r/summary.json").read_text())
    prov = summary["env_provenance"]
    assert summary["train"]["updates"] == 2 and summary["env"] == "reasoning-gym"
    assert (prov["package"], prov["env_id"], prov["seed"]) == ("reasoning-gym", name, 0)
    assert prov["version"] == version("reasoning-gym")
    assert summary["holdout"]["final"]["tasks"] == 4 and "ci95" in summary["holdout"]["final"]
    with Ledger(tmp_path / "r/ledger.sqlite") as ledger:
        records = list(ledger.iter_query())
    assert records and all(
        t.provenance["package"] == "reasoning-gym"
        and t.provenance["env_id"] == name
        and isinstance(t.provenance["seed"], int)
        for t in records
    )
