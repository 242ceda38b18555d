"""Engine actors and the object-store weight sync (`taurl.scale.engine_actors`, `engine_fleet`,
`weight_transfer`), without vLLM.

vLLM is the one part that does not run here in `make test`: the engine actors below serve
with a `LocalEngine` (kind "local"), which reloads from the directory the actor wrote, as
the vLLM server does (tests/test_vllm_ray.py runs the same path with vLLM). Everything else
is real: the bundle goes through pickling (what Ray's object store does) or through a real
local Ray cluster's object store, and the engine's logprobs are checked against an fp32
forward of the version it says it serves.
"""

from __future__ import annotations

import asyncio
import pickle
import shutil
import tempfile

import pytest
import torch

from taurl.errors import ConfigError
from taurl.policy.files import save_policy
from taurl.policy.logprobs import sequence_logprobs
from taurl.policy.model import create_policy, load_policy
from taurl.policy.protocol import SamplingParams
from taurl.policy.tokenizer import build_tokenizer
from taurl.recipe.config import TrainConfig
from taurl.recipe.validate import load_config
from taurl.scale.engine_actors import EngineActor, EnginePlacement
from taurl.scale.weight_transfer import WeightBundle, pack_checkpoint, serving_files, write_bundle

TEXTS = [f"Town{i} lies in Country{i % 17} and has {i * 37} people." for i in range(200)]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """v0 and v1: the same tiny shape, other seeds; v1 with an optimizer file beside it."""
    root = tmp_path_factory.mktemp("actor-ckpts")
    tok = build_tokenizer(TEXTS, vocab_size=300)
    paths = []
    for v in (0, 1):
        path = root / f"v{v}"
        save_policy(create_policy(tok, "tiny", seed=v), tok, path, {"policy_version": v})
        paths.append(path)
    torch.save({"state": {}}, paths[1] / "optimizer.pt")  # learner state: never sent to engines
    return tok, paths


def _logprobs(path, prompt, ids) -> list[float]:
    model, _ = load_policy(path)
    with torch.no_grad():
        return sequence_logprobs(model, prompt + ids)[len(prompt) :].tolist()


def _sample(engine, prompt) -> tuple[list[int], list[float], int]:
    gen = asyncio.run(
        engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=6, seed=3))
    )
    return gen.token_ids, gen.logprobs, gen.policy_version


def test_a_bundle_holds_the_serving_files_only_and_checks_its_digest(ckpts, tmp_path):
    _, (_, p1) = ckpts
    names = [p.name for p in serving_files(p1)]
    assert "model.safetensors" in names and "config.json" in names and "optimizer.pt" not in names
    bundle = pickle.loads(pickle.dumps(pack_checkpoint(p1, 1)))  # what the object store does
    out = write_bundle(bundle, tmp_path / "w")
    assert out == tmp_path / "w" / "v1"
    for name in names:
        assert (out / name).read_bytes() == (p1 / name).read_bytes()
    write_bundle(WeightBundle(2, bundle.files, bundle.digest), tmp_path / "w")
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v2"]  # only the newest kept
    bad = dict(bundle.files, **{"config.json": b"{}"})
    with pytest.raises(ValueError, match="digest"):
        write_bundle(WeightBundle(3, bad, bundle.digest), tmp_path / "w")
    assert not (tmp_path / "w" / "v3").exists()


def test_the_actor_writes_each_version_locally_and_serves_it(ckpts, tmp_path):
    # the engine actor's class run in this process (Ray only transports its calls)
    tok, (p0, p1) = ckpts
    actor = EngineActor(
        0,
        "local",
        pickle.loads(pickle.dumps(pack_checkpoint(p0, 0))),
        0,
        {},
        seed=0,
        max_batch_size=4,
        local_root=str(tmp_path / "node"),
    )
    try:
        assert actor.served_dir == tmp_path / "node" / "weights" / "v0"
        prompt = tok.encode("Town3 lies in")
        times = asyncio.run(actor.load(pickle.loads(pickle.dumps(pack_checkpoint(p1, 1))), 1))
        assert actor.served_dir == tmp_path / "node" / "weights" / "v1"
        assert not (tmp_path / "node" / "weights" / "v0").exists()
        assert times["write_s"] >= 0 and times["total_s"] >= times["write_s"]
        ids, lps, version = _sample(actor, prompt)
        assert version == 1 and asyncio.run(actor.tokens()) == {1: len(ids)}
        # the logprobs are v1's (a stale engine would give v0's, ~1 nat apart on random weights)
        assert max(abs(a - b) for a, b in zip(lps, _logprobs(p1, prompt, ids), strict=True)) < 1e-4
        assert max(abs(a - b) for a, b in zip(lps, _logprobs(p0, prompt, ids), strict=True)) > 1e-2
        with pytest.raises(Exception, match="sent as v5"):
            asyncio.run(actor.load(pack_checkpoint(p1, 1), 5))
    finally:
        actor.close()
    assert not (tmp_path / "node").exists()  # the node-local directory goes with the actor


def test_an_actor_that_cannot_start_removes_its_node_local_directory(ckpts, tmp_path):
    _, (p0, _) = ckpts
    with pytest.raises(Exception, match="unknown engine_options"):
        EngineActor(0, "local", pack_checkpoint(p0, 0), 0, {"no_such_option": 1}, seed=0,
                    max_batch_size=4, local_root=str(tmp_path / "node"))
    assert not (tmp_path / "node").exists()  # a server that failed to start left it behind


def test_a_relative_vllm_python_is_made_absolute_for_the_engine_nodes(tmp_path, monkeypatch):
    from taurl.scale.engine_fleet import node_paths

    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").write_text("")
    monkeypatch.chdir(tmp_path)  # the actor's working directory is another one
    opts = {"python": "venv/bin/python", "timeout_s": 5}
    assert node_paths(opts) == {"python": str(tmp_path / "venv/bin/python"), "timeout_s": 5}
    assert node_paths({"python": "missing/python"}) == {"python": "missing/python"}  # says so later


def test_placement_bundles_per_engine():
    assert EnginePlacement(engines=2).bundles() == [{"CPU": 1.0}, {"CPU": 1.0}]
    p = EnginePlacement(engines=1, cpus=2, gpus=1, resource="engine")
    assert p.bundles() == [{"CPU": 2, "GPU": 1, "engine": 1.0}] and p.strategy == "SPREAD"
    c = EnginePlacement(engines=1, gpus=0.5, node_ip="10.0.0.1")
    assert (
        c.bundles() == [{"CPU": 1.0, "GPU": 0.5, "node:10.0.0.1": 0.001}] and c.strategy == "PACK"
    )


def test_engine_backend_options_are_validated():
    ok = {
        "backend": "ray",
        "engine": "vllm",
        "env": "search-v0",
        "backend_options": {
            "workers": 2,
            "engines": 2,
            "weight_sync": "shared_fs",
            "colocate": True,
            "sleep_level": 2,
            "engine_cpus": 0.5,
            "engine_gpus": 1,
        },
    }
    load_config(TrainConfig, ok)
    bad = [
        ({"engines": 3}, "must be <= workers"),
        ({"weight_sync": "nfs"}, "weight_sync 'nfs' is not valid"),
        ({"sleep_level": 3}, "sleep_level 3"),
        ({"colocate": "yes"}, "colocate 'yes'"),
        ({"engine_cpus": 0}, "engine_cpus 0"),
    ]
    for opts, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            load_config(TrainConfig, {**ok, "backend_options": {"workers": 2, **opts}})
    with pytest.raises(ConfigError, match="drop engine_options url"):
        load_config(TrainConfig, {**ok, "engine_options": {"url": "http://x"}})
    with pytest.raises(ConfigError, match="are for engine: vllm"):
        load_config(TrainConfig, {**ok, "engine": "local"})


def test_a_fleet_on_ray_syncs_through_the_object_store(ckpts, tmp_path):
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'taurl[ray]'")
    from taurl.scale.engine_actors import RemoteEngine
    from taurl.scale.engine_fleet import EngineFleet, driver_node_ip
    from taurl.scale.ray_backend import _init_local_cluster

    tok, (p0, p1) = ckpts
    owns = not ray.is_initialized()
    temp = tempfile.mkdtemp(prefix="taurl-ray-", dir="/tmp")  # Ray's sockets: short paths
    if owns:
        _init_local_cluster(ray, 1, temp)
    events = []
    fleet = EngineFleet.start(  # colocated: pinned to this node (local engines do not sleep)
        ray,
        "local",
        p0,
        0,
        {"engines": 1, "colocate": True},
        engine_options={},
        seed=0,
        max_batch_size=4,
        hook=lambda name, info: events.append((name, info)),
    )
    try:
        [info] = fleet.infos
        node_ip = driver_node_ip(ray)
        assert ray.cluster_resources().get(f"node:{node_ip}") == 1  # what colocation pins to
        assert info["node_id"] == ray.get_runtime_context().get_node_id()
        assert info["version"] == 0 and info["served_dir"].startswith(info["root"])
        assert not info["served_dir"].startswith(str(p0.parent))  # its own copy, not the learner's
        stats = fleet.sync(p1, 1)
        assert (
            stats["ray/weight_sync_mb"] > 1
            and stats["ray/weight_sync_s"] >= stats["ray/engine_write_s"]
        )
        assert [n for n, _ in events] == ["ray_engines_started", "weights_synced"]
        assert "time/ray_engines_startup_s" in fleet.take_stats()
        engine = RemoteEngine(fleet.actors[0], 0, info["max_context"])
        asyncio.run(engine.load_weights("(unused)", 1))  # checks what the actor serves
        with pytest.raises(Exception, match="serves version 1, not 2"):
            asyncio.run(engine.load_weights("(unused)", 2))
        prompt = tok.encode("Town5 lies in")
        ids, lps, version = _sample(engine, prompt)
        assert version == 1
        assert max(abs(a - b) for a, b in zip(lps, _logprobs(p1, prompt, ids), strict=True)) < 1e-4
        root = ray.get(fleet.actors[0].info.remote())["served_dir"]
        assert root.endswith("/weights/v1")
    finally:
        fleet.close()
        if owns:
            ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
