"""Separate LoRA adapters per role over one base (``policy.lora.per_role: true``).

A multi-agent run whose roles should not share weights (x and o, a proposer and a solver)
keeps one named peft adapter per role on one frozen base (peft holds several adapters on
one model; ``set_adapter(name)`` makes one active, and only the active one's parameters
require gradients):

    model = attach_roles(base, ("x", "o"), LoraOptions(rank=8))
    learners = RoleLearners(model, ("x", "o"), LearnerConfig(...), pad_id)
    learners.update(records)                 # each role's rows train its own adapter only
    engines = {r: LocalEngine(role_policy(model, r), tok) for r in roles}  # sampling per role

Routing, and why it is exact: the credit runs once on the whole batch (so `zero_sum` sees
both records of a match, and `rae` keeps one baseline per (env, role)); the credited rows
are then split by ``metadata["role"]``, and each role's rows go through that role's own
`taurl.train.learner.Learner` with that role's adapter active. The other adapters take no
part in the forward, so their gradient is not small but absent, and each role's optimizer
holds its own adapter's parameters only. A role with no credited rows (all its advantages
zero) takes no optimizer step at all, so not even weight decay moves its adapter. With
``kl_coef`` > 0 each role's KL reference is the shared base with every adapter off
(`taurl.train.lora.base_only`); leaving that context makes the active role's adapter the
only trainable one again, so the routing holds (the test runs with and without the KL).
tests/train/test_role_adapters.py checks both directions bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from taurl.data.trajectory import Trajectory
from taurl.errors import ConfigError
from taurl.train.credit_step import Credited, credit_step
from taurl.train.learner import Learner, LearnerConfig
from taurl.train.lora import LoraOptions


def _lora_config(options: LoraOptions) -> Any:
    from peft import LoraConfig

    targets = options.targets if isinstance(options.targets, str) else list(options.targets)
    return LoraConfig(r=options.rank, lora_alpha=options.alpha, lora_dropout=options.dropout,
                      target_modules=targets, task_type="CAUSAL_LM")


def adapter_name(role: str) -> str:
    """peft's name of `role`'s adapter: ``role_{role}`` (peft warns about, and may mis-load,
    an adapter whose name is a substring of its ``lora_`` prefix, such as ``o`` or ``a``)."""
    return f"role_{role}"


def attach_roles(model: torch.nn.Module, roles: Sequence[str], options: LoraOptions,
                 seed: int = 0) -> Any:
    """`model` with one fresh adapter per role, named by the role (B = 0: each role's policy
    starts as `model` exactly); role i's A is drawn from a generator seeded by (seed, i)."""
    from peft import get_peft_model

    roles = list(roles)
    if len(set(roles)) != len(roles) or not roles or not all(r and r.isidentifier()
                                                              for r in roles):
        raise ConfigError(f"per-role adapters need distinct role names (identifiers), got {roles}")
    cfg = _lora_config(options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, cfg, adapter_name=adapter_name(roles[0]))
        for i, role in enumerate(roles[1:], start=1):
            torch.manual_seed(seed * 1000 + i)
            peft_model.add_adapter(adapter_name(role), cfg)
    peft_model.set_adapter(adapter_name(roles[0]))
    return peft_model


def adapter_state(model: Any, role: str) -> dict[str, torch.Tensor]:
    """A copy of `role`'s adapter parameters (name → tensor): what a test compares."""
    return {n: p.detach().clone() for n, p in model.named_parameters()
            if "lora_" in n and f".{adapter_name(role)}." in n}


def role_policy(model: Any, role: str) -> torch.nn.Module:
    """A plain copy of the base with `role`'s adapter merged (W + (alpha/r)·BA): what the
    role's engine serves. `model` is left as it was (its active adapter included)."""
    twin = copy.deepcopy(model)
    twin.set_adapter(adapter_name(role))
    plain = twin.merge_and_unload(adapter_names=[adapter_name(role)])
    return plain.eval().requires_grad_(False)


def split_credit(credit: Credited, roles: Sequence[str]) -> dict[str, Credited]:
    """`credit`'s rows per role (``metadata["role"]``); a role without rows is skipped."""
    out = {}
    for role in roles:
        idx = [i for i, t in enumerate(credit.kept) if t.metadata.get("role") == role]
        adv = credit.advantages[idx] if idx else np.zeros((0, 0))
        rows = {**credit.stats, "learn/rows": float(len(idx))}
        out[role] = Credited([credit.kept[i] for i in idx], adv, rows, credit.skip or not idx)
    return out


class RoleLearners:
    """One `Learner` (optimizer) per role over one multi-adapter model (module docstring)."""

    def __init__(self, model: Any, roles: Sequence[str], config: LearnerConfig,
                 pad_id: int = 0):
        self.model, self.roles = model, tuple(roles)
        self.learners: dict[str, Learner] = {}
        for role in self.roles:  # the optimizer takes the parameters that require grad: role's
            model.set_adapter(adapter_name(role))
            self.learners[role] = Learner(model, config, pad_id=pad_id)
        # the credit (one estimator: rae's baselines per (env, role) live here)
        self.credit = self.learners[self.roles[0]]

    def update(self, trajs: Sequence[Trajectory], version: int | None = None
               ) -> dict[str, float]:
        """One update of every role's adapter from its own rows; metrics ``{role}/learn/*``."""
        unknown = sorted({str(t.metadata.get("role")) for t in trajs} - set(self.roles))
        if unknown:
            raise ConfigError(f"records of role(s) {unknown} have no adapter; roles {self.roles}")
        credit = credit_step(self.credit, trajs)
        out: dict[str, float] = {}
        for role, part in split_credit(credit, self.roles).items():
            if part.skip:  # no rows of this role: no optimizer step (not even weight decay)
                out.update({f"{role}/learn/skipped": 1.0, f"{role}/learn/rows": 0.0})
                continue
            self.model.set_adapter(adapter_name(role))  # this role's adapter only
            stats = self.learners[role].update(part.kept, version, credit=part)
            out.update({f"{role}/{k}": v for k, v in stats.items()})
        self.model.set_adapter(adapter_name(self.roles[0]))
        return out
