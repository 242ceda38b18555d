"""The multi-node rehearsal: learner ranks on one Ray node, rollout workers on another, faults.

A real Ray cluster of 3 nodes on this machine (`ray.cluster_utils.Cluster`): the head (the
driver, no CPU), a learner node (resource ``learner``) and an engine node (``engines``). The
recipe runs with ``train: {strategy: fsdp, world_size: 2, launcher: ray}``, bundles
``{CPU: 1, learner: 1}``, and ``backend: ray`` with ``resources: {engines: 1}``, so the ranks
land on the learner node and the rollout workers on the engine node (checked by each
process's parent raylet). Two faults:

1. SIGKILL of learner rank 1 while update 2 runs on the ranks: the run stops with `RankDied`
   (update 2's episodes are stored, its checkpoint is not). A resume that changes what a
   stored record means is refused with the key; the same config resumes from the run
   directory: update 2 reuses its stored episodes (none is sampled again) and trains;
2. in update 3 of the resumed run, the engine node is removed mid-round (its raylet and
   workers SIGKILLed) and a new engine node joins: Ray restarts both rollout workers there and
   the episodes they had in flight are re-run with the same ids and seeds.

After both: every planned episode id is in the ledger exactly once (no group lost, none
stored twice), every record passes the contract rules and carries its round's version, and
what was stored before the learner's death is byte-for-byte what the resumed run kept.
``TAURL_REHEARSAL_FULL=1`` also runs the same recipe without faults and checks that the
faulted run took the same steps (tests/test_ray_rehearsal.py::test_full_rehearsal...).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed: pip install 'taurl[ray]'")

from taurl.data.ledger import Ledger  # noqa: E402
from taurl.data.runs import RunDir  # noqa: E402
from taurl.data.trajectory import validate_trajectory  # noqa: E402
from taurl.recipe.config import TrainConfig  # noqa: E402
from taurl.recipe.loop import train  # noqa: E402
from taurl.recipe.resume import ResumeError  # noqa: E402
from taurl.train.distributed.pool import RankDied  # noqa: E402
from taurl.train.distributed.ray_ranks import RayRankPool  # noqa: E402

UPDATES, TASKS, GROUP = 3, 2, 3
WORKERS = int(os.environ.get("TAURL_REHEARSAL_WORKERS", "1"))  # rollout workers
CFG = TrainConfig(
    sft="none", updates=UPDATES, tasks_per_update=TASKS,
    group_size=GROUP, eval_tasks=1, eval_trials=1, max_turns=1, max_action_tokens=8,
    max_episode_tokens=8, task_options={"families": ["country_continent"], "split_by": "country"},
    warmup_options={"steps": 0}, system_prompt="", tokenizer_texts=2000, concurrency=2,
    drop_zero_variance=False,  # the random policy's equal rewards still make steps
    backend="ray", backend_options={"workers": WORKERS, "resources": {"engines": 1}},
    train_strategy="fsdp", train_world_size=2, launcher="ray",
    ray={"placement": "PACK", "bundle": {"CPU": 1, "learner": 1}})
FULL = bool(os.environ.get("TAURL_REHEARSAL_FULL"))


def planned(updates: int) -> set[str]:
    return {f"r{u:04d}-{i:03d}-{g:02d}" for u in range(1, updates + 1) for i in range(TASKS)
            for g in range(GROUP)}


def check_ledger(run: RunDir, want: set[str]) -> None:
    """Every planned RL episode stored exactly once, valid, sampled by its round's version."""
    with Ledger(run.ledger) as ledger:
        ids = [e for e in ledger.episode_ids() if e.startswith("r")]
        assert sorted(ids) == sorted(want)  # none lost, none stored twice
        assert ledger.count() == len(ledger.episode_ids()) and not ledger.rejections()
        for e in ids:
            traj = ledger.get(e)
            validate_trajectory(traj)
            actions = [s for s in traj.segments if s.kind == "action"]
            assert actions and {s.policy_version for s in actions} == {int(e[1:5])}, e


def stored(run: RunDir) -> dict[str, dict]:
    with Ledger(run.ledger) as ledger:
        return {e: ledger.get(e).to_dict() for e in ledger.episode_ids() if e.startswith("r")}


def rl_rows(run: RunDir) -> list[dict]:
    rows = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    return [r for r in rows if r["phase"] == "rl"]


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def raylet_pid(node) -> int:
    return next(p.pid for name, p in node.live_processes() if name == "raylet")


@pytest.fixture
def cluster(tmp_path_factory):
    """Head (the driver's node, no CPU), a learner node and an engine node, on loopback."""
    import tempfile

    import ray
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp_dir = tempfile.mkdtemp(prefix="taurl-ray-", dir="/tmp")  # short: socket paths
    from taurl.train.distributed.group import free_port

    c = Cluster(initialize_head=True, head_node_args={  # a free GCS port: not Ray's 6379
        "num_cpus": 0, "include_dashboard": False, "temp_dir": temp_dir,
        "gcs_server_port": free_port(),
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
    nodes = {"learner": c.add_node(num_cpus=2, resources={"learner": 2}),
             "engines": c.add_node(num_cpus=2, resources={"engines": 2})}
    ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    raylets = {k: raylet_pid(n) for k, n in nodes.items()}  # before a node is removed
    try:
        yield c, nodes, raylets
    finally:
        ray.shutdown()
        c.shutdown()


def faulted_run(cluster, run_dir: Path, monkeypatch, updates: int = UPDATES) -> dict:
    """The run with both faults (module docstring); what each start saw."""
    c, nodes, _ = cluster
    cfg = dataclasses.replace(CFG, updates=updates)
    run, seen = RunDir(run_dir), {"rank_parents": [], "killed_rank": None, "resumed_submits": []}
    seen["t0"], seen["t"] = time.monotonic(), {}
    call = RayRankPool.call

    def call_and_kill(self, command, *args):  # SIGKILL rank 1 50 ms into update 2's command
        seen["rank_parents"].append({parent(p) for p in self.pids})
        if command == "update" and seen.get("arm") and seen["killed_rank"] is None:
            seen["killed_rank"] = self.pids[1]
            threading.Timer(0.05, os.kill, (self.pids[1], signal.SIGKILL)).start()
        return call(self, command, *args)

    monkeypatch.setattr(RayRankPool, "call", call_and_kill)

    def first(name, info):
        seen["t"].setdefault(f"1:{name}", time.monotonic())
        if name == "ray_workers_started":
            seen["worker_parents"] = {parent(p) for p in info["pids"]}
        if name == "rollouts_stored" and info["update"] == 2:
            seen["arm"] = True

    with pytest.raises(RankDied, match="learner rank 1 died during 'update'"):
        train(cfg, str(run.root), progress=False, hook=first)
    seen["t"]["1:died"] = time.monotonic()
    seen["versions_after_kill"], seen["before"] = run.versions(), stored(run)
    with pytest.raises(ResumeError, match="group_size"):  # not this run: refused, with the key
        train(dataclasses.replace(cfg, group_size=GROUP + 1), str(run.root), progress=False)
    assert stored(run) == seen["before"]  # the refusal wrote nothing

    def second(name, info):
        seen["t"].setdefault(f"2:{name}", time.monotonic())
        if name != "episode_submitted":
            return
        seen["resumed_submits"].append((info["episode_id"], info["pid"]))
        n3 = sum(e.startswith("r0003-") for e, _ in seen["resumed_submits"])
        if n3 == 2 + WORKERS and "new_node" not in seen:  # each worker has an episode out
            c.remove_node(nodes["engines"], allow_graceful=False)  # SIGKILL: raylet, workers
            seen["new_node"] = c.add_node(num_cpus=2, resources={"engines": 2})
            seen["t"]["2:new_node"] = time.monotonic()

    seen["summary"] = train(cfg, str(run.root), progress=False, hook=second)
    return {"run": run, **seen}


@pytest.mark.slow  # 110-135 s here at a load average of 15-20 on the 2 cores: Ray's start-ups
def test_the_rehearsal_loses_no_episode_to_a_killed_rank_or_engine_node(cluster, tmp_path,
                                                                        monkeypatch):
    raylets = cluster[2]
    out = faulted_run(cluster, tmp_path / "run", monkeypatch)
    run = out["run"]
    # placement: every rank under the learner node's raylet, every worker under the engines'
    assert out["rank_parents"] and all(p == {raylets["learner"]} for p in out["rank_parents"])
    assert out["worker_parents"] == {raylets["engines"]}
    # fault 1: update 2 never finished; its 6 episodes were stored before the update ran
    assert out["versions_after_kill"] == [0, 1, 2]
    assert set(out["before"]) == planned(2)
    # the resume reused them (none sampled again) and kept them as they were
    submitted = [e for e, _ in out["resumed_submits"]]
    assert not [e for e in submitted if not e.startswith("r0003-")]
    after = stored(run)
    assert all(after[e] == out["before"][e] for e in out["before"])
    # fault 2: both workers died with their node and came back on the new one; the episodes
    # in flight ran again (same ids) and were stored once
    assert out["summary"]["train"]["updates"] == UPDATES
    check_ledger(run, planned(UPDATES))
    row = rl_rows(run)[-1]
    assert row["ray/worker_deaths"] == WORKERS and row["ray/worker_restarts"] == WORKERS
    assert row["ray/rerun_episodes"] >= WORKERS and row["rollout/failed_episodes"] == 0
    assert len(submitted) == len(planned(1)) + row["ray/rerun_episodes"]
    assert all(r["learn/ranks"] == 2.0 and not r["learn/skipped"] for r in rl_rows(run))
    print("rehearsal timeline (s):", {k: round(v - out["t0"], 1) for k, v in out["t"].items()})


@pytest.mark.skipif(not FULL, reason="the full rehearsal (~5 min here): TAURL_REHEARSAL_FULL=1")
def test_full_rehearsal_the_faulted_run_takes_the_steps_of_an_undisturbed_one(
        cluster, tmp_path, monkeypatch):
    """4 updates with both faults against the same 4 updates without: the same episodes
    before the faults (same ids, seeds, weights), and the same losses and grad norms of the
    updates whose batches are the same."""
    out = faulted_run(cluster, tmp_path / "faulted", monkeypatch, updates=4)
    monkeypatch.undo()
    check_ledger(out["run"], planned(4))
    calm = RunDir(tmp_path / "calm")
    train(dataclasses.replace(CFG, updates=4), str(calm.root), progress=False)
    check_ledger(calm, planned(4))
    a, b = stored(out["run"]), stored(calm)
    for e in planned(2):  # sampled before any fault, by the same versions: the same tokens
        sa, sb = a[e]["segments"], b[e]["segments"]
        assert [s["token_ids"] for s in sa] == [s["token_ids"] for s in sb], e
        for x, y in zip(sa, sb, strict=True):  # batched with other rows: rounding only
            assert x["logprobs"] == pytest.approx(y["logprobs"], abs=1e-4) if x["logprobs"] else 1
    rows_a, rows_b = rl_rows(out["run"]), rl_rows(calm)
    for u in (0, 1):  # update 2 was retrained by the resumed run from the v2 checkpoint
        for key in ("learn/loss", "learn/grad_norm"):
            assert rows_a[u][key] == pytest.approx(rows_b[u][key], rel=1e-5), (u, key)


@pytest.mark.slow  # one Ray start-up: 91 s here (153 s with SFT on the ranks)
def test_without_a_cluster_the_ranks_start_one_the_workers_share_and_the_run_stops_it(tmp_path):
    """No Ray running: the RL phase's ranks start a local cluster, the rollout worker joins it
    (it does not start its own), and the run ends with none left. With
    TAURL_REHEARSAL_FULL=1 the SFT phase runs on Ray ranks first (its own cluster, stopped)."""
    import ray

    assert not ray.is_initialized()
    sft = {"sft": "expert", "demos": 8, "sft_batch_size": 4, "sft_epochs": 1} if FULL else {}
    cfg = dataclasses.replace(CFG, updates=1, backend_options={"workers": 1},
                              ray={"placement": "PACK"}, **sft)
    seen = {}

    def hook(name, info):
        if name == "ray_workers_started":
            seen["worker_temp_dir"] = info["temp_dir"]  # None: the collector did not start Ray
            seen["cpus"] = ray.cluster_resources().get("CPU")
        if name == "sft_step":
            seen["sft_ray"] = ray.is_initialized()

    run = RunDir(tmp_path / "run")
    summary = train(cfg, str(run.root), progress=False, hook=hook)
    assert summary["train"]["updates"] == 1 and summary["train"]["sft_steps"] == (2 if FULL else 0)
    assert seen.pop("sft_ray", FULL) is FULL
    assert seen == {"worker_temp_dir": None, "cpus": 3.0}  # one cluster: 2 ranks + 1 worker
    assert not ray.is_initialized()
    check_ledger(run, planned(1))
    assert [r["learn/ranks"] for r in rl_rows(run)] == [2.0]
