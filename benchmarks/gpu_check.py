"""One prepared GPU check of the distributed learner, the CUDA tests and the vLLM engine.

Runs from the repository tree alone (nothing downloaded, no model files): the policy is a
random-init Qwen2 at Qwen2.5-0.5B's shape, written as a config dict and saved with a byte-level
BPE tokenizer taurl trains on the repository's docs. Four steps, each recorded in one JSON:

  cuda_tests  the suite's CUDA variants (``pytest -k cuda``: they skip where CUDA is absent)
  recipe      `taurl.recipe.loop.train` with ``train: {strategy: fsdp, world_size: 1}`` (nccl on
              CUDA): a few SFT steps and 2 GRPO updates of search-v0, bf16 weights
  learner     the distributed learner's update at world size 1 on synthetic batches: trained
              tokens/s as the rank measures it, model FLOPs utilisation
              (6 x params x tokens / s / the card's dense bf16 peak) and the rank's peak memory
              (torch.cuda.max_memory_allocated)
  plain       benchmarks/gpu_learner.py's step on the same model (one process, one micro-batch
              of the learner step's size): the step without ranks, for comparison
  vllm        tests/test_vllm_engine.py's vllm tests with this Python, if ``import vllm`` works

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json     # one H100/H200: ~5 minutes
    python benchmarks/gpu_check.py --dry --out /tmp/gpu_check.json  # CPU, tiny model, seconds

``--dry`` runs the same code path on CPU (gloo) with a tiny config: what `make test` checks
(tests/test_gpu_check.py), so the GPU run does not fail on a typo.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from dist_equivalence import trajectory  # noqa: E402  (this folder, put on sys.path above)

# Qwen2.5-0.5B's shape (its config.json), random init: 494M parameters, tied embeddings
QWEN2_05B = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
             "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True,
             "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}
TINY = {**QWEN2_05B, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1024,
        "max_position_embeddings": 2048}

# padded tokens per forward/backward pass of the learner step (rl.micro_batch_tokens)
MICRO_TOKENS = 8192

# dense bf16 tensor-core peak, FLOP/s (NVIDIA's data sheets, without sparsity)
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12))


def peak_bf16_flops(device_name: str) -> float | None:
    """The card's dense bf16 peak from its name (the first entry it contains); None if unknown."""
    return next((peak for key, peak in PEAK_BF16 if key in device_name), None)


def mfu(params: int, tokens_per_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: 6 N T / t / peak (forward 2N, backward 4N FLOPs per token;
    Kaplan et al. 2020, PaLM's MFU, Chowdhery et al. 2022 app. B), attention not counted."""
    return 6 * params * tokens_per_s / peak if peak else None


def make_model_dir(path: Path, config: dict[str, Any], tokenizer_vocab: int) -> int:
    """A random-init model of `config` and a tokenizer trained on docs/*.md, saved at `path`
    as an HF directory taurl loads; returns the parameter count."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from taurl.policy.tokenizer import EOS_TOKEN, PAD_TOKEN, build_tokenizer, save_tokenizer

    texts = [line for f in sorted((ROOT / "docs").glob("*.md"))
             for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    tok = build_tokenizer(texts, tokenizer_vocab)
    cfg = AutoConfig.for_model(**config, pad_token_id=tok.convert_tokens_to_ids(PAD_TOKEN),
                               eos_token_id=tok.convert_tokens_to_ids(EOS_TOKEN))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)
    save_tokenizer(tok, path)
    return sum(p.numel() for p in model.parameters())


def cuda_tests(out: Path) -> dict[str, Any]:
    """The CUDA variants of the suite (each file's `CUDA` skipif mark): counts from JUnit XML."""
    files = ["tests/train/test_device.py", "tests/recipe/test_recipe_device.py"]
    xml = out.with_suffix(".cuda_tests.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "cuda",
           f"--junitxml={xml}", *files]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {"command": " ".join(cmd[1:]), "rc": run.returncode, **counts,
            "tail": run.stdout[-1500:]}


def recipe(model_dir: Path, run_dir: Path, device: str, dry: bool) -> dict[str, Any]:
    """The recipe on `device` with the distributed learner at world size 1 (fsdp)."""
    from taurl.recipe.config import TrainConfig
    from taurl.recipe.loop import train

    cfg = TrainConfig(
        model=str(model_dir), env="search-v0", env_config={"top_k": 1, "max_doc_chars": 120},
        task_options={"families": ["city_country"], "split_by": "city"}, system_prompt="",
        demos=8 if dry else 32, sft_epochs=1, sft_batch_size=8, updates=2,
        tasks_per_update=2 if dry else 8, group_size=2 if dry else 8, eval_tasks=2,
        eval_trials=1, max_turns=2, max_action_tokens=8 if dry else 32, max_episode_tokens=512,
        concurrency=8 if dry else 64, lr=1e-5, seed=0, device=device, torch_dtype="bfloat16",
        train_strategy="fsdp", train_world_size=1,
        drop_zero_variance=False)  # a random policy earns equal rewards: still take the steps
    t = time.perf_counter()
    summary = train(cfg, str(run_dir), progress=False)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    sft = [r for r in rows if "sft/loss" in r]
    keys = ("learn/ranks", "learn/loss", "learn/grad_norm", "learn/learn_s", "learn/tokens_per_s",
            "learn/skipped")
    return {"wall_s": round(time.perf_counter() - t, 1), "updates": summary["train"]["updates"],
            "sft_steps": len(sft), "sft_loss_last": sft[-1]["sft/loss"] if sft else None,
            "rl": [{k: r[k] for k in keys if k in r} for r in rl]}


def learner(model_dir: Path, device: str, shapes: list[str], reps: int, peak: float | None
            ) -> dict[str, Any]:
    """`DistributedLearner` (fsdp, world size 1, bf16) on synthetic GRPO batches of each
    shape (rows x tokens: half prompt, half action); the rank's own timing of each update."""
    from transformers import AutoModelForCausalLM

    from taurl.train.distributed.driver import DistributedLearner
    from taurl.train.distributed.pool import start_ranks
    from taurl.train.learner import LearnerConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    params = sum(p.numel() for p in model.parameters())
    probe = copy.deepcopy(model).to(device)  # behaviour logprobs on the device: fast
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"params": params, "shapes": []}
    pool = start_ranks(1, device)
    try:
        for shape in shapes:
            n, w = map(int, shape.split("x"))
            config = LearnerConfig(lr=1e-5, micro_batch_tokens=max(MICRO_TOKENS, w))
            batches = []
            for u in range(reps + 1):  # the first update warms up (allocator, kernels)
                batch = []
                for g in range(n // 4):
                    prompt = torch.randint(16, 1000, (w // 2,), generator=gen).tolist()
                    for j in range(4):
                        action = torch.randint(16, 1000, (w - w // 2,), generator=gen).tolist()
                        batch.append(trajectory(probe, f"{u}-{g}-{j}", prompt, action,
                                                float(j == 0), f"{shape}-{u}-{g}"))
                batches.append(batch)
            dist = DistributedLearner(model, config, strategy="fsdp", world_size=1,
                                      device=device, pool=pool)
            stats = [dist.update(b) for b in batches][1:]
            learn_s = sum(s["learn/learn_s"] for s in stats) / len(stats)
            tok_s = sum(s["learn/tokens_per_s"] for s in stats) / len(stats)
            out["shapes"].append({"rows": n, "width": w, "learn_s": round(learn_s, 4),
                                  "tokens_per_s": round(tok_s), "mfu": mfu(params, tok_s, peak),
                                  "skipped": sum(s["learn/skipped"] for s in stats)})
        out["peak_gib"] = round(max(pool.call("peak_memory")) / 2**30, 2)
    finally:
        pool.close()
    return out


def plain_step(model_dir: Path, device: str, shapes: list[str], peak: float | None
               ) -> dict[str, Any]:
    """benchmarks/gpu_learner.py on the same model in bf16, one process, no ranks: the step
    itself (one micro-batch of each `shapes`), beside which the distributed learner's is read."""
    cmd = [sys.executable, str(ROOT / "benchmarks/gpu_learner.py"), "--config", str(model_dir),
           "--device", device, "--dtypes", "bfloat16", "--shapes", *shapes]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if run.returncode:
        raise RuntimeError(run.stderr[-2000:])
    rows = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    for r in rows:
        r["mfu"] = mfu(r["params"], r["trained_tok_s"], peak)
    return {"command": " ".join(cmd[1:]), "rows": rows}


def vllm_tests() -> dict[str, Any]:
    """tests/test_vllm_engine.py's vllm tests with this Python as the server's, if vLLM imports."""
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "import vllm fails here (not installed)"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "vllm",
           "tests/test_vllm_engine.py"]
    env = {**os.environ, "TAURL_VLLM_PYTHON": sys.executable}
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    return {"command": " ".join(cmd[1:]), "rc": run.returncode, "tail": run.stdout[-1500:]}


def step(results: dict[str, Any], out: Path, name: str, fn: Any, *args: Any) -> None:
    """Run one step; its result, or its traceback, goes into `results` (the others still run),
    and `results` so far into `out` (a run cut by a timeout still leaves what it measured)."""
    t = time.perf_counter()
    try:
        results[name] = fn(*args)
    except Exception:  # noqa: BLE001  (a failed step is a finding; the JSON says which)
        results[name] = {"error": traceback.format_exc()[-3000:]}
    results[name]["step_s"] = round(time.perf_counter() - t, 1)
    print(f"{name}: {json.dumps(results[name])[:400]}", flush=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="CPU, tiny config: the code path only")
    ap.add_argument("--out", type=Path, default=None, help="the JSON (default $OUT/gpu_check.json)")
    ap.add_argument("--shapes", nargs="+", default=None, help="learner batches, rows x tokens")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=("cuda_tests", "recipe", "learner", "plain", "vllm"))
    a = ap.parse_args()
    out = a.out or Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not a.dry and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --dry for the CPU code path")
    device = "cpu" if a.dry else "cuda"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    peak = peak_bf16_flops(name)
    results: dict[str, Any] = {"dry": a.dry, "device": name, "peak_bf16_flops": peak,
                               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    shapes = a.shapes or (["4x32"] if a.dry else ["64x512", "16x2048"])
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        t = time.perf_counter()
        results["params"] = make_model_dir(model_dir, TINY if a.dry else QWEN2_05B, 1024 if a.dry
                                           else 8192)
        results["model_dir_s"] = round(time.perf_counter() - t, 1)
        if "cuda_tests" not in a.skip:
            step(results, out, "cuda_tests", cuda_tests, out)
        if "recipe" not in a.skip:
            step(results, out, "recipe", recipe, model_dir, Path(tmp) / "run", device, a.dry)
        if "learner" not in a.skip:
            reps = 1 if a.dry else 3
            step(results, out, "learner", learner, model_dir, device, shapes, reps, peak)
        if "plain" not in a.skip:
            per_pass = [f"{min(int(n), max(1, MICRO_TOKENS // int(w)))}x{w}"
                        for n, w in (x.split("x") for x in shapes)]
            step(results, out, "plain", plain_step, model_dir, device, per_pass, peak)
        if "vllm" not in a.skip:
            step(results, out, "vllm", vllm_tests)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
