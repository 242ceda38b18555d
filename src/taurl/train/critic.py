"""The critic of `estimator: gae`: one value per turn, trained with PPO's clipped value loss.

    V(s_t)   = critic(tokens < start of turn t's action)[-1]        one value per turn (N, T)
    V(s_T)   = critic(all tokens)[-1]                               the state after the last turn
                                                                    (N,)
    A, R     = GAE over turns (`taurl.credit.gae_turns`), bootstrapping V(s_T) only when truncated
    ℓ_vf     = ½ max((V − R)², (V_old + clip(V − V_old, ±ε) − R)²)   (`objectives.value.value_loss`)

Why a *separate* critic (a copy of the policy's backbone class and weights with a linear
value head, `ValueModel`) and not a value head on the policy's own trunk:

* the policy checkpoint stays a plain HF causal LM: the engine serves it and verifies the
  served weights, and a shared trunk would be moved by the value loss too;
* the value gradient (a regression on 0/1 outcomes) and the policy gradient do not fight
  over one set of weights — the usual choice for LLM PPO (InstructGPT, arXiv 2203.02155
  §3.5; "The 37 implementation details of PPO", Huang et al. 2022, §"shared vs separate
  networks"), and cheap at taurl's model sizes;
* its own optimizer and learning rate (`critic_lr`), so the critic can learn faster than
  the policy (values must be meaningful before advantages are).

The critic starts from the SFT policy's weights (its features already read the task) with
a zero head (V = 0 at first, so the first GAE advantages are the discounted returns). It
is saved next to the policy in ``checkpoints/v<N>/critic/`` (weights, optimizer state,
``critic.json``), which a HF loader ignores, and restored from there on resume.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from taurl.credit.tokens import turn_spans
from taurl.data.trajectory import Trajectory
from taurl.train.objectives.value import ValueModel, value_loss
from taurl.train.weights import load_weights, save_weights

CRITIC_DIR = "critic"
WEIGHTS_FILE = "value_model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class CriticConfig:
    """Hyper-parameters of the critic's update (one per policy update)."""

    lr: float = 1e-3  # AdamW learning rate of the critic
    # PPO value clip ε around the values before the update (None: plain MSE)
    vf_clip: float | None = 0.2
    epochs: int = 1  # optimizer steps on each batch
    grad_clip: float = 1.0  # max gradient norm
    micro_batch_tokens: int = 6144  # padded tokens per forward


def value_positions(traj: Trajectory) -> tuple[np.ndarray, int]:
    """(T,) token positions whose value is V(s_t), and the position of V(s_T).

    V(s_t) is read at the last token before turn t's action (``start - 1``: the whole
    history the action was chosen from); V(s_T) at the last token of the stream (the
    history after the last action and whatever the env appended).
    """
    spans = turn_spans(traj)
    return np.maximum(spans[:, 0] - 1, 0), traj.num_tokens - 1


class Critic:
    """A `ValueModel` with its optimizer: `values(trajs)` and `update(trajs, old, returns)`."""

    def __init__(self, model: ValueModel, config: CriticConfig, pad_id: int = 0):
        self.model = model
        self.config = config
        self.pad_id = pad_id
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
        # `update` calls so far (saved with the critic): the learner's warm-up counts them
        self.updates = 0

    @classmethod
    def from_policy(cls, policy: torch.nn.Module, config: CriticConfig, pad_id: int = 0) -> Critic:
        """A critic on a copy of `policy`'s backbone (its class and weights), zero value head."""
        lm = copy.deepcopy(policy)
        lm.requires_grad_(True)
        model = ValueModel(lm).to(next(policy.parameters()).device)
        return cls(model, config, pad_id)

    # -- forward ------------------------------------------------------------------------
    def _forward(self, trajs: Sequence[Trajectory], max_turns: int) -> tuple[Tensor, Tensor]:
        """(N, T) values of the turn states (0 on padding) and (N,) V(s_T), with grad."""
        device = next(self.model.parameters()).device
        width = max(t.num_tokens for t in trajs)
        ids = torch.full((len(trajs), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(trajs), width), dtype=torch.long)
        pos = torch.zeros((len(trajs), max_turns), dtype=torch.long)
        last = torch.zeros(len(trajs), dtype=torch.long)
        for i, t in enumerate(trajs):
            ids[i, : t.num_tokens] = torch.tensor(t.token_ids)
            attn[i, : t.num_tokens] = 1
            p, last[i] = value_positions(t)
            pos[i, : len(p)] = torch.from_numpy(p)
        v = self.model(ids.to(device), attention_mask=attn.to(device))  # (N, L)
        return v.gather(1, pos.to(device)), v.gather(1, last.to(device)[:, None]).squeeze(1)

    def _chunks(self, trajs: Sequence[Trajectory]) -> list[list[int]]:
        from taurl.train.rows import micro_batches  # the learner's length buckets

        return micro_batches(trajs, self.config.micro_batch_tokens)

    @torch.no_grad()
    def values(self, trajs: Sequence[Trajectory], max_turns: int) -> tuple[np.ndarray, np.ndarray]:
        """(N, T) V(s_t) (0 past each row's turns) and (N,) V(s_T), float64, no grad."""
        self.model.eval()
        out = np.zeros((len(trajs), max_turns))
        last = np.zeros(len(trajs))
        for c in self._chunks(trajs):
            v, vl = self._forward([trajs[i] for i in c], max_turns)
            n = np.array([len(trajs[i].turns) for i in c])
            mask = np.arange(max_turns)[None, :] < n[:, None]
            out[c] = np.where(mask, v.double().cpu().numpy(), 0.0)
            last[c] = vl.double().cpu().numpy()
        return out, last

    def update(self, trajs: Sequence[Trajectory], old_values: np.ndarray,
               returns: np.ndarray) -> dict[str, float]:
        """`epochs` AdamW steps on the clipped value loss over every real turn; learn/vf_* metrics.

        old_values, returns: (N, T) as `values` and `Credit.returns` give them. The loss is the
        mean over all real turns of the batch (the global turn count divides every micro-batch).
        """
        cfg = self.config
        chunks = self._chunks(trajs)
        t_max = old_values.shape[1]
        n_turns = float(sum(len(t.turns) for t in trajs))
        self.model.eval()  # as the policy: no dropout noise in a regression target's prediction
        sums: dict[str, float] = {}
        norm = torch.zeros(())
        for _ in range(cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for c in chunks:
                v, _ = self._forward([trajs[i] for i in c], t_max)
                n = torch.tensor([len(trajs[i].turns) for i in c], device=v.device)
                mask = (torch.arange(t_max, device=v.device)[None, :] < n[:, None]).float()
                old = torch.as_tensor(old_values[c], dtype=v.dtype, device=v.device)
                ret = torch.as_tensor(returns[c], dtype=v.dtype, device=v.device)
                loss, m = value_loss(v, old, ret, mask, clip=cfg.vf_clip,
                                     denominator=max(n_turns, 1.0))
                loss.backward()
                w = float(mask.sum()) / max(n_turns, 1.0)
                for k, val in m.items():  # vf_loss is already a share of the global mean
                    sums[k] = sums.get(k, 0.0) + (val if k == "learn/vf_loss"
                                                  else w * val) / cfg.epochs
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            self.optimizer.step()
        self.model.eval()
        self.updates += 1
        return {**sums, "learn/vf_grad_norm": float(norm)}

    # -- checkpoint ---------------------------------------------------------------------
    def save(self, checkpoint_dir: str | Path) -> Path:
        """Write the critic into ``checkpoint_dir/critic/`` (weights, optimizer, critic.json)."""
        d = Path(checkpoint_dir) / CRITIC_DIR
        d.mkdir(parents=True, exist_ok=True)
        save_weights(self.model, d / WEIGHTS_FILE)
        torch.save(self.optimizer.state_dict(), d / OPTIMIZER_FILE)
        (d / "critic.json").write_text(json.dumps({
            "backbone": type(self.model.backbone).__name__,
            "hidden_size": self.model.head.in_features,
            "lr": self.config.lr, "vf_clip": self.config.vf_clip, "updates": self.updates},
                                                  indent=1))
        return d

    def load(self, checkpoint_dir: str | Path) -> bool:
        """Restore weights (and the optimizer state, if kept) from ``checkpoint_dir/critic/``; False
        if none."""
        d = Path(checkpoint_dir) / CRITIC_DIR
        if not (d / WEIGHTS_FILE).exists():
            return False
        load_weights(self.model, d / WEIGHTS_FILE, f"the critic in {d}")
        if (d / "critic.json").exists():  # older critics did not count their updates
            self.updates = int(json.loads((d / "critic.json").read_text()).get("updates", 0))
        if (d / OPTIMIZER_FILE).exists():
            self.optimizer.load_state_dict(torch.load(d / OPTIMIZER_FILE, weights_only=True,
                                                      map_location="cpu"))
        return True


def drop_critic_optimizer_state(checkpoint_dir: str | Path) -> None:
    """Delete the critic's optimizer state of an older checkpoint (its weights stay)."""
    (Path(checkpoint_dir) / CRITIC_DIR / OPTIMIZER_FILE).unlink(missing_ok=True)
