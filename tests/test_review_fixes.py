"""Defects a review of the code found (issue 28, "smaller ones"): each test fails on the code
before its fix. One test (or two) per defect, named after what must hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from taurl.recipe.config import TrainConfig


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    """The default tiny policy of search-v0 (untrained), as a checkpoint directory."""
    from taurl.envs.search import build_corpus, generate_tasks
    from taurl.policy.model import build_default_policy

    path = tmp_path_factory.mktemp("policy") / "v0"
    texts = [d.text for d in build_corpus()[::40]] + [
        t.prompt for t in generate_tasks("train", n=300, seed=0)
    ]
    build_default_policy(texts, path, size="tiny", seed=0)
    return path

# -- one list of engine 'local' options ---------------------------------------------------


def test_documented_local_engine_options_pass_the_config_and_the_engine():
    """`replicas` (README: several engines) is an option of engine 'local': the config takes
    it, and what the config takes is exactly what `make_engine` takes (one list)."""
    from taurl.policy.factory import LOCAL_ENGINE_OPTIONS

    assert "replicas" in LOCAL_ENGINE_OPTIONS
    for opts in (
        {"replicas": 2},
        {"replicas": 2, "max_batch_size": 8, "prefix_cache_tokens": 0, "slim_decode": False},
    ):
        assert not [
            p for p in TrainConfig(engine_options=opts).problems() if "engine_options" in p
        ], opts
    (bad,) = [
        p
        for p in TrainConfig(engine_options={"replica": 2, "seed": 1}).problems()
        if "engine_options" in p
    ]
    assert (
        "['replica', 'seed']" in bad
        and "replicas" in bad
        and "seed comes from the config's seed" in bad
    )


def test_local_engine_replicas_build_a_router(policy_dir):
    from taurl.policy.engine import make_engine
    from taurl.policy.router import EngineRouter
    from taurl.policy.tokenizer import load_tokenizer

    cfg = TrainConfig(engine_options={"replicas": 2})
    engine = make_engine("local", policy_dir, load_tokenizer(policy_dir), version=0,
                         **{"max_batch_size": cfg.concurrency, "seed": 0, **cfg.engine_options})
    try:
        assert isinstance(engine, EngineRouter) and len(engine.engines) == 2
    finally:
        engine.close()


# -- the async schedule finds every stored episode on restart ------------------------------


@pytest.mark.parametrize(
    "group,j", [(0, 0), (99_999, 99), (100_000, 0), (1_234_567, 5), (3, 100), (100_000, 250)]
)
def test_async_restore_pattern_matches_every_episode_id(group, j):
    from taurl.recipe.schedule.async_rl import EPISODE_ID, episode_id

    m = EPISODE_ID.match(episode_id(group, j))
    assert m and (int(m.group(1)), int(m.group(2))) == (group, j)
    assert not EPISODE_ID.match(f"r{group:04d}-{j:03d}-00")  # a sync run's ids stay out


# -- a resumed partial action samples with a seed no other turn uses -----------------------


class _AbortOnce:
    """An engine that serves one fixed search action; its first answer is cut by an abort
    (two ids, as a weight update cuts an action), the rest are whole. Records each seed."""

    version, max_context, source = 0, 1024, "policy"

    def __init__(self, tokenizer):
        self.ids = list(tokenizer("<search>Lyon</search>", add_special_tokens=False)["input_ids"])
        self.seeds: list[int] = []

    async def generate(self, prompt_ids, sampling):
        from taurl.policy.engine import Generation

        self.seeds.append(sampling.seed)
        if len(self.seeds) == 1:
            return Generation(self.ids[:2], [-1.0, -1.0], "abort", 0)
        done = len(self.seeds) == 2  # the continuation: the rest of the cut action
        ids = self.ids[2:] if done else self.ids
        return Generation(ids, [-1.0] * len(ids), "stop", 1, stop_matched="</search>")


def test_resumed_partial_action_seed_is_not_a_later_turns(policy_dir):
    import asyncio

    from taurl import envs
    from taurl.envs.search import generate_tasks
    from taurl.policy.tokenizer import load_tokenizer
    from taurl.rollout.loop import RolloutConfig, run_episode

    tok = load_tokenizer(policy_dir)
    engine = _AbortOnce(tok)
    task = generate_tasks("train", n=1, seed=0)[0]
    traj = asyncio.run(
        run_episode(
            engine, envs.make("search-v0", max_turns=4), tok, task, seed=3,
            config=RolloutConfig(max_turns=4, resume_aborted=True, max_episode_tokens=400),
        )
    )
    assert len(traj.turns) == 4 and len(engine.seeds) == 5  # turn 0 in two pieces, then turns 1-3
    assert len(set(engine.seeds)) == 5, engine.seeds


# -- env registration and --import errors are taurl's, with the real cause -------------------


def test_duplicate_env_name_is_a_taurl_error_that_says_what_to_do():
    from taurl import envs
    from taurl.errors import Error

    with pytest.raises(Error) as e:
        envs.register("search-v0", "taurl.envs.search.env:SearchEnv")
    assert "already registered" in str(e.value) and "another name" in str(e.value)


def test_import_error_inside_an_env_module_shows_the_real_error(tmp_path, monkeypatch):
    import sys

    from taurl.envs.registry import import_env_modules
    from taurl.errors import Error

    (tmp_path / "review_broken_env.py").write_text(
        "import os\nimport review_no_such_dependency  # line 2\n"
    )
    (tmp_path / "review_typo_env.py").write_text("X = 1\nY = undefined_name\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod, cause, line in (
        ("review_broken_env", "No module named 'review_no_such_dependency'", 2),
        ("review_typo_env", "NameError: name 'undefined_name' is not defined", 2),
    ):
        with pytest.raises(Error) as e:
            import_env_modules([mod])
        text = str(e.value)
        assert cause in text and f"{mod}.py:{line}" in text, text
        assert "must be importable from the current directory" not in text
        sys.modules.pop(mod, None)
    with pytest.raises(Error) as e:  # the module itself is missing: then the hint is the right one
        import_env_modules(["review_absent_module"])
    assert "must be importable from the current directory" in str(e.value)


# -- what `taurl rollout` and `taurl promote` write is written whole or not at all ------------


def _disk_full_at_fsync(monkeypatch):
    """The disk fills while a file is written: the error surfaces at fsync (delayed allocation)."""
    import errno
    import os

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)


def test_rollout_config_is_written_atomically(tmp_path, monkeypatch, capsys):
    from taurl.cli.main import main

    _disk_full_at_fsync(monkeypatch)
    code = main(["rollout", "--run-dir", str(tmp_path / "r"), "--episodes", "1", "--max-turns", "1",
                 "--max-action-tokens", "4", "--no-progress"])
    assert code == 1 and "disk is full" in capsys.readouterr().err
    assert not (tmp_path / "r" / "config.yaml").exists()  # no config a later rollout would keep


def test_promote_evaluation_is_written_atomically(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from taurl.data.atomic import DiskWriteError
    from taurl.data.runs import RunDir
    from taurl.eval import eval_run
    from taurl.eval.promote_run import find_or_evaluate

    result = SimpleNamespace(to_dict=lambda: {"policy_version": 1, "success": 0.5})
    monkeypatch.setattr(eval_run, "evaluate_policy", lambda *a, **k: result)
    run = RunDir.create(tmp_path / "r")
    _disk_full_at_fsync(monkeypatch)
    with pytest.raises(DiskWriteError):
        find_or_evaluate(
            run, TrainConfig(), SimpleNamespace(holdout=[]), 1, "holdout", progress=False
        )
    # no evaluation a later promote would reuse
    assert not list((tmp_path / "r" / "evals").glob("*.json"))


# -- top-p: recorded, and refused where it would bias an importance ratio -------------------


def test_rollout_top_p_is_recorded_and_kept_out_of_importance_ratios(tmp_path):
    import numpy as np

    from taurl.cli.main import main
    from taurl.data.ledger import Ledger
    from taurl.errors import ContractError
    from taurl.train.rows import make_rows

    def rollout(name, top_p):
        run = tmp_path / name
        assert (
            main(
                [
                    "rollout", "--run-dir", str(run), "--episodes", "2", "--max-turns", "1",
                    "--max-action-tokens", "6", "--top-p", str(top_p), "--no-progress",
                ]
            )
            == 0
        )
        with Ledger(run / "ledger.sqlite") as ledger:
            return ledger.query()

    nucleus, full = rollout("nucleus", 0.9), rollout("full", 1.0)
    assert [t.metadata["sampling"] for t in nucleus] == [{"temperature": 1.0, "top_p": 0.9}] * 2
    assert [t.metadata["sampling"]["top_p"] for t in full] == [1.0, 1.0]
    with pytest.raises(ContractError) as e:
        # an RL row: a ratio over the behaviour logprobs
        make_rows(nucleus, np.zeros((2, 1)), pad_id=0)
    assert e.value.rule == "behaviour_top_p" and "top_p=0.9" in str(e.value)
    # top_p 1: the stored logprobs are the sampling distribution's
    make_rows(full, np.zeros((2, 1)), pad_id=0)
    make_rows(nucleus, None, pad_id=0)  # SFT rows read no behaviour logprob: fine


def test_proxy_forces_top_p_one_for_training_and_records_the_agents_otherwise(policy_dir):
    openai = pytest.importorskip("openai")
    from taurl import envs
    from taurl.envs.search import generate_tasks
    from taurl.policy.local_engine import LocalEngine
    from taurl.policy.model import load_policy
    from taurl.proxy.runner import episode_records
    from taurl.proxy.server import ProxyLimits, ProxyServer

    model, tok = load_policy(policy_dir)
    task = generate_tasks("train", n=1, seed=0)[0]
    for forced, expected in ((1.0, 1.0), (None, 0.5)):
        limits = ProxyLimits(max_action_tokens=4, max_context=1024, top_p=forced)
        with ProxyServer(LocalEngine(model, tok, seed=0), tok, limits=limits) as p:
            p.open("ep", seed=1)
            c = openai.OpenAI(base_url=p.base_url("ep"), api_key="x", max_retries=0)
            c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": task.prompt}], top_p=0.5
            )
            (traj,) = episode_records(
                p.pop("ep"), task=task, group_id="g", run_id="t", env_name="search-v0",
                env_version="1", verifier=envs.spec("search-v0").make_verifier(), error=None,
                agent_name="t", answer=None,
            )
        assert traj.metadata["sampling"]["top_p"] == expected


# -- a checkpoint written in the background records its own update's learning rate --------------


def test_background_checkpoint_records_its_updates_learning_rate(policy_dir):
    """The async learner writes update n's checkpoint while it computes update n+1; the
    optimizer state it saves must hold step n's learning rate, not the next step's, which
    the warm-up changes every step."""
    import threading
    import time

    from taurl.policy.model import load_policy
    from taurl.recipe.schedule.learner_proc import CheckpointWriter
    from taurl.train.learner import Learner, LearnerConfig
    from taurl.train.optim import warmup_lr

    model, _ = load_policy(policy_dir)
    learner = Learner(model, LearnerConfig(lr=1e-3, lr_warmup_steps=4))
    writer = CheckpointWriter()
    writer.attach(learner)

    def step() -> None:  # one update's backward, then the learner's own optimizer step
        learner.optimizer.zero_grad()
        sum((p.float() ** 2).sum() for p in model.parameters() if p.requires_grad).backward()
        learner._step()

    step()
    saved, started = [], threading.Event()

    def write() -> None:  # slower than the next update's forward and backward, as a real save is
        started.set()
        time.sleep(1.0)
        saved.append(learner.optimizer.state_dict()["param_groups"][0]["lr"])

    writer.submit(write)
    started.wait(10)
    step()  # the next update runs while the checkpoint is written
    writer.wait()
    assert saved == [warmup_lr(1e-3, 1, 4)]
    assert learner.optimizer.param_groups[0]["lr"] == warmup_lr(1e-3, 2, 4)


# -- taurl inspect shows a demonstration's own action text ------------------------------------


def test_inspect_shows_a_demonstrations_action_text(policy_dir):
    import asyncio

    from taurl import envs
    from taurl.cli.commands import render_trajectory
    from taurl.envs.search import generate_tasks
    from taurl.policy.tokenizer import load_tokenizer
    from taurl.rollout.synth import demonstrations

    tok = load_tokenizer(policy_dir)
    (demo,) = asyncio.run(
        demonstrations(
            generate_tasks("train", n=1, seed=0), tok, lambda: envs.make("search-v0"),
            expert=envs.spec("search-v0").expert,
        )
    )
    assert demo.source == "expert"
    out = render_trajectory(demo, tok, color=False)
    assert any(seg.kind == "action" for seg in demo.segments)
    for seg in demo.segments:  # each segment's own text follows its tag
        text = tok.decode(list(seg.token_ids), skip_special_tokens=False)
        body = f"⟦{text}⟧" if seg.kind == "action" else text
        assert (
            f"source=expert] {body}" in out
            if seg.kind == "action"
            else f"n={len(seg.token_ids)}] {body}" in out
        )


# -- the standalone proxy: a seed per episode, tools listed before the first call --------------


def test_standalone_proxy_gives_each_episode_its_own_seed(policy_dir):
    openai = pytest.importorskip("openai")
    from taurl.policy.local_engine import LocalEngine
    from taurl.policy.model import load_policy
    from taurl.proxy.server import ProxyLimits, ProxyServer

    model, tok = load_policy(policy_dir)
    limits = ProxyLimits(max_action_tokens=12, max_context=1024, temperature=None)
    messages = [{"role": "user", "content": "In which country is Lyon?"}]

    def sample(**seed):
        with ProxyServer(LocalEngine(model, tok, seed=0), tok, limits=limits, open_on_call=True,
                         **seed) as p:
            out = {}
            # opened by their first call, as episodes run by hand are
            for eid in ("ep-a", "ep-b", "ep-c"):
                c = openai.OpenAI(base_url=p.base_url(eid), api_key="x", max_retries=0)
                c.chat.completions.create(model="m", messages=messages)
                out[eid] = (
                    p.episodes[eid].seed,
                    p.episodes[eid].capture.chains[0].segments[-1].token_ids,
                )
            return out

    first, again = sample(), sample()  # the default server seed
    assert len({seed for seed, _ in first.values()}) == 3  # distinct seeds ...
    assert len({ids for _, ids in first.values()}) == 3  # ... so distinct samples of one prompt
    assert first == again  # and a server seed fixes them
    assert {s for s, _ in sample(seed=1).values()}.isdisjoint({s for s, _ in first.values()})


def test_proxy_lists_its_tools_before_the_episodes_first_model_call(policy_dir):
    from types import SimpleNamespace

    import httpx

    from taurl.policy.local_engine import LocalEngine
    from taurl.policy.model import load_policy
    from taurl.proxy.server import ProxyServer

    model, tok = load_policy(policy_dir)
    tools = SimpleNamespace(
        declarations=[{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    )
    with ProxyServer(LocalEngine(model, tok), tok, tools=tools, open_on_call=True) as p:
        r = httpx.get(f"{p.url}/rollouts/fresh-episode/tools")
        assert r.status_code == 200 and r.json()["tools"] == tools.declarations
        assert p.episodes["fresh-episode"].status == "open"
