"""On-policy distillation: the student samples, a teacher scores the student's own action tokens.

The recipe's ``rl.teacher: DIR`` (`taurl.recipe.stages`). The student's episodes come through
the real loop, as RL's do; the learner then asks the teacher (a frozen checkpoint) for its
distribution at every position that predicts an action token and trains the student toward
it (Agarwal et al., arXiv 2306.13649, GKD; Thinking Machines' "On-policy distillation", 2025):

    reverse_kl:  ℓ_t = Σ_v π_s(v | ·) [log π_s(v | ·) − log π_t(v | ·)]       (exact, per token)
    advantage:   A_t = −(log π_s(x_t | ·) − log π_t(x_t | ·))  (sampled token, detached)
                 ℓ_t = −A_t · π_s(x_t) / sg(π_s(x_t))           (its value is the k1 estimate
                                                                 of the reverse KL, its gradient
                                                                 −A_t ∇log π_s)
    loss = Σ_t m_t ℓ_t / Σ_t m_t  (+ reward_weight · the PPO loss on the env's GRPO advantages)

m is the action mask: observation, prompt and template tokens are the environment's, never the
student's, so no loss term reads a position that predicts one (their logits are not even
computed). Both losses are 0, with a zero gradient, when the student equals the teacher.

The teacher reads the student's token ids, so both must share one tokenizer: `tokenizer_problem`
says why a teacher is refused (a vocabulary that maps some id to another string, other special
tokens). The teacher is loaded in-process beside the student (any local HF causal LM).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from taurl.credit import TurnBatch, make_estimator
from taurl.credit.batch import drop_invalid
from taurl.data.trajectory import Trajectory
from taurl.train.lora import trainable
from taurl.train.objectives import make_objective
from taurl.train.optim import optimizer_step
from taurl.train.rows import Rows, column_logits, make_rows, micro_batches, model_device
from taurl.train.stage_options import DISTILL_LOSSES, DistillOptions

KINDS = DISTILL_LOSSES


def tokenizer_problem(student: Any, teacher: Any, teacher_name: str = "the teacher") -> str | None:
    """Why `teacher`'s tokenizer cannot score the student's tokens, or None when it can."""
    sv, tv = student.get_vocab(), teacher.get_vocab()
    how = ("the teacher scores the student's own token ids, so both need one tokenizer: distil "
           "from a checkpoint of the student's model family (or train the teacher on the student's "
           "tokenizer)")
    if sv != tv:
        s_inv = {i: s for s, i in sv.items()}
        t_inv = {i: s for s, i in tv.items()}
        differ = sorted(i for i in set(s_inv) | set(t_inv) if s_inv.get(i) != t_inv.get(i))
        i = differ[0]
        return (f"{teacher_name}'s tokenizer differs from the student's: {len(differ)} of "
                f"{max(len(sv), len(tv))} token ids map to other strings (e.g. id {i}: student "
                f"{s_inv.get(i)!r}, teacher {t_inv.get(i)!r}); {how}")
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        if getattr(student, name, None) != getattr(teacher, name, None):
            return (f"{teacher_name}'s tokenizer has another {name} "
                    f"({getattr(teacher, name, None)} vs the student's "
                    f"{getattr(student, name, None)}); {how}")
    return None


def action_logits(model: torch.nn.Module, rows: Rows) -> tuple[Tensor, Tensor, Tensor]:
    """The model's logits at the K positions that predict an action token: (K, V), the K
    predicted token ids and the (B, L−1) selection (`taurl.train.rows.action_logprobs`'s layout)."""
    sel = rows.mask[:, 1:].bool()
    cols = sel.any(0).nonzero().squeeze(-1)
    logits = column_logits(model, rows, cols)
    return logits[sel[:, cols]], rows.input_ids[:, 1:][sel], sel


def distill_loss(student_logits: Tensor, teacher_logits: Tensor, tokens: Tensor, mask: Tensor, *,
                 kind: str = "reverse_kl", temperature: float = 1.0,
                 denominator: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """The distillation loss (module docstring) of logits (..., V) aligned with `tokens` and
    `mask` (...): position i's logits score token i. Only the positions with mask 1 are read
    (selected before any arithmetic), so the others add nothing and get an exactly zero
    gradient, whatever their logits hold."""
    on = mask > 0
    s = torch.log_softmax(student_logits[on].float() / temperature, dim=-1)  # (K, V)
    t = torch.log_softmax(teacher_logits.detach()[on].float() / temperature, dim=-1)
    picked = tokens[on].unsqueeze(-1)
    lp_s = s.gather(-1, picked).squeeze(-1)
    lp_t = t.gather(-1, picked).squeeze(-1)
    k1 = lp_s.detach() - lp_t  # the sampled-token estimate of the reverse KL
    if kind == "reverse_kl":
        per = (s.exp() * (s - t)).sum(-1)
    elif kind == "advantage":
        per = k1 * torch.exp(lp_s - lp_s.detach())  # −A_t · ratio, A_t = −k1
    else:
        raise ValueError(f"distillation loss must be one of {KINDS}, got {kind!r}")
    n = float(on.sum()) if denominator is None else denominator
    loss = per.sum() / max(n, 1.0)
    return loss, {"distill/reverse_kl_k1": float(k1.sum()) / max(float(on.sum()), 1.0),
                  "distill/loss": float(loss.detach())}


class DistillLearner:
    """One student step per update on its own samples, scored by the frozen teacher."""

    def __init__(self, model: torch.nn.Module, teacher: torch.nn.Module, opts: DistillOptions, *,
                 lr: float,
                 grad_clip: float, pad_id: int, micro_batch_tokens: int, temperature: float = 1.0,
                 weight_decay: float = 0.0, lr_warmup_steps: int = 0, estimator: str = "grpo",
                 eps_low: float = 0.2, eps_high: float = 0.28):
        self.model, self.opts, self.pad_id, self.temperature = model, opts, pad_id, temperature
        self.lr, self.grad_clip, self.lr_warmup_steps = lr, grad_clip, lr_warmup_steps
        self.micro_batch_tokens = micro_batch_tokens
        self.teacher = teacher.to(model_device(model)).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(trainable(model), lr=lr, weight_decay=weight_decay)
        self.estimator = make_estimator(estimator)
        self.pg = make_objective("ppo", eps_low=eps_low, eps_high=eps_high)

    def assign(self, trajs: Sequence[Trajectory]) -> tuple[list[Trajectory], np.ndarray | None]:
        """The valid episodes and, with a reward weight, their per-turn env advantages."""
        valid = drop_invalid(trajs)[0]
        if not valid or not self.opts.reward_weight:
            return valid, None
        return valid, self.estimator(TurnBatch.from_trajectories(valid)).advantages

    def save_state(self, checkpoint_dir: Any) -> None:
        return None

    def load_state(self, checkpoint_dir: Any) -> bool:
        return False

    def loss(self, r: Rows, denominator: float) -> tuple[Tensor, dict[str, float]]:
        """The loss of one micro-batch (distillation + reward_weight · PPO on env advantages)."""
        s_logits, tokens, sel = action_logits(self.model, r)
        with torch.no_grad():
            t_logits = action_logits(self.teacher, r)[0]
        ones = torch.ones_like(tokens, dtype=torch.float32)
        loss, m = distill_loss(s_logits, t_logits, tokens, ones, kind=self.opts.loss,
                               temperature=self.temperature, denominator=denominator)
        if self.opts.reward_weight:
            picked = torch.log_softmax(s_logits.float() / self.temperature, -1).gather(
                -1, tokens.unsqueeze(-1)).squeeze(-1)
            lp = torch.zeros(r.mask.shape, device=r.mask.device)
            lp[:, 1:] = lp[:, 1:].masked_scatter(sel, picked)
            pg, _ = self.pg(lp, r.behaviour, r.advantages, r.mask, denominator=denominator)
            loss = loss + self.opts.reward_weight * pg
            m["distill/pg_loss"] = float(pg.detach())
        return loss, m

    def update(self, trajs: Sequence[Trajectory], version: int | None = None,
               credit: tuple[list[Trajectory],
                             np.ndarray | None] | None = None) -> dict[str, float]:
        t0 = time.perf_counter()
        valid, adv = self.assign(trajs) if credit is None else credit
        if not valid:
            return {"learn/rows": 0.0, "learn/skipped": 1.0,
                    "learn/learn_s": time.perf_counter() - t0}
        device = model_device(self.model)
        chunks = micro_batches(valid, self.micro_batch_tokens)
        rows = [make_rows([valid[i] for i in c], None if adv is None else adv[c], self.pad_id,
                          device)
                for c in chunks]
        n_tok = sum(float(r.mask.sum()) for r in rows)
        self.model.eval()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = {}
        for r in rows:
            loss, m = self.loss(r, n_tok)
            loss.backward()
            w = float(r.mask.sum()) / max(n_tok, 1.0)
            for k, v in m.items():
                # token-weighted means; the loss itself is already a share of the whole
                sums[k] = sums.get(k, 0.0) + (v if k in ("distill/loss", "distill/pg_loss")
                                              else w * v)
        norm, lr = optimizer_step(self.model, self.optimizer, self.lr, self.lr_warmup_steps,
                                  self.grad_clip)
        return {**sums, "learn/loss": sums.get("distill/loss", 0.0),
                "learn/rows": float(len(valid)),
                "learn/grad_norm": float(norm), "learn/lr": lr, "learn/action_tokens": n_tok,
                "learn/skipped": 0.0, "learn/learn_s": time.perf_counter() - t0}
