"""The learned step scorer of `step_scorer: implicit_prm`: an implicit PRM trained online.

    per update, on the batch's valid episodes (iStar, arXiv 2509.19199, Alg. 1):
      pairs  = preference_pairs(outcome scores, groups)           success vs failure of one task
      φ      ← φ − lr ∇ DPO(φ; pairs, ref = π_old)                 `steps` AdamW steps,
                                                                   trajectory DPO
      q_t    = β Σ_{tokens of turn t} log π_φ − log π_old          the implicit step reward
      p_t    = centre(clip(w q_t, ±c))
               (`taurl.credit.prm.episode_neutral_shaping`)
      batch.process_rewards = p                                    the outcome is left untouched

φ is a copy of the policy (class and weights) when the learner is built — the SFT policy at
the first update — with its own optimizer. π_old, the reference of both the DPO loss and
the step reward, is the behaviour policy whose logprobs each episode recorded, as in iStar
(the rollout policy snapshot), so no third model is kept. The DPO loss is
`taurl.train.objectives.dpo.dpo_loss` over action tokens only.

φ is trained *before* it scores the batch it was trained on (iStar's order: the PRM is
updated on fresh rollouts, then gives their step rewards). A batch without a success and a
failure in some group has no pair: φ is not stepped and still scores.

Everything it produces is shaping only: ``process_rewards`` (per turn, summing to 0 per
episode), ``learn/prm_*`` metrics, and one line per scored episode in ``shaping.jsonl`` of
the run directory (episode id, outcome score, per-turn shaping and step rewards; an update
redone after a crash appends its lines again, and a replayed episode is scored again in
each update that trains on it). The ledger's rewards are never changed. φ's weights are saved in
``checkpoints/v<N>/prm/`` and restored on resume (its optimizer state is not kept: a resumed φ
restarts its AdamW moments).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from taurl.credit.batch import TurnBatch
from taurl.credit.filters import preference_pairs
from taurl.credit.prm import episode_neutral_shaping, implicit_step_rewards
from taurl.credit.tokens import padded_token_turn_index, turn_sums
from taurl.data.trajectory import Trajectory
from taurl.errors import ConfigError
from taurl.train.objectives.dpo import dpo_loss
from taurl.train.weights import load_weights, save_weights

PRM_DIR = "prm"
WEIGHTS_FILE = "prm.safetensors"
STEP_SCORERS = ("none", "implicit_prm")


@dataclass(frozen=True)
class PRMConfig:
    """Options of `step_scorer: implicit_prm` (the config's ``step_scorer_options``)."""

    weight: float = 0.1  # w: shaping weight of the implicit step reward (the outcome's weight is 1)
    clip: float = 0.1  # c: each turn's weighted step reward is clipped to [−c, c] before centring
    beta: float = 0.1  # β of DPO and of the implicit reward β·log π_φ/π_old
    lr: float = 1e-4  # AdamW learning rate of φ
    steps: int = 1  # DPO steps of φ per policy update
    # preference pairs per group: best_worst | all (taurl.credit.preference_pairs)
    pairs: str = "best_worst"
    label_smoothing: float = 0.0  # cDPO ε
    grad_clip: float = 1.0  # max gradient norm of φ's update

    def problems(self) -> list[str]:
        out = []
        if not (self.weight >= 0 and self.clip > 0 and self.beta > 0 and self.lr > 0):
            out.append("step_scorer_options: weight must be >= 0 and clip, beta, lr > 0 (got "
                       f"weight={self.weight}, clip={self.clip}, beta={self.beta}, lr={self.lr})")
        if not 2 * self.clip < 1.0:
            out.append("step_scorer_options: clip must be < 0.5 so one turn's shaping (|p| <= "
                       f"2·clip) stays below the outcome's weight 1 (got {self.clip})")
        if self.steps < 0:
            out.append(f"step_scorer_options: steps must be >= 0 (got {self.steps})")
        if self.pairs not in ("best_worst", "all"):
            out.append(f"step_scorer_options: pairs must be best_worst or all (got {self.pairs!r})")
        if not 0 <= self.label_smoothing < 0.5:
            out.append("step_scorer_options: label_smoothing must be in [0, 0.5) (got "
                       f"{self.label_smoothing})")
        return out


# estimators that read episode totals only: a shaping that sums to 0 per episode cannot move them
EPISODE_TOTAL_ESTIMATORS = frozenset({"grpo", "dr_grpo", "grpo_batch_std", "rloo", "orm"})


def step_scorer_problems(name: str, options: dict[str, Any], estimator: str = "istar") -> list[str]:
    """Every problem with ``step_scorer`` / ``step_scorer_options``, before any work."""
    if name not in STEP_SCORERS:
        return [f"step_scorer must be one of {', '.join(STEP_SCORERS)} (got {name!r})"]
    if name == "none":
        return ["step_scorer_options are set but step_scorer is none; drop them"] if options else []
    if estimator in EPISODE_TOTAL_ESTIMATORS:
        return [f"step_scorer: {name} has no effect with estimator {estimator} (it compares "
                "episode totals, and the shaping sums to 0 per episode); use estimator istar (GRPO "
                "+ the step term), reinforce_pp_baseline, gigpo, segment_grpo or gae"]
    unknown = sorted(set(options) - set(PRMConfig.__dataclass_fields__))
    if unknown:
        return [f"step_scorer_options: unknown option(s) {unknown}; options: "
                f"{', '.join(PRMConfig.__dataclass_fields__)}"]
    try:
        return PRMConfig(**options).problems()
    except TypeError as e:
        return [f"step_scorer_options: {e}"]


class ImplicitPRM:
    """φ, its optimizer and the shaping it gives; call it as the learner's shaper:
    ``batch, stats = prm(valid_trajs, batch)`` (module docstring). Each call trains φ
    first (its DPO steps), so call it once per policy update."""

    def __init__(self, policy: torch.nn.Module, config: PRMConfig, *, pad_id: int = 0,
                 temperature: float = 1.0,
                 micro_batch_tokens: int = 6144, log_path: str | Path | None = None):
        if problems := config.problems():
            raise ConfigError(problems)
        self.model = copy.deepcopy(policy)
        self.model.requires_grad_(True)
        self.config = config
        self.pad_id = pad_id
        self.temperature = temperature
        self.micro_batch_tokens = micro_batch_tokens
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr)
        self.log_path = Path(log_path) if log_path is not None else None

    # -- the shaper ----------------------------------------------------------------------
    def __call__(self, trajs: Sequence[Trajectory],
                 batch: TurnBatch) -> tuple[TurnBatch, dict[str, float]]:
        cfg = self.config
        stats = self.train(trajs, batch.scores, batch.group)
        q = implicit_step_rewards(self.log_ratios(trajs, batch.max_turns), batch.turn_mask,
                                  beta=cfg.beta)
        shaped, st = episode_neutral_shaping(q, batch.turn_mask, weight=cfg.weight, clip=cfg.clip)
        stats.update(st)
        # how the step reward separates outcomes: mean q of successful minus failed turns
        success = (batch.scores >= 1.0)[:, None] & batch.turn_mask
        failed = (batch.scores <= 0.0)[:, None] & batch.turn_mask
        if success.any() and failed.any():
            stats["learn/prm_step_reward_gap"] = float(q[success].mean() - q[failed].mean())
        self._log(trajs, batch, shaped, q)
        return batch.replace(process_rewards=shaped), stats

    # -- φ -------------------------------------------------------------------------------
    def _rows_logprobs(self, trajs: Sequence[Trajectory],
                       grad: bool) -> list[tuple[list[int], Any, Any]]:
        from taurl.train.rows import action_logprobs, make_rows, micro_batches, model_device

        device = model_device(self.model)
        out = []
        for c in micro_batches(trajs, self.micro_batch_tokens):
            part = [trajs[i] for i in c]
            rows = make_rows(part, np.zeros((len(part), max(1, *(len(t.turns) for t in part)))),
                             self.pad_id, device)
            with torch.set_grad_enabled(grad):
                lp, _ = action_logprobs(self.model, rows, self.temperature)
            out.append((c, lp, rows))
        return out

    @torch.no_grad()
    def log_ratios(self, trajs: Sequence[Trajectory], max_turns: int) -> np.ndarray:
        """(N, T) Σ over each turn's action tokens of log π_φ − log π_old (0 on padding)."""
        self.model.eval()
        out = np.zeros((len(trajs), max_turns))
        for c, lp, rows in self._rows_logprobs(trajs, grad=False):
            diff = ((lp - rows.behaviour) * rows.mask).double().cpu().numpy()  # (B, L)
            idx = padded_token_turn_index([trajs[i] for i in c], diff.shape[1])
            out[c] = turn_sums(diff, idx, max_turns)
        return out

    def train(self, trajs: Sequence[Trajectory], scores: np.ndarray,
              group: np.ndarray) -> dict[str, float]:
        """`steps` trajectory-DPO steps on the within-group pairs of `trajs`; learn/prm_*
        metrics."""
        cfg = self.config
        chosen, rejected, pst = preference_pairs(scores, group, mode=cfg.pairs)
        stats = {"learn/prm_pairs": pst["learn/dpo_pairs"], "learn/prm_steps": 0.0}
        if chosen.size == 0 or cfg.steps == 0:
            return stats
        self.model.eval()  # no dropout noise in a log-ratio (as the learner's ratio)
        c_trajs, r_trajs = [trajs[i] for i in chosen], [trajs[i] for i in rejected]
        sums: dict[str, float] = {}
        for _ in range(cfg.steps):
            self.optimizer.zero_grad(set_to_none=True)
            # one forward per side; both sides' rows are padded to their own width
            lp_c, rows_c = self._side(c_trajs)
            lp_r, rows_r = self._side(r_trajs)
            loss, m = dpo_loss(lp_c, rows_c.behaviour, rows_c.mask, lp_r, rows_r.behaviour,
                               rows_r.mask, beta=cfg.beta, label_smoothing=cfg.label_smoothing)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.optimizer.step()
            for k, v in m.items():
                sums[k.replace("learn/dpo_", "learn/prm_dpo_")] = v
        self.model.eval()
        return {**stats, **sums, "learn/prm_steps": float(cfg.steps)}

    def _side(self, trajs: list[Trajectory]) -> tuple[torch.Tensor, Any]:
        from taurl.train.rows import action_logprobs, make_rows, model_device

        rows = make_rows(trajs, np.zeros((len(trajs), max(len(t.turns) for t in trajs))),
                         self.pad_id, model_device(self.model))
        lp, _ = action_logprobs(self.model, rows, self.temperature)
        return lp, rows

    # -- records and checkpoints ---------------------------------------------------------
    def _log(self, trajs: Sequence[Trajectory], batch: TurnBatch, shaped: np.ndarray,
             q: np.ndarray) -> None:
        if self.log_path is None:
            return
        with self.log_path.open("a") as f:
            for i, t in enumerate(trajs):
                n = len(t.turns)
                f.write(json.dumps({"episode_id": t.episode_id, "score": float(batch.scores[i]),
                                    "shaping": [round(float(x), 6) for x in shaped[i, :n]],
                                    "step_reward": [round(float(x), 6) for x in q[i, :n]]}) + "\n")

    def save(self, checkpoint_dir: str | Path) -> Path:
        d = Path(checkpoint_dir) / PRM_DIR
        d.mkdir(parents=True, exist_ok=True)
        save_weights(self.model, d / WEIGHTS_FILE)
        (d / "prm.json").write_text(json.dumps({"scorer": "implicit_prm", **self.config.__dict__},
                                               indent=1))
        return d

    def load(self, checkpoint_dir: str | Path) -> bool:
        d = Path(checkpoint_dir) / PRM_DIR
        if not (d / WEIGHTS_FILE).exists():
            return False
        load_weights(self.model, d / WEIGHTS_FILE, f"the step scorer in {d}")
        return True


def step_scorer(cfg: Any, model: Any, tok: Any, log_path: Path) -> ImplicitPRM | None:
    """The learned step scorer a run config's `step_scorer` names, or None; shaping only."""
    if cfg.step_scorer == "none":
        return None
    return ImplicitPRM(model, PRMConfig(**cfg.step_scorer_options), pad_id=tok.pad_token_id,
                       temperature=cfg.temperature, micro_batch_tokens=cfg.micro_batch_tokens,
                       log_path=log_path)
