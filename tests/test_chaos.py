"""Chaos: a real `taurl train` run SIGKILLed at >= 10 random points, then finished; nothing lost.

The kill is real: the run is a separate process (`chaos_harness.run_cli`, beside this
file) that sends itself SIGKILL at a named kill point (`taurl.chaos`), so no handler,
``finally`` or flush runs. The points are drawn at random (seed printed;
``TAURL_CHAOS_SEED`` replays a draw) from the trace of an uninterrupted reference run, one
at least from each phase the issue names: inside the learner's update (after backward,
before AdamW.step), inside the checkpoint save (weights written; every file fsynced, before
the rename), between the save and the engine's weight swap, inside an evaluation, and
inside a rollout round. They are killed in trace order, each restart being killed at the
next point, then the run is finished with one more restart.

What must hold, and why it can be bitwise here:
- after every kill: every stored episode is still there, unchanged; no episode was stored
  twice (the ledger records a refused duplicate, so ``rejections()`` must stay empty);
  every listed checkpoint is whole;
- after every restart that resumes RL: its optimizer state, parameters and RNG states are
  bitwise those of the newest checkpoint on disk at the kill (digests traced at ``rl_start``);
- every learner step of the chaos run starts from bitwise the optimizer state, parameters
  and RNG states of the same step of the uninterrupted run;
- at the end: the same episode ids, the same token ids in every episode, the same kept
  versions, and a final checkpoint (weights and optimizer state) bitwise equal to the
  uninterrupted run's. Bitwise holds because every episode has a fixed seed, each request
  samples from its own seeded generator, and the run uses ``concurrency: 1``: each forward
  is one row, as in the reference run. With concurrency > 1 a restarted round batches its
  missing episodes differently, and a batched CPU matmul is not bitwise row-invariant, so
  the re-sampled episodes could differ in the last bits (then only the ledger invariants
  and the restored optimizer state would be asserted; `benchmarks/chaos.py` measures that).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from chaos_harness import run_cli  # beside this file (tests/ is on sys.path)
from taurl.chaos import optimizer_digest
from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir

# search-v0 on a fixed task file (country_continent questions drawn once from its task
# source): reading 70 rows costs nothing, building the env's task pool ~14 s per restart
TASKS = Path(__file__).parent / "fixtures" / "chaos_tasks.jsonl"
CONFIG = dict(
    tasks=str(TASKS), demos=48, expert_options={"p_skip_search": 1.0, "p_guess_right": 1.0},
    system_prompt="", warmup_options={"steps": 10}, sft_batch_size=8, sft_epochs=8, sft_lr=3e-3,
    sft_warmup_steps=5, updates=4, tasks_per_update=4, group_size=4, eval_tasks=3, eval_trials=2,
    max_turns=1, max_action_tokens=16, max_episode_tokens=16, tokenizer_texts=3000, concurrency=1,
    lr=3e-3, temperature=1.0, eval_temperature=0.5, keep_checkpoints=2,
    # every update takes a learner step, so every update has that kill point
    drop_zero_variance=False,
)
KILLS = 11
# the phases a kill must hit at least once: (label, test on "event@tag")
PHASES = [
    ("learner update", lambda n: n.startswith("learner_step@")),
    (
        "checkpoint save (files written)",
        lambda n: n.startswith("checkpoint_files@") and _rl_version(n),
    ),
    (
        "checkpoint save (fsynced, not renamed)",
        lambda n: n.startswith("checkpoint_synced@") and _rl_version(n),
    ),
    ("between save and weight swap", lambda n: n.startswith("checkpoint_saved@")),
    ("evaluation", lambda n: n.startswith("episode_stored@episode_id=eval-")),
    ("rollout round", lambda n: n.startswith(("episode_stored@episode_id=r", "episode_finished@"))),
]


def _rl_version(name: str) -> bool:
    return int(name.rsplit("=", 1)[1]) >= 2  # v0 is the initial policy, v1 the SFT one


def read_trace(path: Path) -> list[tuple[str, dict]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        name, _, facts = line.partition(" ")
        out.append((name, json.loads(facts) if facts else {}))
    return out


def choose_points(names: list[str], rng: random.Random, n: int) -> list[str]:
    """One random point of each phase, then random others; in the order the run reaches them."""
    chosen = {rng.choice([x for x in names if test(x)]) for _, test in PHASES}
    rest = [x for x in names if x not in chosen]
    chosen |= set(rng.sample(rest, n - len(chosen)))
    return sorted(chosen, key=names.index)


def train(cfg: Path, run_dir: Path, **kw) -> int:
    return run_cli(
        ["train", "--config", str(cfg), "--run-dir", str(run_dir), "--no-progress"], **kw
    )


def ledger_records(run_dir: Path) -> dict[str, dict]:
    if not (run_dir / "ledger.sqlite").exists():
        return {}
    with Ledger(run_dir / "ledger.sqlite") as ledger:
        assert not ledger.rejections(), (
            "an episode was stored twice (the ledger refused a duplicate)"
        )
        assert ledger.count() == len(set(ledger.episode_ids()))
        return {e: ledger.get(e).to_dict() for e in ledger.episode_ids()}


def newest_optimizer_digest(run: RunDir) -> str | None:
    for v in reversed(run.versions()):
        f = run.checkpoint(v) / "optimizer.pt"
        if f.exists():
            return optimizer_digest(torch.load(f, weights_only=True))
    return None


def assert_whole_checkpoints(run: RunDir) -> None:
    for v in run.versions():
        d = run.checkpoint(v)
        assert (d / "model.safetensors").exists() and (d / "tokenizer.json").exists(), d
        assert json.loads((d / "taurl.json").read_text())["policy_version"] == v
        load_file(d / "model.safetensors")  # readable to the end


@pytest.mark.timeout(900)
def test_sigkilled_run_at_random_points_loses_nothing_and_ends_bitwise_equal(tmp_path):
    seed = int(os.environ.get("TAURL_CHAOS_SEED", random.SystemRandom().randrange(10**6)))
    print(f"chaos seed {seed} (replay: TAURL_CHAOS_SEED={seed})")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    ref_dir, ref_trace = tmp_path / "reference", tmp_path / "reference.trace"
    assert train(cfg, ref_dir, trace=str(ref_trace)) == 0
    trace = read_trace(ref_trace)
    names = [n for n, _ in trace if not n.endswith("@version=0")]  # v0 is copied (below)
    assert len(names) == len(set(names)), "kill points must name their work uniquely"
    ref_steps = {n: f for n, f in trace if n.startswith("learner_step@")}
    assert len(ref_steps) >= 2, (
        "the miniature must take learner steps (reward variance in its groups)"
    )
    rl_rows = [
        r
        for r in map(json.loads, (ref_dir / "metrics.jsonl").read_text().splitlines())
        if r["phase"] == "rl"
    ]
    # a step with a gradient before the last: later restores carry non-zero AdamW moments
    assert any(r["learn/grad_norm"] > 0 for r in rl_rows[:-1]), (
        "the miniature must learn (non-zero gradients)"
    )
    points = choose_points(names, random.Random(seed), KILLS)
    print("kill points:", *points, sep="\n  ")

    run_dir, run = tmp_path / "chaos", RunDir(tmp_path / "chaos")
    # the initial policy (v0: tokenizer + random init, seeded) is the reference's: building it
    # again costs most of a minute and is no phase the kills must hit
    shutil.copytree(ref_dir / "checkpoints" / "v0", run_dir / "checkpoints" / "v0")
    traces = []
    for i, at in enumerate(points + [""]):  # the last restart finishes the run
        before = ledger_records(run_dir)
        expected_opt = newest_optimizer_digest(run)
        traces.append(tmp_path / f"chaos-{i}.trace")
        rc = train(cfg, run_dir, kill_at=at, trace=str(traces[-1]))
        print(f"restart {i}: {at or 'to the end'}: exit {rc}", flush=True)
        assert rc == (-9 if at else 0), f"restart {i}: exit {rc}, expected the SIGKILL at {at!r}"
        after = ledger_records(run_dir)
        assert {e: after[e] for e in before} == before, (
            f"restart {i} lost or changed a stored episode"
        )
        assert_whole_checkpoints(run)
        started = [f for n, f in read_trace(traces[-1]) if n.startswith("rl_start@")]
        if started and expected_opt is not None:  # the restart resumed RL from a checkpoint
            assert started[0]["optimizer"] == expected_opt, (
                f"restart {i}: optimizer state not restored exactly"
            )
        for n, f in read_trace(traces[-1]):
            if n in ref_steps:  # the same step starts from bitwise the same state
                assert f == ref_steps[n], f"restart {i}, {n}: {f} != uninterrupted {ref_steps[n]}"
    hit = {label for label, test in PHASES if any(test(p) for p in points)}
    assert hit == {label for label, _ in PHASES} and len(points) >= 10

    # the finished run equals the uninterrupted one
    ref_run = RunDir(ref_dir)
    ref_records, records = ledger_records(ref_dir), ledger_records(run_dir)
    assert sorted(records) == sorted(ref_records)  # none lost, none twice, none extra
    for e, rec in records.items():
        assert rec["segments"] == ref_records[e]["segments"], e  # token ids, logprobs, versions
    assert run.versions() == ref_run.versions()
    final = run.versions()[-1]
    a, b = (
        load_file(run.checkpoint(final) / "model.safetensors"),
        load_file(ref_run.checkpoint(final) / "model.safetensors"),
    )
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert newest_optimizer_digest(run) == newest_optimizer_digest(ref_run)
    # every update has its metrics row exactly once (a kill between a checkpoint and its row:
    # the resumed run writes the row the checkpoint carries, taurl.recipe.record.recover_row)
    rows = [
        r
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if r["phase"] == "rl"
    ]
    assert (
        [r["update"] for r in rows]
        == [r["update"] for r in rl_rows]
        == list(range(1, CONFIG["updates"] + 1))
    )
    for f in sorted((ref_dir / "evals").glob("*.json")):
        mine, theirs = (
            json.loads((run_dir / "evals" / f.name).read_text()),
            json.loads(f.read_text()),
        )
        assert mine["task_successes"] == theirs["task_successes"], f.name
    # no leftovers
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
