"""The critic for GAE: a value head on a causal-LM backbone, and the clipped value loss.

    ℓ_t = ½ max( (V_t − R_t)², (V_old,t + clip(V_t − V_old,t, −ε, ε) − R_t)² )

(PPO value clipping, as in OpenAI baselines' ppo2 and arXiv 2005.12729, "value function
clipping"; ε = None gives the plain ½ (V − R)².) R are the GAE returns
(`taurl.credit.Credit.returns`, broadcast to the tokens where the values are read).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from taurl.errors import ConfigError
from taurl.train.objectives.aggregation import aggregate, check_aggregation, masked, masked_mean

Metrics = dict[str, float]


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *,
               clip: float | None = 0.2,
               aggregation: str = "token-mean", traj_index: Tensor | None = None,
               norm_constant: float | None = None,
               denominator: float | None = None) -> tuple[Tensor, Metrics]:
    """Clipped value loss over the masked positions (B, L) -> scalar. Returns (loss, metrics)."""
    if clip is not None and not clip > 0:
        raise ConfigError(f"value clip must be > 0 or None, got {clip!r}")
    check_aggregation(aggregation)
    returns = returns.detach().to(values.dtype)
    err = (values - returns) ** 2
    if clip is None:
        per_tok, clipped_frac = 0.5 * err, torch.zeros((), device=err.device)
    else:
        old = old_values.detach().to(values.dtype)
        v_clip = old + torch.clamp(values - old, -clip, clip)
        err_clip = (v_clip - returns) ** 2
        per_tok = 0.5 * torch.maximum(err, err_clip)
        clipped_frac = masked_mean((err_clip > err).float(), mask)
    per_tok = masked(per_tok, mask)
    loss = aggregate(per_tok, mask, aggregation, traj_index=traj_index, norm_constant=norm_constant,
                     denominator=denominator)
    with torch.no_grad():
        m = mask.bool()
        r, v = returns[m], values[m]
        var = r.var(unbiased=False) if r.numel() else torch.zeros((), device=r.device)
        ev = (1.0 - (r - v).var(unbiased=False) / var if r.numel() and var > 0
              else torch.zeros((), device=r.device))
        metrics = {"learn/vf_loss": float(loss.detach()), "learn/vf_clip_frac": float(clipped_frac),
                   "learn/vf_explained_var": float(ev)}
    return loss, metrics


class ValueModel(nn.Module):
    """V(s) for every position of a token stream: a linear head on a causal LM's last hidden state.

    `lm` is any Hugging Face causal LM (e.g. ``Qwen2ForCausalLM``); its decoder
    (``lm.base_model``) is used without the LM head, so no vocabulary logits are computed.
    Use a copy of the policy for a separate critic, or share the backbone for a value head.
    The head starts at zero, so initial values are 0.
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.backbone = getattr(lm, "base_model", lm)
        hidden = lm.config.hidden_size
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, L) ids -> (B, L) values; position t is V of the state after reading tokens ≤ t."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)
