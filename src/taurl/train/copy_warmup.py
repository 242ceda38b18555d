"""Copy warm-up: teach a policy trained from scratch to copy a name before SFT.

An agent that searches must copy: the subject of the question into the query, the answer
out of the passage into ``<answer>``. A pretrained LLM arrives with induction heads that
do this; a tiny policy built from a config has none, and on the demonstrations alone it
forms them only after ~1,000 SFT steps (a sudden loss drop), which is most of the demo's
time budget. A few hundred steps on the bare copy task form them first (BENCHMARKS.md,
"copy warm-up").

Each example is ``{name} ->{name}<|im_end|>``, with the loss on the second copy and the
end token only. The pipeline passes the subjects and answers of the demonstrations'
(training) tasks: the warm-up sees no holdout name and no question-answer pair.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from taurl.train.objectives import sequence_logprobs

SEPARATOR = " ->"


@dataclass(frozen=True)
class CopyBatch:
    input_ids: torch.Tensor  # [B, T], right-padded
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T]: 1 on the tokens of the copy (and its end token)


def copy_batch(names: Sequence[str], tokenizer) -> CopyBatch:
    """One right-padded batch of copy examples (module docstring)."""
    sep = tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
    rows, masks = [], []
    for name in names:
        # a leading space: a name inside a sentence is tokenized that way, and so is the
        # expert's "<search> name" (taurl.rollout.synth)
        ids = tokenizer(" " + name.strip(), add_special_tokens=False)["input_ids"]
        rows.append(ids + sep + ids + [tokenizer.eos_token_id])
        masks.append([0] * (len(ids) + len(sep)) + [1] * (len(ids) + 1))
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    return CopyBatch(
        input_ids=torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
        attention_mask=torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        loss_mask=torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32),
    )


def copy_loss(model: torch.nn.Module, batch: CopyBatch) -> torch.Tensor:
    """Token-mean NLL of the copy: -Σ m_t log π(x_t | x_<t) / Σ m_t."""
    batch = _to(batch, next(model.parameters()).device)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = sequence_logprobs(logits, batch.input_ids)
    return -(logp * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1.0)


def _to(batch: CopyBatch, device: torch.device) -> CopyBatch:
    return CopyBatch(batch.input_ids.to(device), batch.attention_mask.to(device),
                     batch.loss_mask.to(device))


@torch.no_grad()
def copy_accuracy(model: torch.nn.Module, names: Sequence[str], tokenizer,
                  batch_size: int = 128) -> float:
    """Share of `names` whose whole copy (and end token) is the greedy prediction."""
    was_training = model.training
    model.eval()
    exact = 0
    for i in range(0, len(names), batch_size):
        b = _to(copy_batch(names[i:i + batch_size], tokenizer), next(model.parameters()).device)
        pred = model(input_ids=b.input_ids,
                     attention_mask=b.attention_mask).logits[:, :-1].argmax(-1)
        ok = (pred == b.input_ids[:, 1:]) | (b.loss_mask[:, 1:] == 0)
        exact += int(ok.all(-1).sum())
    model.train(was_training)
    return exact / max(len(names), 1)


def copy_warmup(model: torch.nn.Module, tokenizer, names: Sequence[str], *, steps: int,
                batch_size: int = 64,
                lr: float = 3e-3, warmup_steps: int = 30, grad_clip: float = 1.0, seed: int = 0,
                on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Train `model` in place for `steps` AdamW steps on copying random `names`; returns the
    loss per step. The learning rate rises linearly over `warmup_steps` and then stays."""
    if not names:
        raise ValueError("copy_warmup needs at least one name")
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt,
                                              lambda s: min(1.0, (s + 1) / max(warmup_steps, 1)))
    model.train()
    losses = []
    for step in range(1, steps + 1):
        loss = copy_loss(model, copy_batch([rng.choice(names) for _ in range(batch_size)],
                                           tokenizer))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses


def copy_warmup_phase(model: torch.nn.Module, tokenizer, names: Sequence[str], probe: Sequence[str],
                      *, steps: int, batch_size: int, lr: float, grad_clip: float, seed: int,
                      log: Callable[[int, dict[str, float]], None]) -> dict[str, float]:
    """An env's pre-SFT warm-up hook body: `copy_warmup` on `names` (deduplicated), the loss
    logged every 25 steps, then the exact-copy rate of up to 256 `probe` strings it never
    trained on. Returns {} when `steps` is 0."""
    if steps == 0:
        return {}
    names = list(dict.fromkeys(names))
    seen = set(names)
    unseen = [n for n in dict.fromkeys(probe) if n not in seen][:256]

    def on_step(step: int, loss: float) -> None:
        if step % 25 == 0 or step == steps:
            log(step, {"copy/loss": loss})

    copy_warmup(model, tokenizer, names, steps=steps, batch_size=batch_size, lr=lr,
                grad_clip=grad_clip, seed=seed, on_step=on_step)
    return {"copy/exact_unseen": copy_accuracy(model, unseen, tokenizer) if unseen else 0.0,
            "copy/names": float(len(names)), "copy/unseen_names": float(len(unseen))}
