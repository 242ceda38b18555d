"""The async schedule (`taurl.recipe.schedule`): admission rule, staleness ≤ η under adversarial
timing, partial rollouts split by version, and a SIGKILLed async run that loses nothing.

The staleness tests drive `AsyncSchedule` itself with a real `LocalEngine` (a tiny policy),
the real search env behind `ToolLatency` (heavy-tailed random waits on every tool call),
a real ledger and real weight swaps from a checkpoint; the learner is a random sleep (a
slow learner against fast producers: the timing is the adversary, the gradient step is not).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from taurl import envs
from taurl.credit.tokens import token_turn_index, turn_spans
from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.data.trajectory import validate_trajectory
from taurl.envs.search import generate_tasks
from taurl.policy.engine import LocalEngine
from taurl.policy.files import save_policy
from taurl.policy.model import build_default_policy
from taurl.recipe.config import TrainConfig
from taurl.recipe.schedule.admission import capacity, episode_age, stale_token_keep, staleness_stats
from taurl.recipe.schedule.async_rl import AsyncSchedule
from taurl.recipe.schedule.latency import ToolLatency
from taurl.rollout.loop import RolloutConfig, run_episode

# --------------------------------------------------------------------------------------
# the admission rule


def test_capacity_formula_by_hand():
    # min(64 − 3, (1 + 0 + 1)·4 − (5 + 3)) = min(61, 0) = 0: two batches are already started
    assert capacity(max_concurrent=64, running=3, accepted=5, version=0, eta=1, batch=4) == 0
    # one update later the window moves by B = 4: min(61, 12 − 8) = 4
    assert capacity(max_concurrent=64, running=3, accepted=5, version=1, eta=1, batch=4) == 4
    # the concurrency limit binds: min(5 − 3, (4 + 2 + 1)·4 − 3) = 2
    assert capacity(max_concurrent=5, running=3, accepted=0, version=2, eta=4, batch=4) == 2
    # η = 0 is the synchronous window: exactly one batch, plus k = 2 over-provisioned
    assert (
        capacity(
            max_concurrent=99, running=0, accepted=0, version=0, eta=0, batch=4, overprovision=2
        )
        == 6
    )
    # never negative
    assert capacity(max_concurrent=99, running=7, accepted=0, version=0, eta=0, batch=4) == 0


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
def test_admission_never_starts_more_than_eta_plus_one_batches_ahead(eta):
    """A random interleaving of starts, completions, drops and updates: after every admission
    started ≤ (η + v + 1)·B + k and running ≤ max_concurrent (the docstring's guarantee)."""
    rng = random.Random(eta)
    B, k, max_c = 4, 1, 9
    running = accepted = consumed = v = 0
    for _ in range(3000):
        n = capacity(
            max_concurrent=max_c, running=running, accepted=accepted, version=v, eta=eta, batch=B,
            overprovision=k,
        )
        running += n
        assert running <= max_c
        assert accepted + running <= (eta + v + 1) * B + k
        event = rng.random()
        if event < 0.5 and running:  # a group finishes (kept) ...
            running -= 1
            accepted += 1
        elif event < 0.6 and running:  # ... or is aborted (frees its place)
            running -= 1
        elif event < 0.65 and accepted > consumed:  # a ready group is dropped as stale
            accepted -= 1
        elif accepted - consumed >= B:  # the learner takes a batch: one more version
            consumed += B
            v += 1
    assert v > 10  # the walk really went through many updates


# --------------------------------------------------------------------------------------
# staleness <= eta under adversarial timing


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tasks = generate_tasks("train", n=40, seed=0)
    env = envs.make("search-v0")
    path = tmp_path_factory.mktemp("policy")
    model, tok = build_default_policy(
        [t.prompt for t in tasks] + [env.system_prompt] * 5, path / "tmp", size="tiny", seed=0
    )
    save_policy(model, tok, path / "v", {"policy_version": 0})
    return SimpleNamespace(tasks=tasks, model=model, tok=tok, ckpt=path / "v")


def _schedule(tiny, tmp_path, eta: int, interrupt: str, overprovision: int, B: int = 2, G: int = 2):
    cfg = TrainConfig(
        tasks_per_update=B, group_size=G, concurrency=16, staleness_eta=eta, interrupt=interrupt,
        overprovision=overprovision, schedule="async",
    )
    ledger = Ledger(tmp_path / "ledger.sqlite")
    r = SimpleNamespace(
        cfg=cfg, state={"sft_version": 1}, run=RunDir.create(tmp_path / "run"), ledger=ledger,
        plan=SimpleNamespace(rl=tiny.tasks), hook=lambda e, i: None,
    )
    engine = LocalEngine(tiny.model, tiny.tok, version=1, max_batch_size=16, seed=0)

    def make_env():  # heavy-tailed tool waits: mean 30 ms, up to 0.6 s
        return ToolLatency(envs.make("search-v0", max_turns=3), mean_s=0.03, sigma=1.5, max_s=0.6)

    collector = SimpleNamespace(
        engine=engine, tokenizer=tiny.tok, make_env=make_env, run_id="t",
        config=RolloutConfig(max_turns=3, max_action_tokens=16, max_episode_tokens=48),
    )
    return AsyncSchedule(r, collector, version=1, seed=0), ledger


async def _drive(sched: AsyncSchedule, ckpt: Path, updates: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    producer = sched.start()
    rows = []
    try:
        for _ in range(updates):
            groups = await sched.take()
            batch = [t for g in groups for t in g.trajectories()]
            rows.append(
                {
                    **staleness_stats(batch, sched.version),
                    "groups": len(groups),
                    "complete": all(len(g.trajectories()) == len(g.specs) for g in groups),
                    "window": sched.accepted + len(sched.running) - (sched.version - 1) * sched.B,
                    "ages": [episode_age(t, sched.version) for t in batch],
                }
            )
            await asyncio.sleep(rng.choice([0.0, 0.05, 0.3]))  # the slow learner
            await sched.swap(ckpt, sched.version + 1)
    finally:
        await sched.close()
        producer.cancel()
    return rows


@pytest.mark.parametrize("eta,interrupt", [(0, "finish"), (1, "interrupt"), (2, "finish")])
def test_max_staleness_never_exceeds_eta_under_adversarial_timing(tiny, tmp_path, eta, interrupt):
    sched, ledger = _schedule(tiny, tmp_path, eta, interrupt, overprovision=1)
    with ledger:
        rows = asyncio.run(_drive(sched, tiny.ckpt, updates=6, seed=eta))
        assert len(rows) == 6
        for row in rows:
            assert row["rollout/staleness_max"] <= eta
            assert max(row["ages"]) <= eta
            assert row["groups"] == 2 and row["complete"]  # group-complete batches of B groups
            # admission: at most η + 1 batches (+ k) ahead
            assert row["window"] <= (eta + 1) * 2 + 1
        if eta > 0:  # the producers really ran ahead: some batch was trained off-policy
            assert max(r["rollout/staleness_max"] for r in rows) >= 1
        # every stored episode is trained, dropped, aborted or still ready/unfinished: counted
        trained = {g for g in sched.done_ids["consumed"]}
        assert len(trained) == len(sched.done_ids["consumed"]) == 12  # no group trained twice
        assert not ledger.rejections()


# --------------------------------------------------------------------------------------
# a failure anywhere in the producers stops the run with its cause, never a hang


def _failing_append(after: int):
    """Ledger.append_many that raises the ledger's own write error after `after` batches."""
    import sqlite3

    from taurl.data.ledger import LedgerWriteError

    real, calls = Ledger.append_many, []

    def append_many(self, items):
        calls.append(1)
        if len(calls) > after:
            raise LedgerWriteError(self.path, sqlite3.OperationalError("database or disk is full"))
        return real(self, items)

    return append_many


def _raising_hook(event, info):
    if event == "episode_stored" and info["episode_id"].endswith("-01"):
        raise RuntimeError(f"a hook failed on {info['episode_id']}")


def _raising_group(sched: AsyncSchedule):
    real = sched._group

    def group(g):
        if g >= 3:
            raise IndexError(f"no task for group {g}")
        return real(g)

    return group


@pytest.mark.parametrize("fault", ["ledger", "hook", "admit"])
def test_a_ledger_write_failure_a_raising_hook_or_admit_stops_the_async_run_with_its_cause(
        tiny, tmp_path, monkeypatch, fault):
    """Before: the episode task (ledger write, hook) or the producer (admit) died, its group never
    completed, and `take` waited on `changed` forever. Now the learner's `take` raises the cause."""
    import time

    from taurl.data.ledger import LedgerWriteError

    sched, ledger = _schedule(tiny, tmp_path, eta=1, interrupt="finish", overprovision=0)
    if fault == "ledger":
        monkeypatch.setattr(Ledger, "append_many", _failing_append(after=2))
    elif fault == "hook":
        sched.r.hook = _raising_hook
    else:
        sched._group = _raising_group(sched)
    expected = {
        "ledger": (LedgerWriteError, "disk is full"),
        "hook": (RuntimeError, "a hook failed on a"),
        "admit": (IndexError, "no task for group 3"),
    }[fault]
    t0 = time.monotonic()
    with ledger, pytest.raises(expected[0], match=expected[1]):
        asyncio.run(asyncio.wait_for(_drive(sched, tiny.ckpt, updates=20, seed=0), timeout=10))
    assert time.monotonic() - t0 < 10


def test_async_groups_of_only_error_records_stop_the_run_with_the_first_cause(tiny, tmp_path):
    """The engine is down: every episode is recorded as an error (the learner would drop it).
    Before, such groups were taken as batches and trained on nothing; now B of them in a row
    stop the run with the first cause (the one failure policy, taurl.rollout.runner)."""
    from taurl.errors import EngineError
    from taurl.rollout.episodes import EpisodeError

    class Down:
        version, max_context = 1, 4096

        async def generate(self, prompt_ids, sampling):
            raise EngineError("the server answered 503")

    sched, ledger = _schedule(tiny, tmp_path, eta=1, interrupt="finish", overprovision=0)
    sched.engine = Down()
    with (
        ledger,
        pytest.raises(
            EpisodeError,
            match=r"groups in a row produced no usable records; the first "
            r"failure: a\d{5}-\d{2}: engine: the server answered 503",
        ),
    ):
        asyncio.run(asyncio.wait_for(_drive(sched, tiny.ckpt, updates=3, seed=0), timeout=10))


def test_an_env_that_breaks_after_groups_were_kept_stops_the_async_run(tiny, tmp_path):
    """Issue 38 H3: the async schedule stopped on failed groups only while none had been kept,
    so an env that broke mid-run had its groups relaunched forever (no error, 100% CPU; this
    test timed out). Now B failed groups in a row stop it at any point, as a sync round does."""
    import time

    from taurl.rollout.episodes import EpisodeError

    sched, ledger = _schedule(tiny, tmp_path, eta=1, interrupt="finish", overprovision=0)
    working = sched.make_env

    class Broken:  # the env's backend is gone: every reset fails
        def __init__(self):
            self.env = working()

        def __getattr__(self, name):
            return getattr(self.env, name)

        def reset(self, task, seed=None):
            raise ConnectionError("the env's server went away")

    def make_env():  # works until the learner has trained on a batch, then breaks for good
        return Broken() if sched.done_ids["consumed"] else working()

    sched.make_env = make_env
    t0 = time.monotonic()
    expected = (r"2 groups in a row produced no usable records; the first failure: "
                r"a\d{5}-\d{2}: env.reset raised ConnectionError")
    with ledger, pytest.raises(EpisodeError, match=expected):
        asyncio.run(asyncio.wait_for(_drive(sched, tiny.ckpt, updates=20, seed=0), timeout=60))
    assert sched.counts["failed_groups"] >= 2
    assert len(sched.done_ids["consumed"]) >= 2  # it trained on a batch before the env broke
    assert time.monotonic() - t0 < 60


# --------------------------------------------------------------------------------------
# partial rollouts


def test_interrupted_action_continues_on_new_weights_as_a_new_segment(tiny, tmp_path, gate_forward):
    """pause("abort") mid-action, new weights loaded, resume: the action goes on from its
    cut ids on version 8, as a second action segment; one turn owns both; the ledger
    accepts it; the budget counts both pieces; mask_stale keeps only the new part."""
    tasks, tok = tiny.tasks, tiny.tok
    model = copy.deepcopy(tiny.model)
    env = envs.make("search-v0")
    env.stop = ()  # no stop string: the action ends by its budget, EOS or the abort
    # the second decode step: two tokens are already sampled
    reached, release = gate_forward(model, 3)
    # the gate counts forwards
    engine = LocalEngine(model, tok, version=7, seed=0, slim_decode=False)
    new_state = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
                 for k, v in model.state_dict().items()}
    config = RolloutConfig(temperature=1.0, max_action_tokens=12, max_turns=1, resume_aborted=True)

    async def main():
        episode = asyncio.create_task(run_episode(engine, env, tok, tasks[0], seed=1, config=config,
                                                  episode_id="e1", group_id="g"))
        await asyncio.to_thread(reached.wait, 30)
        pausing = asyncio.create_task(engine.pause("abort"))
        while not engine._abort:
            await asyncio.sleep(0.001)
        release.set()
        await pausing
        await engine.update_weights(new_state, 8)
        await engine.resume()
        return await episode

    tr = asyncio.run(main())
    validate_trajectory(tr)
    actions = [s for s in tr.segments if s.kind == "action"]
    assert [s.policy_version for s in actions] == [7, 8]
    # the cut ids (the gated step still samples its token), old version
    assert len(actions[0].token_ids) == 3
    assert len(tr.turns) == 1 and tr.turns[0].action_segment == 1
    # the resumed action's budget counted both pieces
    assert sum(len(s.token_ids) for s in actions) <= 12
    assert tr.policy_versions == [7, 8] and episode_age(tr, 8) == 1
    # both pieces belong to the one turn: its span covers them, every action token is owned
    owner = token_turn_index(tr)
    n = sum(len(s.token_ids) for s in actions)
    assert (owner >= 0).sum() == n and set(owner[owner >= 0].tolist()) == {0}
    (start, end), = turn_spans(tr).tolist()
    assert end - start == n
    # the text the env saw and the stream agree (token-exact, nothing re-encoded)
    assert tr.turns[0].action_text == tok.decode(
        list(actions[0].token_ids) + list(actions[1].token_ids),
        skip_special_tokens=False,
        clean_up_tokenization_spaces=False,
    )
    with Ledger(tmp_path / "l.sqlite") as ledger:
        assert not ledger.append_many([tr]).rejected
        assert ledger.get("e1").to_dict() == tr.to_dict()
    # mask_stale: only version 8's tokens stay in the loss
    keep = stale_token_keep(tr)
    versions = tr.token_versions
    assert [k for k, v in zip(keep, versions, strict=True) if v >= 0] == [0.0] * 3 + [1.0] * (n - 3)
    # the second piece's logprobs are version 8's (the new weights), recomputed here
    from taurl.policy.logprobs import sequence_logprobs

    del model.forward  # the gate off: the class's own forward again
    model.load_state_dict(new_state)
    lp = sequence_logprobs(model.eval(), tr.token_ids, temperature=1.0)
    start2 = sum(len(s.token_ids) for s in tr.segments[:2])
    assert torch.allclose(lp[start2:start2 + n - 3], torch.tensor(actions[1].logprobs), atol=1e-4)


# --------------------------------------------------------------------------------------
# crash safety: SIGKILL mid-update, restart, nothing lost or stored twice

TASKS = Path(__file__).parent / "fixtures" / "chaos_tasks.jsonl"
KILL_CFG = dict(
    tasks=str(TASKS), demos=16, sft_batch_size=16, sft_epochs=1, updates=4, tasks_per_update=2,
    group_size=3, eval_tasks=2, eval_trials=1, max_turns=1, max_action_tokens=8,
    max_episode_tokens=8, warmup_options={"steps": 0}, system_prompt="", tokenizer_texts=2000,
    concurrency=12, schedule="async", staleness_eta=1, overprovision=1, drop_zero_variance=False,
)


@pytest.mark.timeout(600)
def test_async_run_killed_mid_update_loses_no_episode_and_stores_none_twice(tmp_path):
    import yaml

    from chaos_harness import run_cli  # beside this file

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(KILL_CFG))
    run_dir = tmp_path / "run"
    argv = ["train", "--config", str(cfg_path), "--run-dir", str(run_dir), "--no-progress"]
    # SIGKILL inside the learner's second update (gradients computed, before AdamW.step): the
    # learner process dies there, and the run stops with the error that says to rerun it
    assert run_cli(argv, kill_at="learner_step@step=2") not in (0, -9)
    run = RunDir(run_dir)
    assert run.versions()[-1] == 2  # the SFT policy (v1) and update 1 (v2); update 2 never finished
    with Ledger(run.ledger) as ledger:
        before = {e: ledger.get(e).to_dict() for e in ledger.episode_ids() if e.startswith("a")}
    meta = json.loads((run.checkpoint(2) / "taurl.json").read_text())["async_groups"]
    groups_before = {int(e[1:6]) for e in before}
    untrained = groups_before - set(meta["consumed"]) - set(meta["dropped"]) - set(meta["aborted"])
    assert len(meta["consumed"]) == 2 and untrained  # a batch was in the learner, more were stored

    assert run_cli(argv) == 0
    with Ledger(run.ledger) as ledger:
        assert not ledger.rejections()  # no episode was offered twice
        ids = [e for e in ledger.episode_ids() if e.startswith("a")]
        assert (
            len(ids)
            == len(set(ids))
            == ledger.count() - sum(not e.startswith("a") for e in ledger.episode_ids())
        )
        for e, d in before.items():  # what was stored before the kill is there, unchanged
            assert ledger.get(e).to_dict() == d
    final = json.loads((run.checkpoint(run.versions()[-1]) / "taurl.json").read_text())
    assert final["update"] == 4
    done = final["async_groups"]
    # each group trained at most once
    assert len(done["consumed"]) == len(set(done["consumed"])) == 4 * 2
    # every group stored before the kill and not yet trained was trained or
    # dropped (counted) after it
    assert untrained <= set(done["consumed"]) | set(done["dropped"]) | set(done["aborted"])
    rows = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["update"] for r in rl] == [1, 2, 3, 4]
    assert all(r["rollout/staleness_max"] <= 1 for r in rl)
    # the learner measures the batch against its own version, as the schedule does
    assert all(
        r[f"learn/staleness_{k}"] == r[f"rollout/staleness_{k}"]
        for r in rl
        for k in ("mean", "p95", "max")
    )
    assert rl[1]["run/reused_episodes"] > 0  # the restart took the stored episodes, not new ones


@pytest.mark.timeout(600)
def test_a_kill_between_a_checkpoint_and_its_metrics_row_loses_no_row(tmp_path):
    """SIGKILL after checkpoint v3 (update 2) is whole and before its row is appended: the
    checkpoint carries the row (the learner process writes what the parent committed), and
    the resumed run writes it, flagged; without `recover_row` update 2 would have no row."""
    import yaml

    from chaos_harness import run_cli  # beside this file

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({**KILL_CFG, "updates": 3}))
    run_dir = tmp_path / "run"
    argv = ["train", "--config", str(cfg_path), "--run-dir", str(run_dir), "--no-progress"]
    assert run_cli(argv, kill_at="checkpoint_saved@version=3") == -9
    run = RunDir(run_dir)
    assert run.versions()[-1] == 3
    rows = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    # the kill came before update 2's row
    assert [r["update"] for r in rows if r["phase"] == "rl"] == [1]
    carried = json.loads((run.checkpoint(3) / "taurl.json").read_text())["metrics_row"]
    assert (
        carried["update"] == 2 and carried["policy/version"] == 3 and "learn/grad_norm" in carried
    )

    assert run_cli(argv) == 0
    rl = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    rl = [r for r in rl if r["phase"] == "rl"]
    assert [r["update"] for r in rl] == [1, 2, 3]
    assert rl[1]["run/recovered_row"] == 1.0 and "run/recovered_row" not in rl[0] | rl[2]
    assert {
        k: v for k, v in rl[1].items() if k not in ("step", "time", "run/recovered_row")
    } == carried


def test_config_problems_name_the_async_options():
    bad = dataclasses.replace(TrainConfig(), schedule="later", staleness_eta=-1, interrupt="never")
    text = " ".join(bad.schedule_problems())
    assert (
        "schedule must be sync or async" in text
        and "staleness_eta" in text
        and "interrupt must be" in text
    )
    assert not TrainConfig(schedule="async").schedule_problems()


@pytest.mark.timeout(600)
def test_the_learner_takes_its_next_batch_while_the_engine_still_loads_the_last_version(
    tmp_path, monkeypatch
):
    """The weight load runs behind the learner: the load of update u's checkpoint is held
    until the learner has been handed batch u + 1, which a loop that awaited the load before
    taking its next batch could never do (the hold then runs out, and the test fails)."""
    import time

    from taurl.recipe.loop import train
    from taurl.recipe.schedule.learner_proc import LearnerProcess
    from taurl.recipe.validate import load_config

    sent: list[int] = []
    held: list[bool] = []
    real_update, real_load = LearnerProcess.update, LocalEngine.load_weights

    async def update(self, update, version, batch, groups):
        sent.append(update)
        return await real_update(self, update, version, batch, groups)

    async def load_weights(self, checkpoint_dir, version):
        u, t = version - 1, time.monotonic()  # the SFT policy is v1: v(u + 1) is update u's
        last = u == KILL_CFG["updates"]
        while len(sent) <= u and not last and time.monotonic() - t < 30:
            await asyncio.sleep(0.01)
        held.append(len(sent) > u or last)
        return await real_load(self, checkpoint_dir, version)

    monkeypatch.setattr(LearnerProcess, "update", update)
    monkeypatch.setattr(LocalEngine, "load_weights", load_weights)
    cfg = load_config(TrainConfig, data={**KILL_CFG, "interrupt": "finish"})
    train(cfg, str(tmp_path / "run"), progress=False)
    assert sent == [1, 2, 3, 4] and len(held) == 4
    assert all(held)  # every load but the last overlapped the learner's next update



# A sitecustomize for the learner process. The write of checkpoint v waits until the
# learner has begun the next update (at most 3 s: the last update has none), then 1 s more,
# in which a step that did not wait would happen. Every checkpoint keeps its optimizer state
# (the learner drops all but the newest's).
SLOW_SAVE = """import time

import taurl.train.checkpoint as _checkpoint
import taurl.train.learner as _learner

_begun = [-1]  # the version of the newest update begun
_real_save, _real_update = _checkpoint.save_policy, _learner.Learner.update


def _update(self, trajs, version=None, credit=None):
    _begun.append(version)
    return _real_update(self, trajs, version=version, credit=credit)


def _save(model, tokenizer, path, extra=None, **kwargs):
    t = time.monotonic()
    while _begun[-1] < (extra or {}).get("policy_version", 0) and time.monotonic() - t < 3:
        time.sleep(0.01)
    time.sleep(1.0)
    return _real_save(model, tokenizer, path, extra, **kwargs)


_learner.Learner.update = _update
_checkpoint.save_policy = _save  # (the name the checkpoint writer calls)
_checkpoint.drop_optimizer_state = lambda path: None
"""


@pytest.mark.timeout(600)
def test_the_learner_trains_on_while_its_checkpoint_is_written_and_each_checkpoint_holds_its_update(
        tmp_path, monkeypatch):
    """The learner process writes update u's checkpoint in a thread while it trains batch
    u + 1, and the optimizer step of u + 1 waits for that write. Made visible by holding
    every checkpoint write there until the next update has begun, and 1 s more (a
    sitecustomize on the learner process's path, SLOW_SAVE):
    - the parent gets each update's answer before its checkpoint is written (a learner that
      wrote the checkpoint first would answer ≥ 4 s late: ``time/checkpoint_s``), and
      writes the update's metrics row only after it (the kill-point trace's order);
    - each checkpoint holds bitwise the optimizer state the next optimizer step started from
      (the kill-point trace's digest, taken inside that step): without the wait, step u + 1
      changes it before the delayed write of u reads it, and they differ. (The weights are
      not compared: this tiny run's advantages are mostly 0, so a step may leave them.)"""
    from taurl.chaos import TRACE_ENV, optimizer_digest
    from taurl.recipe.loop import train
    from taurl.recipe.validate import load_config

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_SAVE)
    monkeypatch.syspath_prepend(str(site))  # the learner process's PYTHONPATH is this sys.path
    trace = tmp_path / "trace.txt"
    monkeypatch.setenv(TRACE_ENV, str(trace))
    cfg = load_config(
        TrainConfig, data={**KILL_CFG, "updates": 3, "overprovision": 0, "keep_checkpoints": 4}
    )
    run = RunDir(tmp_path / "run")
    train(cfg, str(run.root), progress=False)

    rl = [r for r in map(json.loads, run.metrics.read_text().splitlines()) if r["phase"] == "rl"]
    assert [r["update"] for r in rl] == [1, 2, 3]
    assert all(r["time/checkpoint_s"] < 1.0 for r in rl), [r["time/checkpoint_s"] for r in rl]
    v_sft = json.loads((run.root / "state.json").read_text())["sft_version"]
    names = [line.partition(" ")[0] for line in trace.read_text().splitlines()]
    # each update's row comes after its (delayed) checkpoint
    for v in (v_sft + 1, v_sft + 2, v_sft + 3):
        assert names.index(f"checkpoint_synced@version={v}") < names.index(
            f"update_done@version={v}"
        ), v
    # optimizer step k → digest of the optimizer state inside it, before it changes it
    before_step = {}
    for line in trace.read_text().splitlines():
        name, _, facts = line.partition(" ")
        if name.startswith("learner_step@step="):
            before_step[int(name.rsplit("=", 1)[1])] = json.loads(facts)["optimizer"]
    assert sorted(before_step) == [1, 2, 3]  # one optimizer step per update
    for u in (1, 2):  # (the moments and the step count: they change at every step)
        saved = optimizer_digest(
            torch.load(run.checkpoint(v_sft + u) / "optimizer.pt", weights_only=True)
        )
        assert saved == before_step[u + 1], f"checkpoint of update {u} is not the state after it"


def test_the_learner_process_spawned_before_sft_is_closed_when_the_run_fails_first(
    tmp_path, monkeypatch
):
    """schedule: async spawns the learner's process at the start of the run (its imports
    overlap SFT); a run that fails before RL must not leave it behind."""
    from taurl.recipe.loop import train
    from taurl.recipe.schedule.learner_proc import LearnerProcess
    from taurl.recipe.validate import load_config

    spawned: list[LearnerProcess] = []
    real_init = LearnerProcess.__init__

    def init(self):
        real_init(self)
        spawned.append(self)

    def hook(event, info):
        if event == "sft_step":
            raise RuntimeError("a failure during SFT")

    monkeypatch.setattr(LearnerProcess, "__init__", init)
    cfg = load_config(TrainConfig, data=KILL_CFG)
    with pytest.raises(RuntimeError, match="during SFT"):
        train(cfg, str(tmp_path / "run"), progress=False, hook=hook)
    assert len(spawned) == 1 and spawned[0].proc.poll() is not None  # spawned, and gone


FAILING_SAVE = """import taurl.train.checkpoint as _checkpoint

_real = _checkpoint.save_policy


def _save(model, tokenizer, path, extra=None, **kwargs):
    if (extra or {}).get("update") == 2:
        raise OSError(28, "No space left on device")
    return _real(model, tokenizer, path, extra, **kwargs)


_checkpoint.save_policy = _save
"""


@pytest.mark.timeout(600)
def test_a_checkpoint_write_that_fails_behind_the_learner_stops_the_run_with_its_error(
    tmp_path, monkeypatch
):
    """The learner process's background write of update 2's checkpoint fails (a full disk,
    in a sitecustomize on its path): the run stops with an error that names the update and
    the checkpoint, no row or checkpoint of update 2 is left, and update 1's are whole."""
    from taurl.errors import Error
    from taurl.recipe.loop import train
    from taurl.recipe.validate import load_config

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FAILING_SAVE)
    monkeypatch.syspath_prepend(str(site))
    cfg = load_config(TrainConfig, data={**KILL_CFG, "updates": 3, "overprovision": 0})
    run = RunDir(tmp_path / "run")
    with pytest.raises(Error, match=r"update 2: writing checkpoint v3: .*No space left on device"):
        train(cfg, str(run.root), progress=False)
    rl = [r for r in map(json.loads, run.metrics.read_text().splitlines()) if r["phase"] == "rl"]
    assert [r["update"] for r in rl] == [1]
    assert run.versions()[-1] == 2 and (run.checkpoint(2) / "optimizer.pt").exists()


@pytest.mark.timeout(600)
def test_an_async_train_run_whose_ledger_write_fails_stops_with_the_cause_within_seconds(
    tmp_path, monkeypatch
):
    """The whole recipe (learner process, producers, swaps): the first write of an RL episode
    fails as a full disk does; `train` raises that error within 10 s of it, instead of hanging."""
    import sqlite3
    import threading
    import time

    from taurl.data.ledger import LedgerWriteError
    from taurl.recipe.loop import train
    from taurl.recipe.validate import load_config

    real, failed_at = Ledger.append_many, []

    def append_many(self, items):
        items = list(items)
        if any(getattr(t, "episode_id", "").startswith("a") for t in items):
            failed_at.append(time.monotonic())
            raise LedgerWriteError(self.path, sqlite3.OperationalError("database or disk is full"))
        return real(self, items)

    monkeypatch.setattr(Ledger, "append_many", append_many)
    cfg = load_config(TrainConfig, data={**KILL_CFG, "updates": 2})
    before = set(threading.enumerate())  # an earlier test in this worker may have left its own
    with pytest.raises(LedgerWriteError, match="disk is full"):
        train(cfg, str(tmp_path / "run"), progress=False)
    assert failed_at and time.monotonic() - failed_at[0] < 10
    # no thread the run started outlives it (one left waiting for the learner's connection kept the
    # process from exiting)
    assert not [
        t.name for t in set(threading.enumerate()) - before if t.name.startswith("asyncio_")
    ]
