"""`backend: ray`: the recipe's RL rollouts on 2 rollout workers of a local Ray cluster.

Real Ray (a local cluster, 2 actor processes), real recipe, real ledger. The kill is real
too: SIGKILL of a worker's process right after an episode was sent to it, mid-update.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install 'taurl[ray]' (it is in the dev extras)")

from taurl.config import TrainConfig, load_config  # noqa: E402
from taurl.errors import ConfigError  # noqa: E402
from taurl.ledger import Ledger  # noqa: E402
from taurl.recipe import train  # noqa: E402
from taurl.runs import RunDir  # noqa: E402
from taurl.trajectory import validate_trajectory  # noqa: E402

UPDATES, TASKS, GROUP = 2, 2, 3
CFG = TrainConfig(demos=16, sft_batch_size=16, sft_epochs=1, updates=UPDATES, tasks_per_update=TASKS,
                  group_size=GROUP, eval_tasks=2, eval_trials=1, max_turns=1, max_action_tokens=8,
                  max_episode_tokens=8, task_options={"families": ["country_continent"], "split_by": "country"},
                  warmup_options={"steps": 0}, system_prompt="", tokenizer_texts=2000, concurrency=2,
                  backend="ray", backend_options={"workers": 2})
PLANNED = {f"r{u:04d}-{i:03d}-{g:02d}" for u in range(1, UPDATES + 1) for i in range(TASKS) for g in range(GROUP)}


def check_ledger(run: RunDir) -> None:
    """Every planned RL episode stored exactly once, valid, sampled by its round's version."""
    with Ledger(run.ledger) as ledger:
        ids = [e for e in ledger.episode_ids() if e.startswith("r")]
        assert sorted(ids) == sorted(PLANNED)  # none lost, none stored twice
        assert ledger.count() == len(ledger.episode_ids()) and not ledger.rejections()
        for e in ids:
            traj = ledger.get(e)
            validate_trajectory(traj)  # the contract rules, again, on what was stored
            v = int(e[1:5])  # round u is sampled by version u (v1 = SFT)
            actions = [s for s in traj.segments if s.kind == "action"]
            assert actions and {s.policy_version for s in actions} == {v}, e


def rl_rows(run: RunDir) -> list[dict]:
    return [r for r in map(json.loads, run.metrics.read_text().splitlines()) if r["phase"] == "rl"]


def test_two_ray_workers_run_the_recipe_and_the_ledger_keeps_every_contract(tmp_path):
    run = RunDir(tmp_path / "run")
    served: dict[str, int] = {}

    def hook(name, info):
        if name == "episode_submitted":
            served[info["episode_id"]] = info["pid"]
        if name == "ray_workers_started":
            served["_pids"] = len(set(info["pids"]))

    summary = train(CFG, str(run.root), progress=False, hook=hook)
    assert summary["train"]["updates"] == UPDATES and run.versions() == [0, 1, 2, 3]
    check_ledger(run)
    assert served.pop("_pids") == 2 and set(served) == PLANNED
    assert len(set(served.values())) == 2  # both workers served episodes, none of them in this process
    assert os.getpid() not in served.values()
    rows = rl_rows(run)
    assert [r["ray/workers"] for r in rows] == [2.0, 2.0]
    assert all(r["ray/worker_deaths"] == 0 and r["rollout/failed_episodes"] == 0 for r in rows)
    import ray

    assert not ray.is_initialized()  # the run shut its cluster down


def test_a_worker_killed_mid_update_loses_no_episode_and_stores_none_twice(tmp_path):
    run = RunDir(tmp_path / "run")
    killed: list[tuple[str, int]] = []
    submitted: list[str] = []

    def hook(name, info):
        if name != "episode_submitted":
            return
        submitted.append(info["episode_id"])
        # update 2's third episode has just been sent to its worker: kill that process now
        if not killed and info["episode_id"].startswith("r0002-") and sum(e.startswith("r0002-") for e in submitted) == 3:
            os.kill(info["pid"], signal.SIGKILL)
            killed.append((info["episode_id"], info["pid"]))

    train(CFG, str(run.root), progress=False, hook=hook)
    assert killed
    check_ledger(run)  # every planned episode stored exactly once, each by its round's version
    victim = killed[0][0]
    assert submitted.count(victim) == 2  # the killed worker's episode was re-run once, with the same id
    row = rl_rows(run)[1]
    assert row["ray/worker_deaths"] == 1 and row["ray/worker_restarts"] == 1 and row["ray/rerun_episodes"] >= 1
    assert row["rollout/failed_episodes"] == 0 and row["ray/workers"] == 2.0


def test_backend_options_are_validated_with_did_you_mean():
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"backend": "rya", "env": "search-v0"})
    assert "did you mean 'ray'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"backend": "ray", "backend_options": {"worker": 2, "max_restarts": -1}})
    assert "did you mean 'workers'" in str(e.value) and "max_restarts must be an integer >= 0" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"backend": "local", "backend_options": {"workers": 2}})
    assert "are for backend: ray" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, {"backend": "ray", "engine": "vllm"})
    assert "engine: vllm on Ray is not supported yet" in str(e.value)
