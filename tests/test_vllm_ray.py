"""``engine: vllm`` inside Ray: the recipe's RL rollouts sampled by a real vLLM server that an
engine actor started on another Ray node, its weights synced through the object store.

The vLLM tier (`make test-vllm`): skipped unless TAURL_VLLM_PYTHON names the vLLM venv's
python, like tests/test_vllm_engine.py. The cluster has two nodes on this machine
(`ray.cluster_utils.Cluster`): the head runs the learner's driver and the rollout workers,
the second node has the custom resource ``engine`` and gets the engine actor.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter

import pytest

from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.data.trajectory import validate_trajectory
from taurl.policy.vllm_server import PYTHON_ENV
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'taurl[ray]'")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        not os.environ.get(PYTHON_ENV),
        reason=f"set {PYTHON_ENV} to the vLLM venv's python to run these",
    ),
]

UPDATES, TASKS, GROUP = 3, 2, 3
CFG = TrainConfig(
    demos=16,
    sft_batch_size=16,
    sft_epochs=1,
    updates=UPDATES,
    tasks_per_update=TASKS,
    group_size=GROUP,
    eval_tasks=2,
    eval_trials=1,
    max_turns=1,
    max_action_tokens=8,
    max_episode_tokens=8,
    task_options={"families": ["country_continent"], "split_by": "country"},
    warmup_options={"steps": 0},
    system_prompt="",
    tokenizer_texts=2000,
    concurrency=2,
    temperature=1.0,
    engine="vllm",
    backend="ray",
    backend_options={"workers": 2, "engines": 1, "weight_sync": "object_store"},
)


def _engine_options() -> dict:
    return {
        "python": os.environ[PYTHON_ENV],
        "timeout_s": 300,
        "server_options": {"max_model_len": 512, "startup_timeout_s": 600},
    }


def _run(tmp_path, cfg: TrainConfig, cluster_nodes: list[dict]) -> dict:
    """Train `cfg` on a Ray cluster of `cluster_nodes` (the first is the head); what the
    hooks saw, the run directory and the driver's node id."""
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()
    cluster = Cluster(initialize_head=True, head_node_args=cluster_nodes[0])
    for node in cluster_nodes[1:]:
        cluster.add_node(**node)
    seen: dict = {"synced": [], "run": RunDir(tmp_path / "run")}

    def hook(name, info):
        if name == "ray_engines_started":
            seen["infos"] = info["infos"]
        elif name == "weights_synced":
            seen["synced"].append(info)
        elif name == "ray_engines_stopping":
            seen["tokens"] = info["tokens_by_version"]

    try:
        ray.init(address=cluster.address, log_to_driver=False)
        seen["driver_node"] = ray.get_runtime_context().get_node_id()
        seen["summary"] = train(cfg, str(seen["run"].root), progress=False, hook=hook)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return seen


def _check(seen: dict) -> list[dict]:
    """The run's invariants: every RL episode once; every action token sampled by the version
    its round served (the ledger's and the engine's own counts agree); the mismatch reported."""
    run = seen["run"]
    rows = [r for r in map(json.loads, run.metrics.read_text().splitlines()) if r["phase"] == "rl"]
    assert [r["update"] for r in rows] == list(range(1, UPDATES + 1))
    ledger_tokens: Counter[int] = Counter()
    with Ledger(run.ledger) as ledger:
        ids = sorted(e for e in ledger.episode_ids() if e.startswith("r"))
        assert ids == sorted(
            f"r{u:04d}-{i:03d}-{g:02d}"
            for u in range(1, UPDATES + 1)
            for i in range(TASKS)
            for g in range(GROUP)
        )
        for e in ids:
            traj = ledger.get(e)
            validate_trajectory(traj)
            served = int(e[1:5])  # round u is served as version u (v1 = the SFT policy)
            actions = [s for s in traj.segments if s.kind == "action"]
            assert actions and {s.policy_version for s in actions} == {served}, e
            for s in actions:
                ledger_tokens[s.policy_version] += len(s.token_ids)
    # the engine counted each token under the version it served when sampling it
    [engine_tokens] = seen["tokens"]
    assert {int(v): n for v, n in engine_tokens.items()} == dict(ledger_tokens)
    # v2 and v3 served rounds 2 and 3; v4 (the last update's) is synced as the loop ends
    assert [s["version"] for s in seen["synced"]] == list(range(2, UPDATES + 2))
    for r in rows:  # learner vs behaviour logprobs, as with engine: vllm in-process (fp32 both)
        assert r["mismatch/abs_max"] < 1e-3, r
    for r in rows[1:]:
        assert r["ray/weight_sync_s"] > 0 and r["ray/weight_sync_mb"] > 0.5
    return rows


def test_vllm_engine_inside_ray_on_its_own_node_three_updates(tmp_path):
    cfg = dataclasses.replace(CFG, engine_options=_engine_options())
    seen = _run(tmp_path, cfg, [{"num_cpus": 2}, {"num_cpus": 1, "resources": {"engine": 1}}])
    [info] = seen["infos"]
    assert info["node_id"] != seen["driver_node"]  # the engine node, by its custom resource
    assert info["served_dir"].startswith(
        info["root"]
    )  # its own copy, written from the object store
    assert not info["served_dir"].startswith(str(seen["run"].root))
    rows = _check(seen)
    assert "time/ray_engines_startup_s" in rows[0]
    print(
        "engine: vllm in Ray, per update:",
        json.dumps(
            [
                {
                    k: round(r[k], 7)
                    for k in ("mismatch/abs_mean", "mismatch/abs_max", "time/ray_engines_startup_s")
                    if k in r
                }
                for r in rows
            ]
        ),
    )
    print(
        "weight syncs:",
        json.dumps([{k: round(v, 4) for k, v in s.items()} for s in seen["synced"]]),
    )


def test_vllm_engine_colocated_with_the_learner_sleeps_between_rounds(tmp_path):
    # CPU: vLLM answers /sleep and /is_sleeping but keeps the weights where they are (sleep
    # mode needs a GPU); what runs here is the placement on the learner's node, the sleep
    # after each round, the wake before each sync and the run's invariants through them
    opts = {"workers": 2, "engines": 1, "colocate": True, "sleep_level": 1}
    cfg = dataclasses.replace(CFG, engine_options=_engine_options(), backend_options=opts)
    seen = _run(tmp_path, cfg, [{"num_cpus": 3}])
    [info] = seen["infos"]
    assert info["node_id"] == seen["driver_node"]
    rows = _check(seen)
    for r in rows[1:]:  # each round's sleep is reported with the next one
        assert r["ray/engines_asleep"] == 1 and r["ray/engine_wake_s"] > 0, r
    print("colocated:", json.dumps([{k: round(r[k], 4) for k in r if k.startswith("ray/engine")}
                                    for r in rows[1:]]))
