"""The copy warm-up: example layout, that it teaches copying, and the SFT learning-rate schedule."""

from __future__ import annotations

import pytest
import torch

from taurl.policy import build_tokenizer
from taurl.policy.model import create_policy
from taurl.train.copy_warmup import SEPARATOR, copy_accuracy, copy_batch, copy_loss, copy_warmup
from taurl.train.sft import sft_lr_factor

NAMES = [
    "Gatesville", "Rockville", "Oslo", "Nizhny Novgorod", "São Paulo", "Aix-en-Provence", "Ulm",
    "Tromsø",
]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(
        [f"The city of {n} is in a country." for n in NAMES] * 20, vocab_size=400
    )


def test_copy_batch_masks_exactly_the_copy_and_its_end(tok) -> None:
    b = copy_batch(["Oslo", "Nizhny Novgorod"], tok)
    for row, name in enumerate(["Oslo", "Nizhny Novgorod"]):
        n = int(b.attention_mask[row].sum())
        ids = b.input_ids[row, :n].tolist()
        copied = [t for t, m in zip(ids, b.loss_mask[row, :n].tolist(), strict=True) if m]
        assert copied[-1] == tok.eos_token_id
        assert tok.decode(copied[:-1]) == " " + name
        assert tok.decode(ids) == f" {name}{SEPARATOR} {name}{tok.eos_token}"
        assert b.loss_mask[row, n:].sum() == 0 and (b.input_ids[row, n:] == tok.pad_token_id).all()


def test_copy_warmup_teaches_the_copy(tok) -> None:
    model = create_policy(tok, "tiny", seed=0)
    batch = copy_batch(NAMES, tok)
    with torch.no_grad():
        before = float(copy_loss(model, batch))
    losses = copy_warmup(model, tok, NAMES, steps=80, batch_size=16, lr=3e-3, warmup_steps=10)
    with torch.no_grad():
        after = float(copy_loss(model, batch))
    assert len(losses) == 80 and not model.training
    assert after < before - 3.0, (before, after)
    assert copy_accuracy(model, NAMES, tok) > 0.5  # memorized at least: it is the training set


def test_copy_warmup_refuses_no_names(tok) -> None:
    with pytest.raises(ValueError, match="at least one name"):
        copy_warmup(create_policy(tok, "tiny", seed=0), tok, [], steps=1)


def test_sft_schedule_warms_up_then_decays_to_a_tenth() -> None:
    f = [sft_lr_factor(s, warmup=4, total=14) for s in range(16)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert (
        f[4] == 1.0
        and f[9] == pytest.approx(0.55)
        and f[14] == pytest.approx(0.1)
        and f[15] == pytest.approx(0.1)
    )
    assert sft_lr_factor(0, warmup=0, total=10) == 1.0
