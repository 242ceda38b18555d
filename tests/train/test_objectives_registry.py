"""Objectives by name: every family runs through the registry; bad names and options are caught."""

from __future__ import annotations

import pytest
import torch

from taurl.errors import ConfigError
from taurl.train.objectives import (
    OBJECTIVES,
    get_objective,
    make_objective,
    objective_family,
    objective_names,
)


def test_names_and_families():
    assert {"ppo", "dual_clip_ppo", "gspo", "decoupled_ppo", "sft", "dpo"} <= set(objective_names())
    assert objective_family("gspo") == "policy_gradient" and objective_family("dpo") == "preference"


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_runs_by_name_and_cites_its_source(name):
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(2, 6, generator=g)).requires_grad_()
    old, adv = -torch.rand(2, 6, generator=g), torch.randn(2, 6, generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1], [0, 0, 1, 1, 1, 0]])
    family = objective_family(name)
    fn = (
        make_objective(name, aggregation="seq-mean-token-mean")
        if family != "preference"
        else make_objective(name)
    )
    if family == "policy_gradient":
        extra = {"behaviour_logprobs": old - 0.1} if name == "decoupled_ppo" else {}
        loss, metrics = fn(logp, old, adv, mask, **extra)
    elif family == "sft":
        loss, metrics = fn(logp, mask)
    else:
        loss, metrics = fn(logp[:1], old[:1], mask[:1], logp[1:], old[1:], mask[1:])
    loss.backward()
    assert torch.isfinite(loss) and all(k.startswith("learn/") for k in metrics)
    assert torch.all(logp.grad[mask == 0] == 0)
    module = __import__(get_objective(name).__module__, fromlist=["_"])
    assert "arXiv" in (module.__doc__ or "") + (get_objective(name).__doc__ or "")


def test_unknown_objective_and_options():
    with pytest.raises(ConfigError, match="Did you mean 'gspo'"):
        get_objective("gpso")
    with pytest.raises(ConfigError) as e:
        make_objective("ppo", eps_hgh=0.28, agregation="token-mean")
    assert len(e.value.problems) == 2 and "Did you mean 'eps_high'" in str(e.value)
