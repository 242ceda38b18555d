"""A miniature of the demo recipe, end to end, plus the learner's fast paths.

The miniature runs the very code of `taurl demo` (demonstrations → SFT → validation and
holdout eval → GRPO → validation and holdout eval → report) with tiny budgets, and checks
that training lowers the SFT loss and that the GRPO update moves the policy the way the
rewards point: the sampled episodes with positive advantage become more likely, those with
negative advantage less.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from taurl.credit import TurnBatch, compute_advantages
from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.policy.model import load_policy
from taurl.recipe.config import TrainConfig
from taurl.recipe.loop import train
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.objectives import sequence_logprobs
from taurl.train.rows import action_logprobs, make_rows, micro_batches

# country_continent with an expert that answers from memory: a few SFT steps teach the answer
# format, and sampled continents are sometimes right, so GRPO groups have reward variance.
# No system prompt: the episodes are ~30 tokens, so the miniature's SFT takes seconds.
MINI = dict(
    demos=48, expert_options={"p_skip_search": 1.0, "p_guess_right": 1.0},
    task_options={"families": ["country_continent"], "split_by": "country"}, system_prompt="",
    warmup_options={"steps": 10}, sft_batch_size=8, sft_epochs=8, sft_lr=3e-3, sft_warmup_steps=5,
    updates=2, tasks_per_update=4, group_size=4, eval_tasks=3, eval_trials=2, max_turns=1,
    max_action_tokens=16, max_episode_tokens=16, tokenizer_texts=3000, concurrency=16, lr=3e-3,
    temperature=0.5, eval_temperature=0.5,
)


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("mini") / "run"
    summary = train(TrainConfig(**MINI), str(run_dir), progress=False)
    return run_dir, summary


def test_summary_has_the_promised_figures(mini):
    run_dir, summary = mini
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["holdout"]["sft"]["success"] == summary["holdout"]["sft"]["success"]
    for split in ("holdout", "validation"):
        for tag in ("sft", "final"):
            h = on_disk[split][tag]
            assert (
                h["episodes"] == 6
                and len(h["ci95"]) == 2
                and 0 <= h["ci95"][0] <= h["success"] <= h["ci95"][1]
            )
            assert 0 <= h["search_rate"] <= 1
    assert on_disk["train"]["updates"] == 2 and on_disk["wall_seconds"] > 0


def test_sft_lowers_the_loss(mini):
    run_dir, _ = mini
    rows = [
        r
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if r["phase"] == "sft"
    ]
    assert len(rows) == 48  # 8 epochs of 48 demos in batches of 8
    first, last = (
        np.mean([r["sft/loss"] for r in rows[:2]]),
        np.mean([r["sft/loss"] for r in rows[-2:]]),
    )
    assert last < first - 2.0, (first, last)


def test_grpo_moves_the_policy_the_way_the_reward_points(mini):
    """Σ_i A_i · Δ log π(τ_i) > 0: the update raised the likelihood of
    better-than-group episodes."""
    run_dir, _ = mini
    run = RunDir(run_dir)
    with Ledger(run.ledger) as ledger:
        batch = [ledger.get(f"r0001-{i:03d}-{g:02d}") for i in range(4) for g in range(4)]
    adv = compute_advantages(TurnBatch.from_trajectories(batch), "grpo").advantages[:, 0]  # (N,)
    assert np.any(adv != 0), "the miniature's first batch has no reward variance; change its seed"
    before, tok = load_policy(run.checkpoint(1))
    after, _ = load_policy(run.checkpoint(2))
    rows = make_rows(batch, None, tok.pad_token_id)
    with torch.no_grad():
        delta = (
            ((action_logprobs(after, rows)[0] - action_logprobs(before, rows)[0]) * rows.mask)
            .sum(-1)
            .numpy()
        )
    assert float(np.dot(adv, delta)) > 0
    assert delta[adv > 0].mean() > delta[adv < 0].mean()


def test_every_update_is_a_served_hf_checkpoint(mini):
    run_dir, _ = mini
    run = RunDir(run_dir)
    assert run.versions() == [0, 1, 2, 3]
    meta = json.loads((run.checkpoint(3) / "taurl.json").read_text())
    assert meta["policy_version"] == 3 and meta["update"] == 2
    model = AutoModelForCausalLM.from_pretrained(run.checkpoint(3))  # plain HF, no taurl
    assert not model.config.tie_word_embeddings
    with Ledger(run.ledger) as ledger:
        for update in (1, 2):  # round u was sampled by version 1 + u − 1, served by the engine
            ep = ledger.get(f"r{update:04d}-000-00")
            assert ep.policy_versions == [update]


def test_metrics_and_report(mini):
    run_dir, _ = mini
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if r["phase"] == "rl"]
    assert [r["update"] for r in grpo] == [1, 2]
    for key in (
        "rollout/reward_mean", "rollout/reward_std", "rollout/groups_same_reward",
        "rollout/success", "rollout/search_rate", "rollout/invalid_rate", "rollout/truncation_rate",
        "rollout/turns_mean", "rollout/tokens_mean", "learn/entropy", "learn/grad_norm",
        "time/rollout_s", "time/learn_s", "run/reused_episodes", "rollout/failed_episodes",
        "mismatch/abs_mean", "mismatch/abs_max", "learn/staleness_mean", "learn/staleness_p95",
        "learn/staleness_max",
    ):
        assert all(key in r for r in grpo), key
    # the synchronous loop trains its own version
    assert all(r["learn/staleness_max"] == 0 for r in grpo)
    # the learner recomputes what the engine sampled: the behaviour logprobs, to fp32 noise
    assert all(r["mismatch/abs_max"] < 1e-3 and r["mismatch/abs_mean"] < 1e-4 for r in grpo)
    assert all(r["mismatch/tokens"] > 0 for r in grpo)
    assert {r["phase"] for r in rows} >= {
        "demos", "warmup", "sft", "eval_validation-sft", "eval_holdout-sft", "rl",
        "eval_validation-final", "eval_holdout-final",
    }
    copy = [r for r in rows if r["phase"] == "warmup"]
    assert (
        copy[-2]["step"] == MINI["warmup_options"]["steps"]
        and 0 <= copy[-1]["copy/exact_unseen"] <= 1
    )
    page = (run_dir / "report.html").read_text()
    assert "Copy warm-up loss" in page and "SFT loss" in page
    assert (
        page.count("data:image/png;base64,") >= 3
        and "http://" not in page
        and "https://" not in page
    )


def test_evaluations_never_see_a_training_task_and_splits_are_disjoint(mini):
    """Validation (for choices) and holdout (to report) are separate task sets, and neither
    shares a task with the demonstrations or the RL pool."""
    run_dir, _ = mini
    with Ledger(RunDir(run_dir).ledger) as ledger:
        trajs = [ledger.get(e) for e in ledger.episode_ids()]
    by_kind: dict[str, set[str]] = {}
    for t in trajs:
        kind = (
            "validation"
            if "-validation-" in t.episode_id
            else "holdout"
            if "-holdout-" in t.episode_id
            else "train"
        )
        by_kind.setdefault(kind, set()).add(t.task_id)
        assert t.split == kind, (t.episode_id, t.split)
    assert set(by_kind) == {"train", "validation", "holdout"}
    assert (
        not by_kind["train"] & by_kind["validation"] and not by_kind["train"] & by_kind["holdout"]
    )
    assert not by_kind["validation"] & by_kind["holdout"]


def test_checkpoints_carry_what_evaluation_needs(mini):
    """Each checkpoint records the env, its options, the system prompt and the budgets it was
    trained with, so `taurl eval CHECKPOINT` evaluates it as it was trained."""
    run_dir, _ = mini
    meta = json.loads((RunDir(run_dir).checkpoint(3) / "taurl.json").read_text())["recipe"]
    assert meta["env"] == "search-v0" and meta["system_prompt"] == ""
    assert (
        meta["task_options"] == MINI["task_options"]
        and meta["rollout"]["max_turns"] == MINI["max_turns"]
    )


def test_action_only_logprobs_match_a_full_forward(mini):
    """The learner's fast path (output layer on action positions only) against the plain one."""
    run_dir, _ = mini
    run = RunDir(run_dir)
    model, tok = load_policy(run.checkpoint(3))
    with Ledger(run.ledger) as ledger:
        trajs = [ledger.get(f"r0002-001-{g:02d}") for g in range(4)]
    rows = make_rows(trajs, None, tok.pad_token_id)
    with torch.no_grad():
        fast, _ = action_logprobs(model, rows)
        logits = model(input_ids=rows.input_ids, attention_mask=rows.attention).logits
        slow = sequence_logprobs(logits, rows.input_ids) * rows.mask
    assert torch.allclose(fast, slow, atol=1e-5)
    # recomputed with the weights that sampled them (v2), they are the behaviour logprobs
    sampler, _ = load_policy(run.checkpoint(2))
    with torch.no_grad():
        lp, _ = action_logprobs(sampler, rows, temperature=MINI["temperature"])
    assert torch.allclose(lp, rows.behaviour, atol=1e-4)


def test_micro_batches_accumulate_to_the_full_batch_gradient(mini):
    run_dir, _ = mini
    run = RunDir(run_dir)
    with Ledger(run.ledger) as ledger:
        trajs = [ledger.get(f"r0001-{i:03d}-{g:02d}") for i in range(4) for g in range(4)]
    grads = []
    for tokens in (10**6, 200):  # one micro-batch vs many
        model, tok = load_policy(run.checkpoint(1))
        cfg = LearnerConfig(micro_batch_tokens=tokens, lr=1e-9, drop_zero_variance=False,
                            temperature=MINI["temperature"])
        learner = Learner(model, cfg, pad_id=tok.pad_token_id)
        stats = learner.update(trajs)
        grads.append(
            torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        )
        assert stats["learn/micro_batches"] == len(micro_batches(trajs, tokens))
    # the cap forces more cuts
    assert len(micro_batches(trajs, 200)) > len(micro_batches(trajs, 10**6))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_taurl_eval_of_a_bare_checkpoint_reproduces_the_recipes_evaluation(mini):
    """A checkpoint carries its env, prompt, task options and budgets: `taurl eval CKPT`
    (no run config) meets the same tasks and seeds and gets the recipe's figure exactly."""
    from taurl.cli import commands

    run_dir, summary = mini
    result = commands.evaluate(
        RunDir(run_dir).checkpoint(3), split="validation", trials=MINI["eval_trials"],
        tasks=MINI["eval_tasks"], temperature=MINI["eval_temperature"], progress=False,
    )
    assert result.to_dict()["task_successes"] == summary["validation"]["final"]["task_successes"]
    assert result.success == summary["validation"]["final"]["success"]
