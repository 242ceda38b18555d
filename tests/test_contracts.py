"""The trajectory and environment contracts, held by the loop, check_env, the ledger and the
export alike: open stop reasons with their kind, provenance, honest demonstrations."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pyarrow.parquet as pq
import pytest

from taurl import envs
from taurl.data.export import export_jsonl, export_parquet, export_row, read_jsonl
from taurl.data.ledger import Ledger
from taurl.data.trajectory import StopReason, Trajectory, validate_trajectory
from taurl.envs import check_env
from taurl.envs.core import AsyncEnv, Env, Task
from taurl.errors import ConfigError, ContractError, EnvCheckError, ResetNeeded
from taurl.policy.engine import Generation
from taurl.rollout.loop import RolloutConfig, run_episode
from taurl.rollout.synth import ScriptedEngine, demonstrations

# ---------------------------------------------------------------------------------------
# A toy env with its own stop reasons: walk a line from 0; reach +2 ("goal", terminated),
# step below 0 ("fell", truncated), or run out of 3 moves ("timeout", truncated).


class LineEnv:
    name = "line-v0"
    version = "1"
    verifier_version = "line-v1"
    observation_style = "inline"
    stop = ("</move>",)
    tools: list[dict[str, Any]] = []
    system_prompt = ""

    def __init__(
        self, reasons: dict[str, tuple[str, bool]] | None = None, provenance: Any = "default"
    ):
        # reasons: outcome -> (stop_reason, terminated) — lets a test break the contract on purpose
        self.reasons = reasons or {
            "goal": ("goal", True),
            "fell": ("fell", False),
            "timeout": ("timeout", False),
        }
        self.provenance = provenance
        self._pos: int | None = None

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self._pos, self._moves = 0, 0
        info: dict[str, Any] = {"seed": seed}
        if self.provenance == "default":
            info["provenance"] = {"map_seed": seed, "snapshot": "line-5", "cells": [0, 1, 2]}
        elif self.provenance is not None:
            info["provenance"] = self.provenance
        return "", info

    def step(self, action: str):
        if self._pos is None:
            raise ResetNeeded("reset first")
        self._moves += 1
        move = "right" if "right" in action else "left" if "left" in action else None
        info: dict[str, Any] = {
            "action": {"kind": "move", "dir": move} if move else {"kind": "invalid"},
            "invalid": move is None,
        }
        self._pos += {"right": 1, "left": -1, None: 0}[move]
        outcome = (
            "goal"
            if self._pos >= 2
            else "fell"
            if self._pos < 0
            else "timeout"
            if self._moves >= 3
            else None
        )
        if outcome is None:
            return f"<pos>{self._pos}</pos>", 0.0, False, False, info
        reason, terminated = self.reasons[outcome]
        reward = 1.0 if outcome == "goal" else 0.0
        info.update(
            stop_reason=reason,
            reward_components={"outcome": reward},
            verifier_version=self.verifier_version,
        )
        self._pos = None
        return "", reward, terminated, not terminated, info


class AsyncLineEnv(LineEnv):
    async def astep(self, action: str):
        await asyncio.sleep(0)
        out = self.step(action)
        return out[0], out[1], out[2], out[3], {**out[4], "via": "astep"}


TASK = Task(
    "line-0", "Walk to +2 with <move>right</move> or <move>left</move>.", ("goal",), "train",
    "line-v0",
)
ACTIONS = {
    "goal": ["<move>right</move>"] * 2,
    "fell": ["<move>left</move>"],
    "timeout": ["<move>right</move>", "<move>left</move>"] * 2,
}
EXPECT = {"goal": (True, False), "fell": (False, True), "timeout": (False, True)}


class PolicyEngine(ScriptedEngine):
    """A stand-in *policy*: fixed text, but with behaviour logprobs and a version, and no
    `source` other than "policy" — as a sampling engine reports them."""

    def __init__(self, tok, actions, version=3):
        super().__init__(tok, actions)
        del self.source  # an ordinary engine has no `source`: the loop takes it for a policy
        self._v = version

    async def generate(self, prompt_ids, sampling):
        g = await super().generate(prompt_ids, sampling)
        return Generation(g.token_ids, [-0.25] * len(g.token_ids), g.finish_reason, self._v)


@pytest.fixture(scope="module")
def tok(search_tokenizer):
    return search_tokenizer


def play(tok, env: Env, actions, *, policy=True, episode_id="e0", seed=7) -> Trajectory:
    engine = PolicyEngine(tok, actions) if policy else ScriptedEngine(tok, actions)
    return asyncio.run(
        run_episode(
            engine, env, tok, TASK, seed=seed, config=RolloutConfig(max_turns=6),
            episode_id=episode_id,
        )
    )


# ---------------------------------------------------------------------------------------
# Open stop reasons: stored, exported and round-tripped with the env's kind


def test_line_env_passes_check_env_for_each_ending():
    for actions in ACTIONS.values():
        check_env(LineEnv(), TASK, actions=actions)
    check_env(AsyncLineEnv(), TASK, actions=ACTIONS["goal"])


@pytest.mark.parametrize("outcome", ["goal", "fell", "timeout"])
def test_env_stop_reasons_are_recorded_with_their_kind(tok, outcome, tmp_path):
    traj = validate_trajectory(play(tok, LineEnv(), ACTIONS[outcome], episode_id=f"ep-{outcome}"))
    assert traj.stop_reason == outcome and traj.stop_reason.value == outcome
    assert (traj.terminated, traj.truncated) == EXPECT[outcome]
    assert traj.stop_reason.kind is None  # an env's own reason: its kind is the record's flags
    assert (
        traj.valid
        and not traj.metadata["error"]
        and traj.reward == (1.0 if outcome == "goal" else 0.0)
    )
    with Ledger(tmp_path / "l.db") as led:
        led.append(traj)
        back = led.get(traj.episode_id)
        assert back == traj and back.stop_reason.value == outcome
        assert led.stats()["stop_reasons"] == {outcome: 1}
        assert led.stats()["terminated"] == int(EXPECT[outcome][0])
        assert (
            export_jsonl(led, tmp_path / "x.jsonl") == 1
            and export_parquet(led, tmp_path / "x.parquet") == 1
        )
    (row,) = read_jsonl(tmp_path / "x.jsonl")
    assert (row["stop_reason"], row["terminated"], row["truncated"]) == (outcome, *EXPECT[outcome])
    cols = pq.read_table(tmp_path / "x.parquet").to_pydict()
    assert (cols["stop_reason"][0], cols["terminated"][0], cols["truncated"][0]) == (
        outcome,
        *EXPECT[outcome],
    )
    with Ledger(tmp_path / "fresh.db") as fresh:
        fresh.append(row)  # the JSONL row appends back unchanged
        fresh.append({**json.loads(cols["record"][0]), "episode_id": "from-parquet"})
        assert fresh.get(traj.episode_id) == traj
        assert fresh.get("from-parquet").stop_reason == outcome


@pytest.mark.parametrize(("reason", "terminated", "ok"), [
    ("goal", True, True), ("fell", False, True), ("timeout", False, True),
    # the loop's, right kind
    ("answered", True, True), ("max_turns", False, True), ("error", False, True),
    # wrong kind
    ("max_turns", True, False), ("answered", False, False), ("no_answer", False, False),
    # not snake_case
    ("Reached Goal", True, False), ("goal!", False, False), ("g" * 65, True, False),
])
def test_check_env_and_the_loop_agree(tok, reason, terminated, ok):
    """Whatever check_env accepts, the loop records as given; whatever it refuses, the loop
    records as an error (truncated) that names the violation — never a dropped episode."""
    make = lambda: LineEnv(  # noqa: E731
        {"goal": (reason, terminated), "fell": ("fell", False), "timeout": ("timeout", False)}
    )
    try:
        check_env(make(), TASK, actions=ACTIONS["goal"])
        accepted = True
    except EnvCheckError:
        accepted = False
    traj = validate_trajectory(play(tok, make(), ACTIONS["goal"]))
    assert accepted == ok
    if ok:
        assert traj.stop_reason == reason and traj.terminated == terminated
    else:
        assert traj.stop_reason is StopReason.ERROR and traj.truncated and not traj.valid
        assert "env contract" in traj.metadata["error"] and "env contract" in traj.turns[-1].error


def test_a_missing_reason_is_refused_by_check_env_and_defaulted_by_the_loop(tok):
    # check_env asks the env to say why; the loop, meeting an env that does not, records the
    # documented default of the flag (never a dropped episode)
    for terminated, default in ((True, "answered"), (False, "max_turns")):
        make = lambda t=terminated: LineEnv(  # noqa: E731
            {"goal": ("", t), "fell": ("fell", False), "timeout": ("timeout", False)}
        )
        with pytest.raises(EnvCheckError, match="must say why"):
            check_env(make(), TASK, actions=ACTIONS["goal"])
        traj = validate_trajectory(play(tok, make(), ACTIONS["goal"]))
        assert traj.stop_reason == default and traj.terminated == terminated


def test_loop_reasons_keep_their_kind_and_identity():
    assert StopReason("error") is StopReason.ERROR and [r.value for r in StopReason][:2] == [
        "answered",
        "no_answer",
    ]
    assert StopReason.ANSWERED.is_termination and StopReason.TOOL_BUDGET.is_termination is False
    assert StopReason("goal").is_termination is None
    with pytest.raises(ContractError, match="stop_reason_name"):
        StopReason("Goal")


# ---------------------------------------------------------------------------------------
# Provenance: what the env says at reset about its world is kept


def test_provenance_is_kept_stored_and_exported(tok, tmp_path):
    traj = play(tok, LineEnv(), ACTIONS["goal"], seed=11)
    assert traj.provenance == {"map_seed": 11, "snapshot": "line-5", "cells": [0, 1, 2]}
    with Ledger(tmp_path / "l.db") as led:
        led.append(traj)
        assert led.get("e0").provenance == traj.provenance
        export_parquet(led, tmp_path / "x.parquet")
    assert export_row(traj)["provenance"] == traj.provenance
    assert (
        json.loads(pq.read_table(tmp_path / "x.parquet").to_pydict()["provenance"][0])
        == traj.provenance
    )
    # an env that says nothing
    assert play(tok, LineEnv(provenance=None), ACTIONS["goal"]).provenance == {}


@pytest.mark.parametrize("bad", [["map", 3], {"seed": {1, 2}}, {"x": float("nan")}])
def test_check_env_refuses_provenance_the_ledger_cannot_store(bad):
    with pytest.raises(EnvCheckError, match="provenance"):
        check_env(LineEnv(provenance=bad), TASK, actions=ACTIONS["goal"])


def test_search_env_reports_its_corpus_fingerprint(tok):
    env = envs.make("search-v0")
    _, info = env.reset(envs.make_tasks("search-v0", "train", n=1, seed=0)[0], 0)
    fingerprint = env.retriever.fingerprint
    assert len(fingerprint) == 16 and info["provenance"] == {"corpus_fingerprint": fingerprint}
    task = envs.make_tasks("search-v0", "train", n=1, seed=0)[0]
    traj = asyncio.run(
        run_episode(ScriptedEngine(tok, ["<answer>x</answer>"]), env, tok, task, seed=0)
    )
    assert traj.provenance == {"corpus_fingerprint": fingerprint}


# ---------------------------------------------------------------------------------------
# The optional astep and the typed step info


def test_astep_is_awaited_and_typed(tok):
    env = AsyncLineEnv()
    assert (
        isinstance(env, AsyncEnv)
        and not isinstance(LineEnv(), AsyncEnv)
        and isinstance(LineEnv(), Env)
    )
    traj = play(tok, env, ACTIONS["goal"])
    assert traj.stop_reason == "goal"

    class SyncAstep(LineEnv):
        def astep(self, action):
            return self.step(action)

    with pytest.raises(EnvCheckError, match="astep must be an async def"):
        check_env(SyncAstep(), TASK)


def test_check_env_checks_the_step_info_types():
    class BadRole(LineEnv):
        def step(self, action):
            obs, r, te, tr, info = super().step(action)
            return obs, r, te, tr, {**info, "role": 3}

    with pytest.raises(EnvCheckError, match=r'info\["role"\] must be a str'):
        check_env(BadRole(), TASK)


# ---------------------------------------------------------------------------------------
# Demonstrations recorded honestly: no behaviour logprob or version that no policy produced


def walk_right(task, rng, *, steps=2):
    """An Expert for LineEnv."""
    return ["<move>right</move>"] * steps


@pytest.fixture(scope="module")
def demos(tok):
    return asyncio.run(demonstrations([TASK, TASK, TASK], tok, LineEnv, expert=walk_right, seed=5))


def test_demonstrations_carry_no_made_up_logprobs(demos):
    for d in demos:
        validate_trajectory(d)
        assert d.source == "expert" and not d.has_behaviour_policy
        actions = [s for s in d.segments if s.kind == "action"]
        assert actions and all(s.logprobs is None and s.policy_version is None for s in actions)
        assert d.policy_versions == [] and set(d.token_versions) == {-1}
        with pytest.raises(ContractError) as e:
            d.behaviour_logprobs  # noqa: B018 — what an importance ratio reads
        assert e.value.rule == "behaviour_without_policy"
        row = export_row(d)
        assert (
            row["logprobs"] is None and row["source"] == "expert" and row["policy_versions"] == []
        )
        assert all(s["logprobs"] is None and s["policy_version"] is None for s in row["segments"])
    assert [d.episode_id for d in demos] == ["demo-0", "demo-1", "demo-2"]
    assert all(d.stop_reason == "goal" and d.terminated for d in demos)


def test_a_demonstration_with_a_made_up_logprob_is_refused(demos, tmp_path):
    d = demos[0].to_dict()
    for seg in d["segments"]:
        if seg["kind"] == "action":
            # the old, dishonest form
            seg["logprobs"], seg["policy_version"] = [0.0] * len(seg["token_ids"]), 0
    with Ledger(tmp_path / "l.db") as led:
        with pytest.raises(ContractError) as e:
            led.append(d)
        assert e.value.rule == "behaviour_without_policy"
        row = export_row(demos[0])
        with pytest.raises(ContractError) as e:
            led.append({**row, "logprobs": [0.0] * row["num_tokens"]})
        assert e.value.rule == "flat_values_mismatch"
        # and the honest record round-trips through the ledger, JSONL and Parquet unchanged
        assert led.append_many(demos).ok
        assert led.get("demo-1") == demos[1]
        export_jsonl(led, tmp_path / "d.jsonl")
        export_parquet(led, tmp_path / "d.parquet")
    with Ledger(tmp_path / "fresh.db") as fresh:
        assert fresh.append_many(read_jsonl(tmp_path / "d.jsonl")).ok
        assert fresh.query() == demos
    cols = pq.read_table(tmp_path / "d.parquet").to_pydict()
    assert cols["logprobs"] == [None] * 3 and cols["source"] == ["expert"] * 3


def test_policy_samples_keep_their_logprobs_and_queries_tell_them_apart(tok, demos, tmp_path):
    sampled = play(tok, LineEnv(), ACTIONS["goal"], episode_id="p0")
    assert sampled.source == "policy" and sampled.policy_versions == [3]
    assert sampled.behaviour_logprobs == sampled.logprobs and -0.25 in sampled.logprobs
    scripted = play(tok, LineEnv(), ACTIONS["goal"], policy=False, episode_id="s0")
    assert scripted.source == "scripted" and scripted.policy_versions == []
    with Ledger(tmp_path / "l.db") as led:
        assert led.append_many([sampled, scripted, *demos]).ok
        assert led.episode_ids(source="policy") == ["p0"]
        assert led.episode_ids(source="expert") == ["demo-0", "demo-1", "demo-2"]
        # the staleness filter never admits a demonstration
        assert led.episode_ids(min_version=0) == ["p0"]


def test_scripted_engine_cannot_claim_to_be_a_policy(tok):
    with pytest.raises(ConfigError, match="not a policy"):
        ScriptedEngine(tok, [], source="policy")


# ---------------------------------------------------------------------------------------
# Import structure


def test_export_does_not_import_the_ledger():
    code = "import sys, taurl.data.export; sys.exit('taurl.data.ledger' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
