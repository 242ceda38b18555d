"""Rejection-sampling SFT, trajectory DPO and on-policy distillation (taurl.recipe.stages):
what each stage keeps, pairs and scores, on real search-v0 episodes and real tokenizers."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import numpy as np
import pytest
import torch
from tests.train._tiny_lm import tiny_lm

from taurl import envs
from taurl.data.trajectory import ToolReceipt
from taurl.envs.search import generate_tasks
from taurl.errors import ConfigError
from taurl.eval.evaluate import default_verifier
from taurl.policy import build_tokenizer
from taurl.policy.files import save_policy
from taurl.rollout.loop import run_episode
from taurl.rollout.rejection import RejectionOptions, keep_episodes
from taurl.rollout.synth import ScriptedEngine
from taurl.train.distill import DistillLearner, DistillOptions, distill_loss, tokenizer_problem
from taurl.train.pair_learner import DPOLearner, DPOOptions, trajectory_pairs

ENV = {"top_k": 1, "max_doc_chars": 120}


@pytest.fixture(scope="module")
def tok(search_tokenizer):
    return search_tokenizer


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks("train", n=4, seed=3, families=["city_country"])


def play(tok, task, actions, eid):
    traj = asyncio.run(
        run_episode(
            ScriptedEngine(tok, actions), envs.make("search-v0", **ENV), tok, task, seed=0,
            episode_id=eid,
        )
    )
    return traj


def right(task):
    return [f"<search>{task.metadata['subject']}</search>", f"<answer>{task.answers[0]}</answer>"]


def wrong(task, guess="Atlantis"):
    return [f"<search>{task.metadata['subject']}</search>", f"<answer>{guess}</answer>"]


def with_turn(traj, **change):
    turns = list(traj.turns)
    turns[0] = dataclasses.replace(turns[0], **change)
    return dataclasses.replace(traj, turns=turns)


def test_rejection_keeps_only_verified_successes_and_never_a_cheat(tok, tasks):
    task = tasks[0]
    ok = play(tok, task, right(task), "ok")
    fail = play(tok, task, wrong(task), "fail")
    lied = dataclasses.replace(fail, reward=1.0)  # a training reward the verifier does not confirm
    cheat = with_turn(
        play(tok, task, right(task), "cheat"),
        action={**ok.turns[0].action, "cheats": ["read_tests"]},
    )
    denied = with_turn(play(tok, task, right(task), "denied"),
                       receipt=ToolReceipt("search", {}, "denied", "denied", "not allowed"))
    # the reward alone would keep them
    assert ok.reward == 1.0 and cheat.reward == 1.0 and denied.reward == 1.0
    kept = keep_episodes([ok, fail, lied, cheat, denied], [task], default_verifier("search-v0"),
                         RejectionOptions(), attempts=5)
    assert [t.episode_id for t in kept.trajs] == ["ok"]
    s = kept.stats
    assert (
        s["rejection/rejected_unverified"],
        s["rejection/rejected_cheat"],
        s["rejection/rejected_denied"],
    ) == (2, 1, 1)
    # difficulty and length bounds: a medium task (3 of 5 verified) outside the kept
    # buckets keeps nothing
    assert keep_episodes([ok, fail, lied, cheat, denied], [task], default_verifier("search-v0"),
                         RejectionOptions(buckets=["easy"]), attempts=5).trajs == []
    n = sum(ok.action_mask)
    assert (
        keep_episodes(
            [ok], [task], default_verifier("search-v0"), RejectionOptions(max_action_tokens=n - 1),
            attempts=1,
        ).stats["rejection/rejected_length"]
        == 1
    )
    from taurl.recipe.validate import option_problems

    # an unknown option, refused
    assert option_problems("sft.rejection", RejectionOptions, {"rounds": 0, "bukets": []})


def test_dpo_pairs_never_cross_tasks_and_prefer_the_higher_reward(tok, tasks):
    trajs = []
    for i, task in enumerate(tasks):
        for g in range(3):
            trajs.append(
                play(tok, task, right(task) if g == i % 3 else wrong(task, f"X{g}"), f"{i}-{g}")
            )
    rng = np.random.default_rng(0)
    trajs = [trajs[i] for i in rng.permutation(len(trajs))]  # tasks interleaved in the batch
    for mode in ("best_worst", "all"):
        pairs = trajectory_pairs(trajs, DPOOptions(pairs=mode))
        assert pairs and all(p.chosen.task_id == p.rejected.task_id == p.task_id for p in pairs)
        assert all(p.chosen.reward > p.rejected.reward for p in pairs)
    assert len(trajectory_pairs(trajs, DPOOptions(pairs="best_worst"))) == len(tasks)
    # anchor pairs share their first turn (the same search and observation) and score after it
    anchored = trajectory_pairs(trajs, DPOOptions(anchor=True))
    assert anchored and all(
        p.start > 0 and p.chosen.token_ids[: p.start] == p.rejected.token_ids[: p.start]
        for p in anchored
    )
    model = tiny_lm(len(tok))
    learner = DPOLearner(model, copy.deepcopy(model), DPOOptions(beta=0.5), lr=1e-2, grad_clip=1.0,
                         pad_id=tok.pad_token_id)
    first = learner.update(trajs)
    assert first["learn/skipped"] == 0 and first["learn/dpo_loss"] == pytest.approx(
        np.log(2), abs=1e-5
    )
    # the step moved toward the chosen
    assert learner.update(trajs)["learn/dpo_loss"] < first["learn/dpo_loss"]


def test_dpo_micro_batches_give_the_one_batch_loss_and_gradient(tok, tasks):
    """micro_batch_tokens cuts the pairs into micro-batches whose gradients accumulate with the
    global 1/P: the loss, its metrics and the gradient equal one batch's."""
    trajs = [play(tok, task, right(task) if g == 0 else wrong(task, f"X{g}"), f"{i}-{g}")
             for i, task in enumerate(tasks) for g in range(3)]
    base = tiny_lm(len(tok))
    with torch.no_grad():  # a reference that differs from the policy: the log-ratios are not 0
        reference = copy.deepcopy(base)
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out, grads = [], []
    for budget in (10**9, 1):  # one batch; one pair per micro-batch
        model = copy.deepcopy(base)
        learner = DPOLearner(model, reference, DPOOptions(beta=0.5, pairs="all"), lr=1e-2,
                             grad_clip=1e9, pad_id=tok.pad_token_id, micro_batch_tokens=budget)
        out.append(learner.update(trajs))
        # the accumulated gradient (the optimizer steps on it and leaves it in place)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()
                                if p.grad is not None]))
    one, micro = out
    assert one["learn/micro_batches"] == 1
    assert micro["learn/micro_batches"] == one["learn/dpo_pairs"] > 1
    for k in ("learn/loss", "learn/dpo_loss", "learn/dpo_margin", "learn/dpo_reward_acc",
              "learn/grad_norm", "learn/action_tokens"):
        assert micro[k] == pytest.approx(one[k], rel=1e-5, abs=1e-6), k
    assert one["learn/loss"] != pytest.approx(np.log(2), abs=1e-4)  # the reference differs
    assert grads[0].abs().max() > 0 and torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_distillation_loss_is_zero_for_the_teacher_and_masks_observations():
    torch.manual_seed(0)
    logits = torch.randn(2, 7, 11, requires_grad=True)
    tokens = torch.randint(0, 11, (2, 7))
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0, 0]], dtype=torch.float32)
    for kind in ("reverse_kl", "advantage"):
        same, _ = distill_loss(logits, logits.detach().clone(), tokens, mask, kind=kind)
        assert float(same.detach()) == pytest.approx(0.0, abs=1e-6)
        (g,) = torch.autograd.grad(same, logits)
        assert float(g.abs().max()) < 1e-6
        other = torch.randn(2, 7, 11)
        other[mask == 0] = float("inf")  # whatever the teacher says at an observation position
        loss, _ = distill_loss(logits, other, tokens, mask, kind=kind)
        (g,) = torch.autograd.grad(loss, logits)
        assert torch.isfinite(loss) and float(loss.detach()) != 0.0
        assert torch.all(g[mask == 0] == 0) and float(g[mask == 1].abs().sum()) > 0


def test_distillation_learner_takes_no_step_toward_itself(tok, tasks):
    trajs = [play(tok, t, right(t), f"d{i}") for i, t in enumerate(tasks)]
    trajs = [dataclasses.replace(t, source="policy") for t in trajs]
    for kind in ("reverse_kl", "advantage"):
        model = tiny_lm(len(tok))
        learner = DistillLearner(
            model, copy.deepcopy(model), DistillOptions(loss=kind), lr=1e-2, grad_clip=1.0,
            pad_id=tok.pad_token_id, micro_batch_tokens=256,
        )
        m = learner.update(trajs)
        assert m["learn/loss"] == pytest.approx(0.0, abs=1e-6) and m["learn/grad_norm"] < 1e-6
        other = DistillLearner(
            tiny_lm(len(tok)), tiny_lm(len(tok) + 0).train(False), DistillOptions(loss=kind),
            lr=1e-2, grad_clip=1.0, pad_id=tok.pad_token_id, micro_batch_tokens=256,
        )
        torch.manual_seed(1)
        other.teacher.lm_head.weight.data.normal_()  # another policy: a real signal
        assert other.update(trajs)["learn/grad_norm"] > 0


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path):
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.validate import check_config

    a = build_tokenizer(
        [f"the city of Rockville {i} is in Maryland" for i in range(50)], vocab_size=300
    )
    b = build_tokenizer(
        [f"une ville {i} en France, pas aux États-Unis" for i in range(50)], vocab_size=300
    )
    assert tokenizer_problem(a, a) is None
    why = tokenizer_problem(a, b)
    assert why and "token ids map to other strings" in why and "one tokenizer" in why
    student, same, other = tmp_path / "student", tmp_path / "same", tmp_path / "other"
    save_policy(tiny_lm(len(a)), a, student)
    save_policy(tiny_lm(len(a)), a, same)
    save_policy(tiny_lm(len(b)), b, other)
    base = {"model": str(student), "sft": "none", "env_config": ENV, "eval_tasks": 2}
    check_config(TrainConfig(**base, teacher=str(same)))  # one tokenizer: accepted
    with pytest.raises(ConfigError, match="tokenizer differs from the student's"):
        check_config(TrainConfig(**base, teacher=str(other)))
    with pytest.raises(ConfigError, match="different stages"):
        check_config(TrainConfig(**base, teacher=str(same), objective="dpo"))
