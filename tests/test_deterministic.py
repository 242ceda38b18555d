"""Deterministic mode (docs/reproducibility.md): with the local engine in lock-step, a seed fixes
every sampled id and behaviour logprob, and so every evaluation figure, whatever the timing.

The timing is disturbed on purpose in the second run of each pair: env steps that sleep a
random while (other episodes decode meanwhile) and a thread that holds the GIL in bursts (the
engine thread and the event loop run late). Without the mode, which episodes share a batch
follows that timing and a row's logits follow its batch (CPU matmul blocking, attention
padding), so the logprobs differ in their last bits; the mutation check's ``no-lockstep``
switches the mode off and requires these tests to fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time

import pytest

from taurl import envs
from taurl.data.ledger import Ledger
from taurl.envs.search import generate_tasks
from taurl.eval.eval_run import evaluate_policy
from taurl.eval.evaluate import EvalConfig
from taurl.policy.files import save_policy
from taurl.policy.local_engine import LocalEngine
from taurl.policy.model import create_policy
from taurl.rollout.episodes import EpisodeSpec, collect
from taurl.rollout.loop import RolloutConfig
from taurl.rollout.seeds import episode_seed

ROLLOUT = RolloutConfig(max_turns=3, max_action_tokens=16, max_episode_tokens=40, max_context=512)


class JitteryEnv:
    """search-v0 whose steps sleep up to `delay` seconds (a random while fixed by the episode's
    seed, so each run of a pair has its own timing only through `delay`)."""

    def __init__(self, delay: float):
        self.env = envs.make("search-v0", top_k=1, max_doc_chars=80)
        self.delay = delay
        self.rng = random.Random(0)

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, task, seed=None):
        self.rng = random.Random(seed)
        return self.env.reset(task, seed)

    def step(self, action):
        return self.env.step(action)

    async def astep(self, action):
        await asyncio.sleep(self.delay * self.rng.random())
        return self.env.step(action)


@contextlib.contextmanager
def gil_hog(on: bool):
    """A thread that runs pure Python in bursts (holding the GIL), then sleeps, until the end."""
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            end = time.perf_counter() + 0.003
            while time.perf_counter() < end:
                pass
            time.sleep(0.001)

    t = threading.Thread(target=spin, daemon=True)
    if on:
        t.start()
    try:
        yield
    finally:
        stop.set()
        if on:
            t.join()


@pytest.fixture(scope="module")
def policy(search_tokenizer):
    return create_policy(search_tokenizer, "tiny", seed=0), search_tokenizer


def _collect(policy, specs, *, delay: float, concurrency: int, tmp_path, name: str):
    model, tok = policy
    engine = LocalEngine(model, tok, max_batch_size=concurrency, seed=0, deterministic=True)
    with gil_hog(delay > 0), Ledger(tmp_path / f"{name}.sqlite") as ledger:
        trajs, _ = asyncio.run(
            collect(
                engine, tok, lambda: JitteryEnv(delay), specs, config=ROLLOUT, ledger=ledger,
                run_id="det", concurrency=concurrency,
            )
        )
    assert engine._members == 0  # every slot left
    return [(t.episode_id, t.token_ids, [s.logprobs for s in t.segments], t.reward) for t in trajs]


@pytest.mark.attack  # fails under the mutation check's no-lockstep (module docstring)
def test_collect_is_the_same_under_other_timing(policy, tmp_path):
    """24 episodes over 8 slots (each slot runs three, one after another), twice: undisturbed,
    then with jittery env steps and a GIL-holding thread. Ids and logprobs agree bit for bit."""
    tasks = generate_tasks("train", n=6, seed=3)
    specs = [
        EpisodeSpec(f"e{i}-{g}", t, episode_seed(7, i, g), f"g{i}")
        for i, t in enumerate(tasks)
        for g in range(4)
    ]
    calm = _collect(policy, specs, delay=0.0, concurrency=8, tmp_path=tmp_path, name="calm")
    busy = _collect(policy, specs, delay=0.02, concurrency=8, tmp_path=tmp_path, name="busy")
    # multi-turn episodes ran
    assert len(calm) == len(specs) and any(len(ids) > 60 for _, ids, _, _ in calm)
    assert busy == calm


@pytest.mark.attack
def test_evaluation_figures_are_the_same_under_other_timing(policy, tmp_path):
    """`evaluate_policy` with EvalConfig(deterministic=True) (what `rollout.deterministic: true`
    gives every evaluation of a run): the same episodes and figures under other timing."""
    model, tok = policy
    save_policy(model, tok, tmp_path / "v0", {"policy_version": 0})
    tasks = generate_tasks("holdout", n=8, seed=5)
    ecfg = EvalConfig(tasks=8, trials=2, seed=11, concurrency=6, deterministic=True)
    results = []
    for delay in (0.0, 0.02):
        with gil_hog(delay > 0), Ledger(tmp_path / f"eval{delay}.sqlite") as ledger:
            result = evaluate_policy(
                tmp_path / "v0", tasks, ecfg, make_env=lambda d=delay: JitteryEnv(d),
                rollout=ROLLOUT, ledger=ledger, progress=False,
            )
            episodes = [
                (t.episode_id, t.token_ids, [s.logprobs for s in t.segments])
                for t in ledger.query()
            ]
        results.append((result.success, result.tokens_mean, sorted(episodes)))
    assert results[1] == results[0]


def test_a_round_that_raises_leaves_no_slot_behind(policy, tmp_path):
    """A hook that raises ends the round (collect's contract) without a hang: every slot
    leaves the engine, which then serves a caller outside any round at once."""
    model, tok = policy
    engine = LocalEngine(model, tok, max_batch_size=4, seed=0, deterministic=True)
    tasks = generate_tasks("train", n=4, seed=3)
    specs = [
        EpisodeSpec(f"e{i}-{g}", t, episode_seed(7, i, g), f"g{i}")
        for i, t in enumerate(tasks)
        for g in range(2)
    ]

    def hook(event, traj):
        if event == "episode_stored":
            raise RuntimeError("hook failed")

    with Ledger(tmp_path / "l.sqlite") as ledger, pytest.raises(RuntimeError, match="hook failed"):
        asyncio.run(
            collect(
                engine, tok, lambda: JitteryEnv(0.0), specs, config=ROLLOUT, ledger=ledger,
                run_id="det", concurrency=4, on_stored=hook,
            )
        )
    assert engine._members == 0
    from taurl.policy.protocol import SamplingParams

    gen = asyncio.run(
        asyncio.wait_for(engine.generate([1, 2, 3], SamplingParams(max_tokens=2, seed=1)), 10)
    )
    assert len(gen.token_ids) >= 1


def test_a_resume_may_switch_the_mode(tmp_path):
    """The mode changes how later rows are computed, not what a stored record is: like
    `device` and `torch_threads`, a resume may switch it (another change is still refused)."""
    import dataclasses
    import json
    import types

    from taurl.recipe.config import TrainConfig
    from taurl.recipe.resume import ResumeError, check_resume, run_identity

    # what the identity reads
    env = types.SimpleNamespace(name="search-v0", version="1", verifier_version="1")
    cfg = TrainConfig(deterministic=False)
    (tmp_path / "state.json").write_text(json.dumps({"identity": run_identity(cfg, env)}))
    check_resume(tmp_path, run_identity(dataclasses.replace(cfg, deterministic=True), env))
    with pytest.raises(ResumeError, match="eval_trials"):
        check_resume(
            tmp_path, run_identity(dataclasses.replace(cfg, deterministic=True, eval_trials=5), env)
        )
