"""`backend: ray`: the recipe's RL rollouts on 2 rollout workers of a local Ray cluster.

Real Ray (a local cluster, 2 actor processes), real recipe, real ledger. The kill is real
too: SIGKILL of a worker's process right after an episode was sent to it, mid-update.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import pytest

pytest.importorskip(
    "ray", reason="ray is not installed: pip install 'taurl[ray]' (it is in the dev extras)"
)

from taurl.data.ledger import Ledger  # noqa: E402
from taurl.data.runs import RunDir  # noqa: E402
from taurl.data.trajectory import validate_trajectory  # noqa: E402
from taurl.errors import ConfigError  # noqa: E402
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train  # noqa: E402
from taurl.recipe.validate import load_config

UPDATES, TASKS, GROUP = 3, 2, 3
CFG = TrainConfig(
    demos=16, sft_batch_size=16, sft_epochs=1, updates=UPDATES, tasks_per_update=TASKS,
    group_size=GROUP, eval_tasks=2, eval_trials=1, max_turns=1, max_action_tokens=8,
    max_episode_tokens=8, task_options={"families": ["country_continent"], "split_by": "country"},
    warmup_options={"steps": 0}, system_prompt="", tokenizer_texts=2000, concurrency=2,
    backend="ray", backend_options={"workers": 2},
)
PLANNED = {
    f"r{u:04d}-{i:03d}-{g:02d}"
    for u in range(1, UPDATES + 1)
    for i in range(TASKS)
    for g in range(GROUP)
}


def check_ledger(run: RunDir, planned: set[str] = PLANNED) -> None:
    """Every planned RL episode stored exactly once, valid, sampled by its round's version."""
    with Ledger(run.ledger) as ledger:
        ids = [e for e in ledger.episode_ids() if e.startswith("r")]
        assert sorted(ids) == sorted(planned)  # none lost, none stored twice
        assert ledger.count() == len(ledger.episode_ids()) and not ledger.rejections()
        for e in ids:
            traj = ledger.get(e)
            validate_trajectory(traj)  # the contract rules, again, on what was stored
            v = int(e[1:5])  # round u is sampled by version u (v1 = SFT)
            actions = [s for s in traj.segments if s.kind == "action"]
            assert actions and {s.policy_version for s in actions} == {v}, e


def rl_rows(run: RunDir) -> list[dict]:
    return [r for r in map(json.loads, run.metrics.read_text().splitlines()) if r["phase"] == "rl"]


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory) -> dict:
    """One run on 2 workers (Ray's startup dominates a tiny run, so the tests share it):
    update 1 runs undisturbed; in update 2 a worker's process is SIGKILLed right after an
    episode was sent to it; update 3 runs on the survivor and the restarted worker."""
    run = RunDir(tmp_path_factory.mktemp("ray") / "run")
    seen: dict = {"submitted": [], "killed": [], "pids": []}

    def hook(name, info):
        if name == "ray_workers_started":
            seen["pids"], seen["temp_dir"] = list(info["pids"]), info["temp_dir"]
        if name != "episode_submitted":
            return
        seen["submitted"].append((info["episode_id"], info["pid"]))
        n2 = sum(e.startswith("r0002-") for e, _ in seen["submitted"])
        if not seen["killed"] and info["episode_id"].startswith("r0002-") and n2 == 3:
            os.kill(info["pid"], signal.SIGKILL)  # its episode is in flight: sent, not returned
            seen["killed"].append((info["episode_id"], info["pid"]))

    seen["summary"] = train(CFG, str(run.root), progress=False, hook=hook)
    import ray

    seen["ray_left_running"] = ray.is_initialized()
    return {"run": run, **seen}


def test_the_recipe_completes_on_two_ray_workers_and_the_ledger_keeps_every_contract(ray_run):
    run, summary = ray_run["run"], ray_run["summary"]
    # v0, the SFT version v1 and the newest keep_checkpoints (2) versions; retention pruned the rest
    assert summary["train"]["updates"] == UPDATES and run.versions() == [0, 1, UPDATES, UPDATES + 1]
    # every planned episode stored once, valid, each action by its round's version
    check_ledger(run)
    pids = {p for _, p in ray_run["submitted"]}
    assert len(set(ray_run["pids"])) == 2 and set(ray_run["pids"]) <= pids
    assert os.getpid() not in pids  # the episodes ran in the workers, not in the learner
    assert {e for e, _ in ray_run["submitted"]} == PLANNED
    first = rl_rows(run)[0]
    assert (
        first["ray/workers"] == 2.0
        and first["ray/worker_deaths"] == 0
        and first["rollout/failed_episodes"] == 0
    )
    assert not ray_run["ray_left_running"]  # the run shut its cluster down and removed its files
    assert (
        ray_run["temp_dir"]
        and len(ray_run["temp_dir"]) < 40
        and not os.path.exists(ray_run["temp_dir"])
    )
    assert first["time/ray_startup_s"] > 0 and "time/ray_startup_s" not in rl_rows(run)[1]


def test_a_worker_killed_mid_update_loses_no_episode_and_stores_none_twice(ray_run):
    run, submitted = ray_run["run"], ray_run["submitted"]
    [(victim, pid)] = ray_run["killed"]
    check_ledger(run)  # ledger ids == planned ids, each once
    assert [e for e, _ in submitted].count(victim) == 2  # re-run once, same id (and seed)
    row = rl_rows(run)[1]
    assert (
        row["ray/worker_deaths"] == 1
        and row["ray/worker_restarts"] == 1
        and row["ray/rerun_episodes"] >= 1
    )
    assert row["rollout/failed_episodes"] == 0 and row["ray/workers"] == 2.0
    # the restarted worker (a new process, created from the v1 checkpoint) serves update 3 as v3
    restarted = {p for e, p in submitted if e.startswith("r0003-")} - set(ray_run["pids"])
    assert len(restarted) == 1 and pid not in restarted
    assert rl_rows(run)[2]["ray/workers"] == 2.0


def test_a_worker_whose_restarts_are_spent_leaves_its_episodes_to_the_survivor(tmp_path):
    """max_restarts: 0: the killed worker stays dead; its unfinished episode runs on the other."""
    cfg = dataclasses.replace(CFG, updates=1, backend_options={"workers": 2, "max_restarts": 0})
    run, killed, submitted = RunDir(tmp_path / "run"), [], []

    def hook(name, info):
        if name == "episode_submitted":
            submitted.append((info["episode_id"], info["pid"]))
            if not killed and len(submitted) == 3:
                os.kill(info["pid"], signal.SIGKILL)
                killed.append((info["episode_id"], info["pid"]))

    train(cfg, str(run.root), progress=False, hook=hook)
    check_ledger(run, {e for e in PLANNED if e.startswith("r0001-")})
    [(victim, pid)] = killed
    tries = [p for e, p in submitted if e == victim]
    assert len(tries) == 2 and tries[1] != pid  # re-run once, by the survivor
    assert all(p != pid for _, p in submitted[3:])  # nothing more was sent to the dead worker
    row = rl_rows(run)[0]
    assert (
        row["ray/workers"] == 1.0
        and row["ray/worker_deaths"] == 1
        and row["ray/worker_restarts"] == 0
    )
    assert row["rollout/failed_episodes"] == 0


def test_backend_options_are_validated_with_did_you_mean():
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"backend": "rya", "env": "search-v0"})
    assert "did you mean 'ray'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(
            TrainConfig, {"backend": "ray", "backend_options": {"worker": 2, "max_restarts": -1}}
        )
    assert "did you mean 'workers'" in str(
        e.value
    ) and "max_restarts must be an integer >= 0" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"backend": "local", "backend_options": {"workers": 2}})
    assert "are for backend: ray" in str(e.value)
    with pytest.raises(ConfigError) as e:  # engine actors start servers (test_engine_actors.py)
        load_config(TrainConfig, {"backend": "ray", "engine": "vllm",
                                  "engine_options": {"url": "http://x"}})
    assert "drop engine_options url" in str(e.value)
