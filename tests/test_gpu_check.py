"""benchmarks/gpu_check.py --dry: the GPU check's code path on CPU with a tiny config, so the
prepared check does not fail on a GPU machine for a reason a CPU would have shown.

The recipe runs with the distributed learner at world size 1 (fsdp, gloo here, nccl there) and
takes its SFT and RL steps on the rank; the learner step reports the rank's tokens/s and peak
memory. The CUDA tests and vLLM steps are skipped here (the first only finds skipped tests on
a CPU machine, the second needs vLLM): the check runs them where CUDA is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_check imports its sibling dist_equivalence
_spec = importlib.util.spec_from_file_location("bench_gpu_check", ROOT / "benchmarks/gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def test_the_peak_is_the_cards_dense_bf16_figure_and_mfu_counts_6_n_per_token():
    assert gpu_check.peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_check.peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_check.peak_bf16_flops("NVIDIA H200") == 989e12
    assert gpu_check.peak_bf16_flops("Tesla T4") is None
    assert gpu_check.mfu(494_000_000, 100_000, 989e12) == pytest.approx(6 * 494e6 * 1e5 / 989e12)
    assert gpu_check.mfu(10, 10.0, None) is None
    # Qwen2.5-0.5B's shape: 494M parameters with tied embeddings (its model card's 0.49B)
    cfg = gpu_check.QWEN2_05B
    h, layers, inter, vocab = (cfg["hidden_size"], cfg["num_hidden_layers"],
                               cfg["intermediate_size"], cfg["vocab_size"])
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    # q and o, k and v, their biases, the MLP, 2 norms
    per_layer = h * h * 2 + h * kv * 2 + h + kv * 2 + 3 * h * inter + 2 * h
    assert vocab * h + layers * per_layer + h == 494_032_768


@pytest.mark.slow
def test_the_dry_check_runs_the_recipe_and_the_learner_on_one_rank(tmp_path):
    out = tmp_path / "check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--dry",
                          "--skip", "cuda_tests", "vllm", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["dry"] and got["device"] == "cpu" and "cuda_tests" not in got
    assert not [k for k, v in got.items() if isinstance(v, dict) and "error" in v], got
    recipe = got["recipe"]
    assert recipe["updates"] == 2 and recipe["sft_steps"] >= 1
    assert [r["learn/ranks"] for r in recipe["rl"]] == [1.0, 1.0]
    assert [r["learn/skipped"] for r in recipe["rl"]] == [0.0, 0.0]  # the steps were taken
    (shape,) = got["learner"]["shapes"]
    assert shape["rows"] == 4 and shape["width"] == 32 and shape["skipped"] == 0
    assert shape["tokens_per_s"] > 0 and shape["mfu"] is None  # no peak known for a CPU
    assert got["learner"]["params"] == got["params"] and got["learner"]["peak_gib"] == 0.0
    (plain,) = got["plain"]["rows"]  # benchmarks/gpu_learner.py's step on the same model
    assert plain["params"] == got["params"] and plain["dtype"] == "bfloat16"
    assert plain["rows"] == 4 and plain["trained_tok_s"] > 0
