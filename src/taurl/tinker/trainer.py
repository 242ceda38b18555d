"""A training client's state: a LoRA adapter on a base model, its optimizer, its counters.

`forward_backward` runs each datum through the adapted model, takes the learner's logprobs
of its target tokens (`taurl.train.token_logprobs.gathered_logprobs`, the learner's own
fp32 computation) and, unless forward-only, back-propagates the loss (`taurl.tinker.losses`)
so that gradients accumulate until `optim_step`. `optim_step` is AdamW with the step's
`AdamParams` (decoupled weight decay, optional global-norm clipping), then clears the
gradients. The adapter is taurl's LoRA (`taurl.train.lora.attach`, peft): B starts at zero,
so a fresh client computes exactly its base model.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from taurl.tinker.losses import LOSSES, datum_loss
from taurl.tinker.models import BaseModel, RequestError
from taurl.tinker.wire import FwdBwdRequest, WireDatum

FLOAT_INPUTS = ("weights", "logprobs", "advantages")


@dataclass(frozen=True)
class LoraSpec:
    """A ``LoraConfig`` of the SDK (alpha is this service's choice: 32, taurl's default)."""

    rank: int
    seed: int = 0
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True
    alpha: float = 32.0


def lora_targets(model: torch.nn.Module, spec: LoraSpec) -> list[str]:
    """Module names to adapt: attention and/or MLP linear layers, and/or the output layer."""
    out_layer = model.get_output_embeddings()
    names: set[str] = set()
    for path, module in model.named_modules():
        if not (isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"):
            continue
        leaf = path.rsplit(".", 1)[-1]
        if module is out_layer:
            if spec.train_unembed:
                names.add(leaf)
        elif any(k in path for k in ("attn", "attention")):
            if spec.train_attn:
                names.add(leaf)
        elif spec.train_mlp:
            names.add(leaf)
    if not names:
        raise RequestError("the LoRA config adapts no layer of this model; enable train_mlp, "
                           "train_attn or train_unembed")
    return sorted(names)


def datum_problems(d: WireDatum, loss_fn: str, vocab: int, max_context: int) -> list[str]:
    """Why datum `d` cannot be used with `loss_fn` (empty: it can)."""
    spec = LOSSES[loss_fn]
    n = len(d.tokens)
    out = []
    if d.images:
        out.append("model_input has image or audio chunks; this server serves text models only")
    if n == 0:
        out.append("model_input is empty")
    elif min(d.tokens) < 0 or max(d.tokens) >= vocab:
        out.append(f"model_input has token ids outside the vocabulary [0, {vocab})")
    if n > max_context:
        out.append(f"model_input has {n} tokens; the model's context is {max_context}")
    if missing := [k for k in spec.required if k not in d.inputs]:
        out.append(f"loss_fn_inputs lacks {missing}, which {loss_fn} requires "
                   f"(it reads {list(spec.required + spec.optional)})")
    for key in spec.required + spec.optional:
        arr = d.inputs.get(key)
        if arr is None:
            continue
        if arr.shape[:1] != (n,):
            out.append(f"loss_fn_inputs[{key!r}] has shape {list(arr.shape)}; it must have "
                       f"one row per model_input token ({n})")
        elif arr.ndim > 2 or (arr.ndim == 2 and loss_fn != "cross_entropy"):
            out.append(f"loss_fn_inputs[{key!r}] has shape {list(arr.shape)}; {loss_fn} takes "
                       "(N,) tensors")
        elif key == "target_tokens" and arr.size and (arr.min() < 0 or arr.max() >= vocab):
            out.append(f"target_tokens has ids outside the vocabulary [0, {vocab})")
        elif key in FLOAT_INPUTS and not np.isfinite(arr).all():
            out.append(f"loss_fn_inputs[{key!r}] has NaN or infinite values")
    tt, w = d.inputs.get("target_tokens"), d.inputs.get("weights")
    if tt is not None and w is not None and tt.shape != w.shape:
        out.append(f"weights has shape {list(w.shape)}, target_tokens {list(tt.shape)}; "
                   "they must match")
    return out


class TrainingModel:
    """One training client's model (``model_id``): the adapted model and its optimizer."""

    def __init__(self, model_id: str, base: BaseModel, lora: LoraSpec):
        from taurl.train.lora import LoraOptions, attach

        self.model_id, self.base, self.lora = model_id, base, lora
        plain = copy.deepcopy(base.model)
        options = LoraOptions(rank=lora.rank, alpha=lora.alpha, dropout=0.0,
                              targets=tuple(lora_targets(plain, lora)))
        self.model = attach(plain, options, seed=lora.seed).eval()  # eval: no dropout anywhere
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, weight_decay=0.0)
        self.steps = 0  # optimizer steps taken (the weights' version)
        self.requests = 0  # training requests accepted (load_state must be the first)

    # -- the checks made when a request arrives ------------------------------------------
    def check_forward_backward(self, req: FwdBwdRequest) -> None:
        if req.loss_fn not in LOSSES:
            hint = (" (forward_backward_custom runs its loss on the client over cross_entropy)"
                    if req.loss_fn == "custom" else "")
            raise RequestError(f"loss_fn {req.loss_fn!r} is not supported by this server; it "
                               f"supports {sorted(LOSSES)}{hint}")
        if unknown := sorted(set(req.loss_fn_config) - set(LOSSES[req.loss_fn].config)):
            raise RequestError(f"loss_fn_config keys {unknown} are not used by {req.loss_fn} "
                               f"(it takes {list(LOSSES[req.loss_fn].config)})")
        if text := sorted(k for k, v in req.loss_fn_config.items() if isinstance(v, str)):
            raise RequestError(f"loss_fn_config {text} must be numbers")
        if not req.data:
            raise RequestError("forward_backward got no data")
        for i, d in enumerate(req.data):
            if problems := datum_problems(d, req.loss_fn, self.base.vocab_size,
                                          self.base.max_context):
                raise RequestError(f"data[{i}]: " + "; ".join(problems))

    # -- compute (on the service's compute thread) ------------------------------------------
    def forward_backward(self, req: FwdBwdRequest) -> tuple[list[dict[str, np.ndarray]],
                                                             dict[str, float]]:
        from taurl.train.token_logprobs import gathered_logprobs

        outputs, total = [], 0.0
        device = next(self.model.parameters()).device
        for d in req.data:
            ids = torch.tensor([d.tokens], dtype=torch.long, device=device)
            inputs = {k: torch.tensor(np.array(v), device=device) for k, v in d.inputs.items()}
            targets = inputs["target_tokens"].long()
            with torch.set_grad_enabled(not req.forward_only):
                logits = self.model(input_ids=ids).logits[0]
                if targets.ndim == 2:  # top-K cross-entropy: K targets per position
                    lp = torch.log_softmax(logits.float(), -1).gather(-1, targets)
                else:
                    lp, _ = gathered_logprobs(logits, targets)
                floats = {k: v.float() for k, v in inputs.items() if k in FLOAT_INPUTS}
                loss = datum_loss(req.loss_fn, lp, floats, req.loss_fn_config)
                if not req.forward_only:
                    loss.backward()
            outputs.append({"logprobs": lp.detach().float().cpu().numpy()})
            total += float(loss.detach())
        return outputs, {"loss:sum": total}

    def optim_step(self, params: Any) -> dict[str, float]:
        """One AdamW step with the SDK's ``AdamParams`` (lr, betas, eps, weight decay, clip)."""
        for group in self.optimizer.param_groups:
            group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2),
                         eps=params.eps, weight_decay=params.weight_decay)
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                           for g in grads]))) if grads else 0.0
        if params.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, params.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": norm, "learning_rate:mean": params.learning_rate}

    # -- checkpoints ------------------------------------------------------------------
    def save(self, directory: Path, *, optimizer: bool, meta: dict[str, Any]) -> None:
        """The adapter (peft's files), its LoRA spec and, for training state, the optimizer."""
        # the base's output layer is frozen: only its adapter is saved (peft would otherwise
        # save the whole layer of an adapted lm_head)
        self.model.save_pretrained(str(directory), save_embedding_layers=False)
        if optimizer:
            torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")
        record = {"base_model": self.base.name, "lora": asdict(self.lora), "steps": self.steps,
                  "model_id": self.model_id, **meta}
        (directory / "tinker.json").write_text(json.dumps(record, indent=2, sort_keys=True))

    def load(self, directory: Path, *, optimizer: bool) -> None:
        """The adapter weights (and optionally the optimizer state) saved at `directory`."""
        load_adapter(self.model, directory)
        if optimizer:
            if not (directory / "optimizer.pt").is_file():
                raise RequestError(f"{directory.name} holds no optimizer state (a sampler "
                                   "checkpoint?); load it without the optimizer")
            self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt",
                                                      weights_only=True))
        self.steps = int(checkpoint_meta(directory).get("steps", 0))


def checkpoint_meta(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "tinker.json").read_text())


def load_adapter(model: Any, directory: Path) -> None:
    """Set `model`'s adapter weights to those saved at `directory` (same LoRA shape)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(str(directory /
                                                           "adapter_model.safetensors")))
    if getattr(result, "unexpected_keys", None):
        raise RequestError(f"the checkpoint's adapter does not fit this model: unexpected "
                           f"{result.unexpected_keys[:3]}")


def sampler_model(base: BaseModel, directory: Path) -> Any:
    """A plain model serving `base` with the adapter saved at `directory` merged in."""
    from taurl.train.lora import LoraOptions, attach

    meta = checkpoint_meta(directory)
    spec = LoraSpec(**meta["lora"])
    plain = copy.deepcopy(base.model)
    options = LoraOptions(rank=spec.rank, alpha=spec.alpha, dropout=0.0,
                          targets=tuple(lora_targets(plain, spec)))
    model = attach(plain, options, seed=spec.seed)
    load_adapter(model, directory)
    return model.merge_and_unload().eval()
