"""Weight sync of `VLLMEngine`: reload a checkpoint on the server, then verify it serves.

vLLM reload calls are known to keep stale weights silently (CPU 0.32.0 keeps the old
``lm_head`` of tied models), so a reload is checked by a probe (a fixed prompt, T = 1,
fixed seed): ``verify="exact"`` compares its logprobs with a plain fp32 forward of the new
checkpoint, ``verify="change"`` only asks that the answer changed when the weight files did.
`WeightSync` is a mixin of `VLLMEngine`: it uses the client's state (its lock, pause mode,
admin calls, probe settings); the module docstring of `taurl.policy.vllm_engine` has the rules.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from pathlib import Path
from typing import Any

from taurl.errors import EngineError
from taurl.policy.protocol import SamplingParams


class WeightSync:
    """`VLLMEngine._load` and its verification probe."""

    async def _load(self, checkpoint_dir: Path, version: int) -> None:
        from taurl.policy.adapter import serving_dir

        # a LoRA checkpoint holds an adapter: the server reloads its merged copy
        checkpoint_dir = await asyncio.to_thread(serving_dir, checkpoint_dir)
        if not checkpoint_dir.is_dir() or not any(checkpoint_dir.glob("*.safetensors")):
            raise EngineError(f"no *.safetensors weights in {str(checkpoint_dir)!r}; pass a "
                              "checkpoint directory written by save_pretrained (e.g. "
                              "RUN/checkpoints/vN)")
        was_paused = self._paused
        if not was_paused:
            await self.pause("wait")
        if self._in_flight:
            raise EngineError(f"{self._in_flight} request(s) are paused with mode 'keep'; loading "
                              "weights now would mix two policy versions in one completion. "
                              "Pause with 'wait' or 'abort' before a weight update.")
        t0 = time.perf_counter()
        res = await self._admin("POST", "/collective_rpc", {
            "method": "reload_weights", "kwargs": {"weights_path": str(checkpoint_dir.resolve())}})
        if isinstance(res, dict) and any(x is not None for x in res.get("results", [])):
            raise EngineError(f"reload_weights answered {_short(res)}")
        await self._admin("POST", "/reset_prefix_cache")  # no KV of the old weights may serve
        await self._admin("POST", "/update_weight_version", {"new_version": str(version)})
        served = (await self._admin("GET", "/weight_info")).get("weight_version")
        if served != str(version):
            raise EngineError(f"the server records weight version {served!r} after the update to "
                              f"{version}")
        self.stats["reload_s"] += time.perf_counter() - t0
        # the probe runs on the server, which must be resumed; the client still holds its own
        await self._admin("POST", "/resume")
        try:
            t1 = time.perf_counter()
            await self._verify(checkpoint_dir, version)
            self.stats["verify_s"] += time.perf_counter() - t1
        except BaseException:
            await self._admin("POST", f"/pause?mode={self._pause_mode}")
            raise
        self._version = version
        self.stats["reloads"] += 1
        if was_paused:
            await self._admin("POST", f"/pause?mode={self._pause_mode}")
        else:
            with self._lock:
                self._paused, self._pause_mode = False, "wait"

    def _probe_prompt(self) -> list[int]:
        vocab = len(self.tokenizer) if self.tokenizer is not None else 256
        rng = random.Random(1234)
        return [rng.randrange(min(vocab, 256)) for _ in range(8)]

    async def _verify(self, checkpoint_dir: Path, version: int) -> None:
        if self.verify == "none":
            return
        prompt = self._probe_prompt()
        sampling = SamplingParams(temperature=1.0, max_tokens=self.probe_tokens, seed=1234)
        choice, _ = await self._complete(prompt, sampling, ignore_eos=True)
        ids = [int(t) for t in choice.get("token_ids") or []]
        lps = [float(x) for x in (choice.get("logprobs") or {}).get("token_logprobs") or []]
        probe = {"ids": ids, "logprobs": lps}
        prev, self._last_probe = self._last_probe, None
        if self.verify == "exact":
            expected = await asyncio.to_thread(_local_logprobs, checkpoint_dir, prompt, ids)
            err_new = max((abs(a - b) for a, b in zip(lps, expected, strict=True)), default=0.0)
            if err_new > self.probe_atol:
                raise EngineError(_stale(version, checkpoint_dir, "its probe logprobs differ from "
                                                                  "a plain fp32 "
                                         f"forward of the checkpoint by {err_new:.2e} (> "
                                         f"{self.probe_atol:g})"))
            if prev is not None and prev["ids"] == ids and err_new > self.probe_noise:
                # beyond float noise of the new policy, yet nearer the previous one: stale
                err_old = max(abs(a - b) for a, b in zip(lps, prev["logprobs"], strict=True))
                if err_old < err_new:
                    raise EngineError(_stale(version, checkpoint_dir, "its probe is closer to the "
                                                                      "previous "
                                             f"policy's ({err_old:.2e}) than to the new one's "
                                             f"({err_new:.2e})"))
        elif self.verify == "change":
            digest = await asyncio.to_thread(_weights_digest, checkpoint_dir)
            if prev is not None and prev == probe and digest != self._weights_hash:
                raise EngineError(_stale(version, checkpoint_dir, "its probe answer is the "
                                                                  "previous policy's, "
                                         "bit for bit, though the weight files changed"))
            self._weights_hash = digest
        self._last_probe = probe


def _stale(version: int, path: Path, why: str) -> str:
    return (f"the reload to version {version} ({path}) did not take effect: {why}. vLLM can keep "
            "stale weights silently (CPU 0.32.0 keeps the old lm_head of a model with tied "
            "embeddings: train an untied model, tie_word_embeddings=false); restart the server "
            "on the checkpoint")


def _local_logprobs(path: Path, prompt: list[int], ids: list[int]) -> list[float]:
    """log_softmax(logits)[id] of `ids` after `prompt` under the checkpoint, fp32, T = 1."""
    import torch
    from transformers import AutoModelForCausalLM

    from taurl.policy.files import quiet_hf

    with quiet_hf():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
    return lp.gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1).tolist()


def _weights_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()


def _check_same_model(root: str | None, checkpoint_dir: Path, url: str) -> None:
    """Refuse a server whose model is not shaped like the checkpoint (another model)."""
    if not root or not (Path(root) / "config.json").is_file():
        return  # a remote path: the reload and its probe will tell
    keys = ("architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "intermediate_size")
    try:
        a = json.loads((Path(root) / "config.json").read_text())
        b = json.loads((checkpoint_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise EngineError(f"cannot read config.json of {checkpoint_dir} or {root}: {e}") from e
    diff = {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}
    if diff:
        raise EngineError(f"the server at {url} serves another model ({root}) than the checkpoint "
                          f"{checkpoint_dir}: {diff} (served, wanted); start a server on this "
                          "checkpoint")


def _short(body: Any, n: int = 300) -> str:
    text = body if isinstance(body, str) else json.dumps(body)
    return text if len(text) <= n else text[:n] + "…"
