"""The learner: one policy update from a batch of grouped trajectories (GRPO by default).

Read top to bottom, an update is the seeds' loop body, after the credit step
(`taurl.train.credit_step`: estimator, zero-advantage filter, critic fit), which the
recipe's RL step runs before it (`taurl.recipe.rl_step`):

    credit   = credit_step(learner, trajs)                # kept rows, advantages (N, T)
    A_tok    = broadcast_to_tokens(credit.advantages, padded_token_turn_index(kept))
    for micro-batch in length buckets:                    # gradient accumulation
        logπ_θ   = forward(policy)  on action tokens only (mask 1)
        loss     = objective(logπ_θ, logπ_old, A_tok, mask) + β·KL_k3(π_θ ‖ π_ref)
        loss.backward()                                   # scaled by the global denominator
    clip_grad_norm(max_norm); AdamW.step()                # one new policy version

The estimator and the objective are chosen by name (`taurl.credit.ESTIMATORS`,
`taurl.train.objectives.OBJECTIVES`); this module only moves tensors between them.
π_old is the behaviour policy recorded at sampling (``Trajectory.logprobs``): with a
staleness bound η = 0 and one epoch it is the current policy, so the ratio starts at 1.
The ``decoupled_ppo`` objective takes the recorded logprobs as behaviour μ and the
proximal policy π_prox (the weights before the update: the first epoch's own forward,
detached, since the optimizer steps only after a whole epoch); its metrics per update:
``learn/is_bounded_frac`` (share of action tokens whose weight π_prox/μ was truncated or masked),
``learn/behaviour_kl`` (k3 estimate of KL(μ ‖ π_prox)), ``learn/is_weight_mean`` /
``learn/is_weight_max_raw``. Every update also reports ``mismatch/abs_mean`` / ``mismatch/abs_max``
(learner vs behaviour logprobs, `taurl.train.mismatch`) and ``learn/staleness_{mean,p95,max}``
(`taurl.data.staleness`).

The rows, their logprobs and the micro-batches are `taurl.train.rows`'s; the SFT step is
`taurl.train.sft.sft_step` (both stay importable from here). The numerics (mixed precision,
truncated IS against the engine's dtype, activation checkpointing) are `taurl.train.precision`'s.

The RL update runs with the model in eval mode: dropout (GPT-2 ships with 0.1) would make
π_θ in the ratio a different, noisy function from the one the engine sampled with, so the
on-policy ratio would not start at 1 and clipping would fire on noise. Gradients flow in
eval mode all the same. SFT keeps train mode: there dropout is the regulariser the model's
config asks for, and no ratio is taken.

Invalid samples (``Trajectory.valid`` False: an error, not the agent, ended the episode)
never reach the loss. They are dropped before the estimator sees the batch, so a tool
failure is not scored as a 0-reward rollout of its group: the group's statistics are those
of its valid members (a group left with one member, or none, has zero variance and is
filtered like any other). They are counted as ``learn/invalid_samples_dropped``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from taurl.credit import TurnBatch, make_estimator, needs_values
from taurl.credit.batch import drop_invalid
from taurl.data.staleness import staleness_stats
from taurl.data.trajectory import Trajectory
from taurl.errors import ConfigError
from taurl.train import chains
from taurl.train.credit_step import Assigned, Credited, credit_step, filter_rows
from taurl.train.critic import Critic
from taurl.train.idle import fresh_rows as _fresh_rows
from taurl.train.idle import idle_metrics
from taurl.train.learner_config import LearnerConfig
from taurl.train.lora import base_only, is_lora, trainable
from taurl.train.mismatch import Mismatch, combine_mismatch, logprob_mismatch
from taurl.train.objectives import kl_loss, make_objective
from taurl.train.objectives.aggregation import aggregate
from taurl.train.optim import optimizer_step
from taurl.train.precision import Numerics, batch_tis_stats, checkpointed_eval, cuda_peak_mb
from taurl.train.rows import (
    Rows,
    action_logprobs,
    make_rows,
    micro_batches,
    model_device,
)

# ---------------------------------------------------------------------------------------
# The learner

# metrics that are maxima, not means (ratio_max, is_weight_max_raw)
_MAX_KEYS = ("_max", "_max_raw")


@dataclass(frozen=True)
class _Batch:
    """The rows of one update, cut into micro-batches; `denom` divides every micro-batch's loss."""

    rows: list[Rows]
    views: list[Trajectory]  # the rows' records: one per token stream of each kept episode
    chunks: list[list[int]]  # which views each micro-batch holds
    n_tok: float  # action tokens of the whole batch
    denom: float  # the global loss denominator (tokens for token-mean, else rows)


class Learner:
    """Owns the policy's optimizer (the frozen reference, and the critic of a value-based
    estimator such as gae); `update(trajs)` is one version."""

    runs_forward = True  # this process's model runs the update (False: a driver of ranks)

    def __init__(self, model: torch.nn.Module, config: LearnerConfig, pad_id: int = 0,
                 reference: torch.nn.Module | None = None, critic: Critic | None = None,
                 shaper: Any = None):
        if problems := config.problems():
            raise ConfigError(problems)
        self.model = model
        self.config = config
        self.pad_id = pad_id
        # per-token loss weights on top of the action mask (`make_rows`); None: the mask alone
        self.token_keep: Callable[[Trajectory], Sequence[float]] | None = None
        # called before an update touches the optimizer (the step's learning rate, the step):
        # a checkpoint written in the background waits here, so it holds the state after its update
        self.before_step: list[Callable[[], None]] = []
        self.reference = reference if config.kl_coef > 0 else None
        if self.reference is not None:  # on the policy's device: its rows are made there (a policy
            # moved to a GPU by the caller takes its reference along)
            self.reference.to(model_device(model)).eval().requires_grad_(False)
        # with LoRA the reference is the base under the adapters (`taurl.train.lora.base_only`)
        self.reference_is_base = config.kl_coef > 0 and reference is None and is_lora(model)
        # the trained parameters only: with LoRA the adapters', so no AdamW state for the base
        self.optimizer = torch.optim.AdamW(trainable(model), lr=config.lr,
                                           weight_decay=config.weight_decay)
        # precision, TIS (the objective PPO becomes) and the memory options: taurl.train.precision
        self.numerics = Numerics.for_learner(model, config, prepare=self.runs_forward)
        self.loss_fn = make_objective(self.numerics.objective, **self.numerics.objective_kwargs)
        self.estimator = make_estimator(config.estimator, **config.estimator_options)
        self.norm_constant = config.loss_norm_constant()
        # a value-based estimator gets its critic here, from the policy (taurl.train.critic)
        self.critic = critic
        if self.critic is None and needs_values(config.estimator):
            self.critic = Critic.from_policy(model, config.critic_config(), pad_id)
        # a learned step scorer (taurl.train.prm): ``shaper(valid, batch) -> (batch, stats)`` fills
        # ``process_rewards`` before the estimator runs; the outcome is never touched
        self.shaper = shaper

    def assign(self, trajs: Sequence[Trajectory]) -> Assigned | None:
        """Credit of the valid trajectories of `trajs` (None when none is valid).

        Invalid ones are dropped first (module docstring), so group statistics never see them.
        A value-based estimator reads the critic's V(s_t) per turn and V(s_T) after the last.
        """
        valid, dropped = drop_invalid(trajs)
        if not valid:
            return None
        batch = TurnBatch.from_trajectories(valid)
        chains.refuse_critic_chains(self.critic, valid)
        if self.critic is not None:
            values, last = self.critic.values(valid, batch.max_turns)
            batch = batch.replace(values=values, bootstrap_values=last)
        shaping: dict[str, float] = {}
        if self.shaper is not None:
            batch, shaping = self.shaper(valid, batch)
        credit = self.estimator(batch)
        return Assigned(valid, batch,
                        dataclasses.replace(credit, stats={**credit.stats, **shaping}), dropped)

    def advantages(self, trajs: Sequence[Trajectory]) -> tuple[list[Trajectory], np.ndarray,
                                                               dict[str, float]]:
        """Per-turn advantages of the valid trajectories kept after the zero-advantage filter."""
        a = self.assign(trajs)
        if a is None:
            return [], np.zeros((0, 0)), {"learn/invalid_samples_dropped": float(len(trajs))}
        return filter_rows(a, self.config.drop_zero_variance)

    def save_state(self, checkpoint_dir: Any) -> None:
        """Write what the learner keeps beside the policy (the critic) into `checkpoint_dir`."""
        if self.critic is not None:
            self.critic.save(checkpoint_dir)
        if hasattr(self.shaper, "save"):
            self.shaper.save(checkpoint_dir)

    def load_state(self, checkpoint_dir: Any) -> bool:
        """Restore the critic and the step scorer saved with `checkpoint_dir`; False if neither was
        there."""
        shaper = bool(hasattr(self.shaper, "load") and self.shaper.load(checkpoint_dir))
        critic = bool(self.critic is not None and self.critic.load(checkpoint_dir))
        return critic or shaper

    def update(self, trajs: Sequence[Trajectory], version: int | None = None,
               credit: Credited | None = None) -> dict[str, float]:
        """One policy update on `trajs` (all of one or more complete groups); returns learn/*
        metrics.

        Reads as the update it is: the credited rows (`taurl.train.credit_step`: the recipe's
        RL step computes them, so its credit step is visible) become padded rows; each epoch
        takes their logprobs, their loss and its gradient per micro-batch, then one optimizer
        step; then the metrics.

        version: the policy version being trained (the learner's), for the batch's staleness
        (``learn/staleness_{mean,p95,max}``, `taurl.data.staleness`); None takes the newest
        version in the batch, which is the learner's in the synchronous pipeline.
        credit: `credit_step(self, trajs)`, when the caller already ran it; None runs it here.
        """
        t0, _ = time.perf_counter(), cuda_peak_mb(self.numerics.device, reset=True)
        version, credit, stats = self._begin(trajs, version, credit)
        if credit.skip:  # a critic warm-up update, or nothing to learn from
            return {**stats, "learn/learn_s": time.perf_counter() - t0}
        batch = self._rows(credit.kept, credit.advantages)                     # rows
        ref = self._reference_logprobs(batch.rows)
        self.model.eval()  # no dropout noise in the ratio (module docstring); gradients still flow
        sums: dict[str, float] = {}
        drift: list[Mismatch] = []  # learner vs behaviour logprobs before the first step
        # π_prox is the policy before this update's first optimizer step, and the steps come
        # after a whole epoch of micro-batches: so epoch 0's forward IS π_prox — its logprobs,
        # detached, are kept as they are computed (no extra forward over the batch)
        prox: list[torch.Tensor] | None = [] if self.numerics.objective == "decoupled_ppo" else None
        for epoch in range(self.config.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for j, r in enumerate(batch.rows):
                with self.numerics.autocast(), checkpointed_eval(self.model):            # logprobs
                    lp, ent = action_logprobs(self.model, r, self.config.temperature,
                                              with_entropy=True,
                                              entropy_grad=self.config.entropy_coef > 0)
                if epoch == 0:
                    drift.append(self._mismatch(lp.detach(), r,
                                                [batch.views[i] for i in batch.chunks[j]], version))
                    if prox is not None:
                        prox.append(lp.detach())
                loss, m = self._loss(lp, ent, r, prox[j] if prox is not None else None,   # loss
                                     None if ref is None else ref[j], batch.denom)
                self.numerics.backward(loss)
                self._accumulate(sums, m, float(loss.detach()),
                                 float(r.mask.sum()) / max(batch.n_tok, 1.0))
            norm, lr = self._step()                                            # step
        self.model.eval()
        stats.update(sums)                                                     # metrics
        stats.update(combine_mismatch(drift).as_stats())
        if self.numerics.tis:  # how much truncated IS corrects (mismatch/tis_*, weight_gap_*)
            stats.update(batch_tis_stats(batch, prox, version, self.config.tis_cap))
        stats.update(cuda_peak_mb(self.numerics.device))  # mem/learn_cuda_peak_mb on a GPU
        return {**stats, **self._batch_metrics(batch, norm, lr, time.perf_counter() - t0)}

    def _begin(self, trajs: Sequence[Trajectory], version: int | None,
               credit: Credited | None) -> tuple[int, Credited, dict[str, float]]:
        """The version trained, the credit (its step run here when none is given) and the
        update's first metrics: the credit's, the staleness, and, when no step follows, the
        idle metrics (entropy and mismatch are still measured)."""
        if version is None:
            version = max((v for t in trajs for v in t.policy_versions), default=0)
        credit = credit_step(self, trajs) if credit is None else credit
        stats = {**credit.stats, **staleness_stats(trajs, version).as_stats()}
        if credit.skip:
            stats.update(self._idle_metrics(drop_invalid(trajs)[0], version))
        return version, credit, stats

    def _rows(self, kept: list[Trajectory], adv: np.ndarray) -> _Batch:
        """`kept` as padded rows (one per token stream: `taurl.train.chains`), in micro-batches."""
        views, adv = chains.split_streams(kept, adv, self.config.segment_weighting)
        chunks, device = (micro_batches(views, self.config.micro_batch_tokens),
                          model_device(self.model))
        keep = chains.with_untrained(self.token_keep)
        rows = [make_rows([views[i] for i in c], adv[c], self.pad_id, device, keep) for c in chunks]
        n_tok = sum(float(r.mask.sum()) for r in rows)
        return _Batch(rows, views, chunks, n_tok,
                      n_tok if self.config.aggregation == "token-mean" else float(len(views)))

    def _reference_logprobs(self, rows: list[Rows]) -> list[torch.Tensor] | None:
        """log π_ref on each micro-batch's action tokens (None without a KL term)."""
        if self.reference is None and not self.reference_is_base:
            return None
        self.model.eval()
        with torch.no_grad(), (base_only(self.model) if self.reference_is_base
                               else contextlib.nullcontext()):
            ref = self.reference if self.reference is not None else self.model
            return [action_logprobs(ref, r, self.config.temperature)[0] for r in rows]

    def _mismatch(self, lp: torch.Tensor, r: Rows, part: list[Trajectory],
                  version: int) -> Mismatch:
        # on-policy rows only: every action sampled by the weights being trained (`version`,
        # the learner's); a stale or replayed row differs by design, and counting it would
        # report staleness as an engine/learner mismatch
        fresh = _fresh_rows(part, version, r.mask)
        return logprob_mismatch(lp, r.behaviour, r.mask * fresh[:, None],
                                clip_low=self.config.eps_low, clip_high=self.config.eps_high)

    def _loss(self, lp: torch.Tensor, ent: torch.Tensor | None, r: Rows, prox: torch.Tensor | None,
              ref: torch.Tensor | None, denom: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective (+ β·KL to the reference, − entropy bonus) of one micro-batch."""
        cfg = self.config
        old = prox if prox is not None else r.behaviour
        extra = {"behaviour_logprobs": r.behaviour} if prox is not None else {}
        loss, m = self.loss_fn(lp, old, r.advantages, r.mask, denominator=denom, **extra)
        if ref is not None:
            kl, km = kl_loss(lp, ref, r.mask, kind=cfg.kl_kind, aggregation=cfg.aggregation,
                             norm_constant=self.norm_constant, denominator=denom)
            loss = loss + cfg.kl_coef * kl
            m.update(km)
        ent = ent if ent is not None else torch.zeros_like(lp)
        m["learn/entropy"] = float((ent.detach() * r.mask).sum() / r.mask.sum().clamp(min=1))
        if cfg.entropy_coef > 0:  # aggregated as the policy term (same denominator and C)
            loss = loss - cfg.entropy_coef * aggregate(ent, r.mask, cfg.aggregation,
                                                       norm_constant=self.norm_constant,
                                                       denominator=denom)
        return loss, m

    def _accumulate(self, sums: dict[str, float], m: dict[str, float], loss: float,
                    weight: float) -> None:
        """Token-weighted means over micro-batches and epochs; a maximum stays the maximum."""
        epochs = self.config.epochs
        for k, v in m.items():
            sums[k] = (max(sums.get(k, v), v) if k.endswith(_MAX_KEYS)
                       else sums.get(k, 0.0) + weight * v / epochs)
        sums["learn/loss"] = sums.get("learn/loss", 0.0) + loss / epochs

    def _step(self) -> tuple[torch.Tensor, float]:
        cfg = self.config
        for wait in self.before_step:
            wait()
        return optimizer_step(self.model, self.optimizer, cfg.lr, cfg.lr_warmup_steps,
                              cfg.grad_clip, self.numerics.scaler)

    def _batch_metrics(self, batch: _Batch, norm: torch.Tensor, lr: float,
                       dt: float) -> dict[str, float]:
        padded = sum(r.attention.numel() for r in batch.rows)
        real = sum(float(r.attention.sum()) for r in batch.rows)
        return {"learn/grad_norm": float(norm), "learn/lr": lr, "learn/action_tokens": batch.n_tok,
                "learn/micro_batches": float(len(batch.rows)),
                "learn/padding_frac": 1.0 - real / max(padded, 1),
                "learn/learn_s": dt, "learn/skipped": 0.0,
                "learn/tokens_per_s": real * self.config.epochs / dt if dt > 0 else 0.0}

    def _idle_metrics(self, trajs: Sequence[Trajectory], version: int) -> dict[str, float]:
        """The per-update metrics of an update that took no step (entropy is still measured)."""
        return idle_metrics(self.model, trajs, version, self.config, self.pad_id,
                            self.numerics.autocast)
