"""Learner-vs-behaviour mismatch metrics, against numbers computed by hand."""

import math

import pytest
import torch

from taurl.errors import Error
from taurl.train.mismatch import logprob_mismatch


def test_hand_computed_mismatch():
    # d = learner - behaviour on the three action tokens = [0, 0.5, -0.2]; the 4th is masked
    learner = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
    behaviour = torch.tensor([[-1.0, -2.5, -0.3, -1.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    m = logprob_mismatch(learner, behaviour, mask, clip_low=0.2, clip_high=0.2)
    assert m.tokens == 3
    assert m.abs_mean == pytest.approx(0.7 / 3)
    assert m.abs_max == pytest.approx(0.5)
    # k3 per token: 0; e^-0.5 - 1 + 0.5 = 0.106531; e^0.2 - 1 - 0.2 = 0.021403
    assert m.kl == pytest.approx((0.0 + 0.1065307 + 0.0214028) / 3, abs=1e-6)
    # ratios 1, e^0.5 = 1.649 (outside [0.8, 1.2]), e^-0.2 = 0.819 (inside)
    assert m.clip_share == pytest.approx(1 / 3)
    assert m.as_stats()["mismatch/abs_max"] == pytest.approx(0.5)
    # the mean passes 0.1, the max stays under 1
    alarms = m.alarms(abs_mean_max=0.1, abs_max_max=1.0)
    assert len(alarms) == 1 and "mean" in alarms[0]


def test_equal_logprobs_give_zeros_and_no_alarm():
    lp = torch.log(torch.tensor([[0.5, 0.25, 0.125]]))
    m = logprob_mismatch(lp, lp.clone(), torch.ones(1, 3))
    assert (m.abs_mean, m.abs_max, m.kl, m.clip_share) == (0.0, 0.0, 0.0, 0.0)
    assert m.alarms() == []


def test_asymmetric_clip_range_and_empty_mask():
    d = torch.tensor([math.log(1.25), math.log(0.75)])  # ratios 1.25 and 0.75
    m = logprob_mismatch(d, torch.zeros(2), torch.ones(2), clip_low=0.2, clip_high=0.28)
    assert m.clip_share == pytest.approx(0.5)  # 1.25 < 1.28 is inside; 0.75 < 0.8 is outside
    assert logprob_mismatch(d, torch.zeros(2), torch.zeros(2)).tokens == 0


def test_bad_inputs_are_refused():
    with pytest.raises(Error, match="shapes differ"):
        logprob_mismatch(torch.zeros(2), torch.zeros(3), torch.ones(2))
    with pytest.raises(Error, match="non-finite"):
        logprob_mismatch(torch.zeros(1), torch.tensor([-math.inf]), torch.ones(1))
