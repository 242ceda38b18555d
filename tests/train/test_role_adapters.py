"""Separate LoRA adapters per role: each role's adapter moves only by its own role's tokens."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from taurl.envs.core import Task
from taurl.envs.multiagent import Seat
from taurl.errors import ConfigError
from taurl.policy.local_engine import LocalEngine
from taurl.policy.model import create_policy
from taurl.policy.tokenizer import build_tokenizer
from taurl.rollout.budgets import RolloutConfig
from taurl.rollout.match import run_match
from taurl.train.learner import LearnerConfig
from taurl.train.lora import LoraOptions
from taurl.train.role_adapters import (
    RoleLearners,
    adapter_state,
    attach_roles,
    role_policy,
)

ROLES = ("a", "b")


class TalkGame:
    """Two roles speak in turn, twice each; any text is a move. At the end the role named
    by the task's ``paid`` earns len(its last text) mod 2, the other a constant 0.5: within
    a group the unpaid role's advantages are all zero, so its rows carry no gradient."""

    name, version, verifier_version = "talk-v0", "1", "talk-1"
    observation_style, stop, tools = "inline", (), []
    roles = ROLES

    def system_prompt_for(self, role: str) -> str:
        return f"You are {role}. Say something."

    def reset(self, task: Task, seed: int | None = None) -> dict[str, Any]:
        self.paid, self.moves, self.last = task.metadata["paid"], 0, {}
        return {"to_act": "a"}

    def prompt_for(self, role: str) -> str:
        return f"<information>{role} speaks</information>"

    def step(self, role: str, action: str):
        self.moves += 1
        self.last[role] = action
        other = "b" if role == "a" else "a"
        if self.moves < 4:
            seen = {other: f"<information>{role} said</information>"}
            return seen, {}, False, False, {"action": {"kind": "say"}, "to_act": other}
        rewards = {r: (len(self.last[r]) % 2 if r == self.paid else 0.5) for r in ROLES}
        return {}, rewards, True, False, {"action": {"kind": "say"}, "to_act": None,
                                          "reward_components": {r: {"outcome": x}
                                                                for r, x in rewards.items()}}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(["You are a. Say something. <information>b said</information>",
                            "hello world, a b c d e f g"] * 5, vocab_size=300)


def fresh(tok):
    torch.manual_seed(0)
    base = create_policy(tok, "tiny", 0)
    return attach_roles(base, ROLES, LoraOptions(rank=4, alpha=8.0), seed=0)


def play(model, tok, paid: str) -> list:
    """8 matches of one task (one group per role), each role sampled by its own adapter."""
    engines = {r: LocalEngine(role_policy(model, r), tok, version=0, seed=i)
               for i, r in enumerate(ROLES)}
    task = Task("t", "", ("won",), "train", "talk-v0", {"paid": paid})
    cfg = RolloutConfig(max_turns=4, max_action_tokens=5, max_episode_tokens=120,
                        max_context=512, temperature=1.0)

    async def go():
        return await asyncio.gather(*[
            run_match(TalkGame(), {r: Seat.policy(engines[r]) for r in ROLES}, tok, task,
                      seed=i, config=cfg, match_id=f"m{i}") for i in range(8)])

    return [t for res in asyncio.run(go()) for t in res.trained]


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
@pytest.mark.parametrize("paid", ["a", "b"])
def test_each_role_adapter_moves_only_by_its_own_rows(tok, paid, kl_coef, one_thread):
    model = fresh(tok)
    records = play(model, tok, paid)
    assert {t.metadata["role"] for t in records} == set(ROLES)
    learners = RoleLearners(model, ROLES,
                            LearnerConfig(lr=1e-2, weight_decay=0.1, kl_coef=kl_coef),
                            pad_id=tok.pad_token_id)
    before = {r: adapter_state(model, r) for r in ROLES}
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    metrics = learners.update(records, version=0)
    unpaid = "b" if paid == "a" else "a"
    after = {r: adapter_state(model, r) for r in ROLES}
    assert before[paid].keys() == after[paid].keys() and len(before[paid]) > 0
    # the paid role's adapter moved; the unpaid role's is bit for bit what it was
    assert any(not torch.equal(before[paid][n], after[paid][n]) for n in before[paid])
    assert all(torch.equal(before[unpaid][n], after[unpaid][n]) for n in before[unpaid])
    assert metrics[f"{paid}/learn/adv_abs_max"] > 0 and metrics[f"{unpaid}/learn/skipped"] == 1
    # the base never moves
    assert all(torch.equal(p, dict(model.named_parameters())[n]) for n, p in base_before.items())


def test_each_role_samples_with_its_own_adapter(tok):
    model = fresh(tok)
    with torch.no_grad():  # move b's adapter only: b's served policy differs, a's does not
        for n, p in model.named_parameters():
            if "lora_B" in n and ".role_b." in n:
                p.add_(0.5)
    ids = torch.tensor([tok("hello world")["input_ids"]])
    base = model.get_base_model()
    with model.disable_adapter():
        plain = base(ids).logits
    assert torch.allclose(role_policy(model, "a")(ids).logits, plain, atol=1e-5)
    assert not torch.allclose(role_policy(model, "b")(ids).logits, plain, atol=1e-2)


def test_records_of_a_role_without_adapter_are_refused(tok):
    model = fresh(tok)
    learners = RoleLearners(model, ROLES, LearnerConfig(), pad_id=tok.pad_token_id)
    records = play(model, tok, "a")
    import dataclasses

    stray = dataclasses.replace(records[0], metadata={**records[0].metadata, "role": "c"})
    with pytest.raises(ConfigError, match="no adapter"):
        learners.update([stray])
    with pytest.raises(ConfigError, match="distinct"):
        attach_roles(create_policy(tok, "tiny", 0), ("a", "a"), LoraOptions(rank=4))
