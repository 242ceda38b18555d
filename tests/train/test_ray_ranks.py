"""Learner ranks as Ray actors (``train.launcher: ray``) take the step of local ranks and of one.

A real local Ray cluster (2 CPUs, no dashboard), a placement group of 2 one-CPU bundles, the
ranks' gloo group rendezvoused at rank 0's node IP: the same tiny-policy batches as
tests/train/test_distributed_learner.py through `Learner`, 2 local ranks and 2 Ray ranks.
A SIGKILLed rank actor ends the driver's call with `RankDied` (no hang), and a placement the
cluster cannot hold is refused with what it has.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import pytest
import torch
from test_distributed_learner import _batches
from test_learner_invalid import _model

pytest.importorskip("ray", reason="ray is not installed: pip install 'taurl[ray]'")

from taurl.errors import Error  # noqa: E402
from taurl.train.distributed.equivalence import run_pair  # noqa: E402
from taurl.train.distributed.pool import RankDied, RankPool  # noqa: E402
from taurl.train.distributed.ray_ranks import RayRankOptions, RayRankPool  # noqa: E402
from taurl.train.learner import LearnerConfig  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    from taurl.scale.ray_backend import _init_local_cluster

    temp_dir = tempfile.mkdtemp(prefix="taurl-ray-", dir="/tmp")
    _init_local_cluster(ray, 2, temp_dir)
    yield ray
    ray.shutdown()


def test_two_ray_ranks_take_the_step_of_two_local_ranks_and_of_one(ray_cluster):
    model = _model()
    batches = _batches(model)[:3]
    config = LearnerConfig(lr=1e-2, micro_batch_tokens=40, kl_coef=0.0)
    pools = {"ray": RayRankPool.start(2, "cpu", RayRankOptions(placement="SPREAD")),
             "local": RankPool.start(2)}
    try:
        ray_pool = pools["ray"]
        assert ray_pool.world_size == 2 and os.getpid() not in ray_pool.pids
        [node] = {n["NodeManagerAddress"] for n in ray_cluster.nodes()}  # the one node's IP
        assert ray_pool.nodes == [node] * 2 and len(set(ray_pool.pids)) == 2
        pairs = {k: run_pair(model, config, batches, strategy="fsdp", world_size=2, pool=p)
                 for k, p in pools.items()}
    finally:
        for p in pools.values():
            p.close()
    ray_pair, local_pair = pairs["ray"], pairs["local"]
    rel = ray_pair.relative()
    print(f"ray ranks vs 1: {rel}, weights {ray_pair.weight_difference():.3g} (lr {config.lr})")
    assert rel["learn/loss"] <= 1e-5 and rel["learn/grad_norm"] <= 1e-5, rel
    assert ray_pair.weight_difference() < 1e-2 * config.lr
    # the same ranks in other processes: the same group, the same reductions, the same bits
    for a, b in zip(ray_pair.got, local_pair.got, strict=True):
        assert a["learn/loss"] == b["learn/loss"] and a["learn/grad_norm"] == b["learn/grad_norm"]
    assert all(torch.equal(p, q) for p, q in zip(ray_pair.two.model.parameters(),
                                                  local_pair.two.model.parameters(), strict=True))
    assert not ray_cluster.util.placement_group_table() or all(
        g["state"] == "REMOVED" for g in ray_cluster.util.placement_group_table().values())


def test_a_killed_ray_rank_ends_the_call_and_its_peer(ray_cluster):
    pool = RayRankPool.start(2, "cpu")
    model = _model()
    from taurl.train.distributed.driver import DistributedLearner

    learner = DistributedLearner(model, LearnerConfig(lr=1e-2, micro_batch_tokens=40),
                                 strategy="ddp", world_size=2, pool=pool)
    os.kill(pool.pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(RankDied, match="learner rank 1 died"):
        learner.update(_batches(model)[0])
    assert time.monotonic() - t0 < 60  # the driver did not wait out the group's timeout
    pool.close()
    deadline = time.monotonic() + 30  # the surviving rank's actor is killed too
    while time.monotonic() < deadline:
        try:
            os.kill(pool.pids[0], 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("rank 0's actor outlived the pool")
    assert ray_cluster.is_initialized()  # a cluster this pool did not start stays up


def test_a_placement_the_cluster_cannot_hold_is_refused_with_what_it_has(ray_cluster):
    opts = RayRankOptions(bundle={"CPU": 1, "learner": 1}, ready_timeout_s=2)
    with pytest.raises(Error, match=r"could not place 2 learner ranks .*'learner': 1"):
        RayRankPool.start(2, "cpu", opts)
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.validate import option_problems
    from taurl.train.distributed.strategy import RayPlacement

    assert option_problems("train.ray", RayPlacement, {"placement": "pack", "nodes": 2}) == [
        "train.ray: unknown option 'nodes' (options: placement, bundle, "
        "ready_timeout_s)"]
    assert option_problems("train.ray", RayPlacement,
                           {"placement": "pack", "bundle": {"CPU": -1}}) == [
        "train.ray.placement must be one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD "
        "(got 'pack')",
        "train.ray.bundle must map resource names to amounts >= 0, e.g. {CPU: 1, learner: 1} "
        "(got {'CPU': -1})"]
    assert TrainConfig(train={"ray": {"ready_timeout_s": 5}}).train.ray.ready_timeout_s == 5


def test_the_train_section_takes_the_launcher_and_names_its_problems():
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.stages import parallel_problems, rank_launch

    cfg = TrainConfig(train_strategy="fsdp", train_world_size=2, launcher="ray",
                      ray={"placement": "SPREAD", "bundle": {"CPU": 2, "learner": 1}},
                      backend="ray", backend_options={"workers": 3})
    assert parallel_problems(cfg) == []
    assert cfg.section("train").launcher == "ray"
    # a local cluster started for the ranks also holds the rollout workers' CPUs (2 x 2 + 3)
    assert rank_launch(cfg) == {"launcher": "ray", "num_cpus": 7,
                                "ray": {"placement": "SPREAD", "bundle": {"CPU": 2, "learner": 1}}}
    assert rank_launch(TrainConfig()) == {"launcher": "local"}

    def problems(**kw):
        return parallel_problems(TrainConfig(**{"train_strategy": "ddp", "train_world_size": 2,
                                                **kw}))

    assert problems(launcher="slurm") == [
        "train.launcher must be one of local, ray (got 'slurm')"]
    assert problems(ray={"placement": "SPREAD"}) == [
        "train.ray is for train.launcher: ray; drop it"]
    assert problems(launcher="ray", train_strategy="single", train_world_size=1)[0] == (
        "train.launcher ray starts learner ranks: it needs train.strategy ddp or fsdp")


def test_backend_options_resources_place_the_rollout_workers_and_are_checked():
    from taurl.scale import backend_problems

    assert (
        backend_problems("ray", {"workers": 2, "resources": {"engines": 1}}, engine="local") == []
    )
    assert backend_problems("ray", {"resources": {"engines": 0}}, engine="local") == [
        "backend_options resources must map Ray resource names to amounts > 0, e.g. "
        "{engines: 1} (got {'engines': 0})"]
