"""Every published benchmark command, with the flags that give it a tiny budget.

`benchmarks/smoke.py` runs this table (`make bench-smoke`) so that no figure in BENCHMARKS.md
loses its command: a command that no longer runs as written fails the tier. Each entry keeps
the command exactly as its page prints it (`published`, continuation lines joined; a test checks
the text is still on that page) and appends only budget flags (`budget`: argparse keeps the last
value of a repeated flag, so `--rl.updates 16 ... --rl.updates 1` runs one update; the budget
spells a flag as the command does: an old flat flag beside its new one is "given twice").
Placeholders a page leaves to the reader (`R`, `S`, `RUN`, `/some/scratch`) are filled by `fill`.

`needs` names the prerequisites (`smoke.PREREQUISITES`): a command whose prerequisite is
missing is skipped with the reason; `provides` marks the commands that make the tiny runs the
later ones read (the smoke tier runs them first, in table order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

BENCH = "BENCHMARKS.md"
SPEED = "docs/experiments/speed.md"
CREDIT = "docs/experiments/long-credit.md"

# one SFT step or two, one RL update of 2 tasks x 2 rollouts, evaluations of 2 tasks x 1 trial
RL_TINY = (
    "--rl.updates",
    "1",
    "--rl.tasks-per-update",
    "2",
    "--rl.group-size",
    "2",
    "--eval.tasks",
    "2",
    "--eval.trials",
    "1",
)
TRAIN_TINY = ("--sft.demos", "32", "--sft.max-steps", "2", *RL_TINY)
# search-v0's copy warm-up (300 steps in configs/demo.yaml)
SEARCH_TINY = (*TRAIN_TINY, "--policy.warmup-options", '{"steps": 2, "batch_size": 8}')
REAL = "~/.cache/taurl/models/smollm2-135m-instruct"
QWEN = "~/.cache/taurl/models/qwen2.5-coder-0.5b-instruct"


@dataclass(frozen=True)
class Command:
    """One published command line and how the smoke tier runs it."""

    published: str
    budget: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    source: str = BENCH
    fill: dict[str, str] = field(default_factory=dict)  # placeholder -> value, in `published`
    provides: str = ""  # the run directory (workspace-relative) this command leaves for others
    note: str = ""


COMMANDS: tuple[Command, ...] = (
    # the tiny runs the later commands read: the demo, the demo's teacher, FrozenLake 8x8's SFT
    Command("taurl demo", SEARCH_TINY, provides="runs/demo"),
    Command(
        "taurl train --config configs/demo.yaml --run-dir runs/demo-teacher",
        SEARCH_TINY,
        provides="runs/demo-teacher",
    ),
    Command(
        "taurl train --config configs/frozenlake8_p09.yaml --rl.updates 1 --seed S "
        "--eval.seed 2026 --run-dir runs/fl8p09_sft6_sS",
        TRAIN_TINY,
        source=CREDIT,
        fill={"_sS": "_s0", "--seed S": "--seed 0"},
        provides="runs/fl8p09_sft6_s0",
    ),
    # Learning: the recipe end to end
    Command("taurl train --config configs/frozenlake.yaml --run-dir runs/frozenlake", TRAIN_TINY),
    Command(
        "taurl train --config configs/code.yaml --run-dir R --no-progress",
        TRAIN_TINY,
        fill={" R ": " runs/code "},
    ),
    Command(
        "taurl train --config configs/openai_agent.yaml --run-dir runs/openai_agent --no-progress",
        SEARCH_TINY,
        needs=("module:openai",),
    ),
    Command(
        "taurl train --config configs/demo.yaml --engine.kind vllm --engine.options "
        '\'{"python": ".venv-vllm/bin/python"}\' --rl.updates 10 --rl.max-seconds 0 '
        "--run-dir runs/vllm10",
        SEARCH_TINY,
        needs=("vllm",),
    ),
    # Learning: estimators, shaping, asynchrony
    Command(
        "cd benchmarks && python long_credit.py --from ../runs/fl8p09_sft6_sS --out "
        '../runs/credit6_sS --estimators grpo gigpo --options \'{"gigpo": {"gamma": 0.8}}\' '
        '--seeds 21 22 23 24 25 26 27 28 --updates 20 --jobs 2 --overrides \'{"all": '
        '{"lr": 0.0003, "eval_temperature": 1.0, "eval_trials": 4}}\'',
        ("--seeds", "21", "--updates", "1", "--jobs", "1"),
        needs=("tiny-run",),
        fill={"_sS": "_s0"},
    ),
    Command(
        "python benchmarks/estimators.py --from runs/demo --out runs/estimators --updates 15 "
        "--override '{\"lr\": 1e-3}'",
        ("--seeds", "0", "--updates", "1", "--estimators", "grpo"),
        needs=("tiny-run",),
    ),
    Command(
        "PYTHONPATH=src .venv/bin/python benchmarks/async_learning.py --from runs/demo --out "
        "/tmp/async_learning --seeds 0 1 2 --updates 16 --jobs 1",
        ("--seeds", "0", "--updates", "1"),
        needs=("tiny-run",),
        fill={"/tmp/": "runs/"},
    ),
    # Speed
    Command(
        ".venv/bin/python benchmarks/rollout.py",
        ("--concurrency", "1", "2", "--episodes-per-slot", "1"),
    ),
    Command(
        ".venv/bin/python benchmarks/credit.py",
        ("--trajectories", "800", "--records", "200", "--repeat", "1"),
    ),
    Command(
        ".venv/bin/python benchmarks/sandbox.py",
        ("--n", "3", "--concurrency", "2", "--per-worker", "1", "--template-files", "2"),
    ),
    Command(
        ".venv/bin/python benchmarks/copy_warmup.py",
        ("--steps", "2", "--every", "1", "--probe", "4", "--demos", "32", "--warmup-steps", "2"),
    ),
    Command(".venv/bin/python benchmarks/threads.py --busy", ("--seconds", "0.3")),
    Command(
        ".venv/bin/python benchmarks/engines.py --vllm-python .venv-vllm/bin/python --sizes tiny "
        "--rounds 2",
        ("--rounds", "1", "--concurrency", "1", "--syncs", "1", "--max-tokens", "8"),
        needs=("vllm",),
    ),
    Command(
        ".venv/bin/python benchmarks/proxy.py --episodes 10", ("--episodes", "1", "--turns", "1")
    ),
    Command(
        "PYTHONPATH=src PEER_DIR=/some/scratch .venv/bin/python benchmarks/vs_trl.py --from "
        "runs/demo --peers ../shared/peers --steps 10 --rounds 2 --loads idle --taurl-settings "
        "1+learn2 async-eta4 async-eta4-finish --trl-settings 2-default",
        ("--steps", "2", "--rounds", "1"),
        needs=("trl", "tiny-run"),
        fill={"/some/scratch": "{PEER_DIR}", "../shared/peers": "{ROOT}/../shared/peers"},
    ),
    Command(
        "PYTHONPATH=src .venv/bin/python benchmarks/async.py --real --updates 8 --etas 4 "
        "--latency-ms 1000 --interrupt interrupt",
        ("--updates", "1", "--latency-ms", "20"),
        needs=("tiny-run",),
    ),
    Command("python benchmarks/async.py --sim", ("--updates", "3")),
    Command(
        "PYTHONPATH=src .venv/bin/python benchmarks/async.py --check",
        ("--updates", "1", "--latency-ms", "20", "--sim-seeds", "1"),
        needs=("tiny-run",),
    ),
    # the rest of the speed page's scripts (docs/experiments/speed.md)
    Command(
        "python benchmarks/grpo_step.py --from runs/demo --steps 4",
        ("--steps", "2"),
        needs=("tiny-run",),
        source=SPEED,
    ),
    Command(
        "python benchmarks/decode_step.py --from runs/demo",
        ("--shapes", "2x10"),
        needs=("tiny-run",),
        source=SPEED,
    ),
    Command(
        "PYTHONPATH=src .venv/bin/python benchmarks/async_step.py --from runs/demo --steps 12 "
        "--eta 1 --overprovision K",
        ("--steps", "2"),
        needs=("tiny-run",),
        source=SPEED,
        fill={" K": " 1"},
    ),
    Command(
        "PYTHONPATH=src .venv/bin/python benchmarks/engine_parts.py sync",
        ("--steps", "1"),
        needs=("tiny-run",),
        source=SPEED,
    ),
    # Robustness
    Command(
        "TAURL_CHAOS_SEED=7 PYTHONPATH=src .venv/bin/python -m pytest -q -s tests/test_chaos.py",
        needs=("slow",),
        note="tests/test_chaos.py is part of `make test`",
    ),
    Command(
        "PYTHONPATH=src .venv/bin/python benchmarks/chaos.py --kills 12 --concurrency 4 "
        "--updates 4 --seed 1",
        ("--kills", "6", "--updates", "1"),  # 6: a kill in each phase at least (choose_points)
    ),
    Command("taurl demo --run-dir /tmp/demo1", SEARCH_TINY, fill={"/tmp/": "runs/"}),
    # Models: LoRA, cost control, dtype (SmolLM2-135M)
    Command(
        f".venv/bin/python benchmarks/lora_costs.py --model {REAL}",
        ("--rows", "1", "--tokens", "4", "--repeats", "1", "--k", "16"),
        needs=("real-model",),
    ),
    Command(
        f".venv/bin/python benchmarks/bf16_fidelity.py --model {REAL} --prompts 8 --tokens 48",
        ("--prompts", "1", "--tokens", "4"),
        needs=("real-model",),
    ),
    Command(
        f".venv/bin/python benchmarks/bf16_fidelity.py --model {REAL} --prompts 4 --tokens 32 "
        "--engine",
        ("--prompts", "1", "--tokens", "4"),
        needs=("real-model",),
    ),
    Command(
        "python3 -m pytest -q -rs tests/train/test_device.py tests/recipe/test_recipe_device.py",
        needs=("cuda",),
    ),
    Command(
        "python3 benchmarks/gpu_learner.py --config DIR_WITH_SMOLLM2_CONFIG_JSON",
        ("--shapes", "2x16"),
        needs=("cuda", "real-model"),
        fill={"DIR_WITH_SMOLLM2_CONFIG_JSON": REAL},
    ),
    # Beyond RL (the teacher run is the second tiny run above; its curves read runs/beyond/grpo)
    Command(
        "python benchmarks/beyond_rl.py --curves grpo,distill --at 5,10,15,16,17,18,19,20,25",
        ("--at", "1"),
        needs=("tiny-run",),
    ),
    # reasoning-gym
    Command(
        "taurl train --config configs/reasoning_gym.yaml --seed S --run-dir runs/rg-S",
        TRAIN_TINY,
        needs=("module:reasoning_gym",),
        fill={"S": "0"},
    ),
    Command(
        "taurl train --config configs/reasoning_gym.yaml --seed S --run-dir runs/rg-S "
        "--rl.updates 60",
        (*TRAIN_TINY, "--rl.updates", "2"),
        needs=("module:reasoning_gym",),
        fill={"S": "0"},
    ),
    # Long horizons
    Command(
        "taurl train --config configs/long_horizon.yaml --run-dir R --seed S",
        TRAIN_TINY,
        fill={" R ": " runs/long_horizon ", "S": "0"},
    ),
    Command(
        "taurl train --config /tmp/none.yaml --run-dir R2 --seed S",
        TRAIN_TINY,
        fill={"/tmp/": "", "R2": "runs/long_horizon_none", "S": "0"},
        note="none.yaml: the page's sed line (compaction policy none), written by the smoke tier",
    ),
    Command(
        "python benchmarks/segment_weighting.py --out benchmarks/figures/segment_weighting.png"
    ),
    # 135M: engines (SmolLM2-135M-Instruct); the demo-real run comes first
    Command(
        "taurl train --config configs/real.yaml --run-dir runs/demo-real",
        (*TRAIN_TINY, "--rl.max-seconds", "0"),
        needs=("real-model",),
        provides="runs/demo-real",
    ),
    Command(
        f".venv/bin/python benchmarks/engine_135m.py --model {REAL} --vllm-python "
        ".venv-vllm/bin/python --concurrency 1 32 --rounds 3",
        ("--concurrency", "1", "--rounds", "1", "--max-tokens", "4"),
        needs=("real-model", "vllm"),
    ),
    Command(
        f".venv/bin/python benchmarks/engine_135m.py --model {REAL} --no-vllm --mkl-baseline "
        "--concurrency 32 --rounds 3",
        ("--concurrency", "2", "--rounds", "1", "--max-tokens", "4"),
        needs=("real-model",),
    ),
    Command(
        f".venv/bin/python benchmarks/learner_limit.py --model {REAL}",
        ("--rows", "1", "--tokens", "16", "--repeats", "1"),
        needs=("real-model",),
    ),
    Command(
        ".venv/bin/python benchmarks/vs_trl_135m.py --sft runs/demo-real/checkpoints/v1 "
        "--trl-python /some/scratch/trl-venv/bin/python --steps 4 --rounds 1",
        ("--steps", "2", "--modes", "lora"),
        needs=("real-model", "trl"),
        fill={"/some/scratch": "{PEER_DIR}"},
    ),
    Command(
        ".venv/bin/python benchmarks/merged_export_check.py --run RUN",
        needs=("real-model",),
        fill={"RUN": "runs/demo-real"},
    ),
    Command(
        ".venv/bin/taurl train --config configs/real.yaml --policy.model "
        "runs/demo-real/checkpoints/v1 --sft.data none --rl.updates 4 "
        "--rl.drop-zero-variance false --eval.tasks 4 --run-dir R --no-progress",
        RL_TINY,
        needs=("real-model",),
        fill={" R ": " runs/mem "},
    ),
    # Reproducibility
    Command(
        "python benchmarks/deterministic.py --model /tmp/demoA/checkpoints/v1 --reps 3",
        ("--reps", "1"),
        needs=("tiny-run",),
        fill={"/tmp/demoA": "runs/demo"},
    ),
    Command("python benchmarks/cpu_reproducibility.py --reps 3", ("--reps", "1")),
    # Several agents
    Command(
        "taurl train --config configs/tictactoe.yaml --run-dir R",
        TRAIN_TINY,
        fill={" R": " runs/tictactoe"},
    ),
    Command(
        "python -m taurl.recipe.selfplay --config configs/tictactoe_selfplay.yaml --run-dir R",
        ("--set", "sft.demos=32", "sft.epochs=1", "rl.updates=1", "rl.tasks_per_update=2",
         "rl.group_size=2", "eval.tasks=2", "eval.trials=1"),
        fill={" R": " runs/tictactoe-selfplay"},
    ),
    # The Tinker API
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tinker_roundtrip.py --steps 30 --reps 3",
        ("--steps", "2", "--reps", "1"),
    ),
    # The distributed learner on a real model (docs/scale-out.md)
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dist_equivalence.py --model " + REAL
        + " --strategy fsdp --updates 3",
        ("--updates", "1", "--groups", "1", "--rows", "2"),
        needs=("real-model",),
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dist_equivalence.py --model " + REAL
        + " --strategy ddp --updates 3",
        ("--updates", "1", "--groups", "1", "--rows", "2"),
        needs=("real-model",),
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dist_equivalence.py --model " + REAL
        + " --floor --updates 3",
        ("--updates", "1", "--groups", "1", "--rows", "2"),
        needs=("real-model",),
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dist_equivalence.py --model " + REAL
        + " --strategy fsdp --updates 3 --dtype float64",
        ("--updates", "1", "--groups", "1", "--rows", "2"),
        needs=("real-model",),
    ),
    Command(
        "taurl train --config configs/real.yaml --rl.updates 1 --eval.tasks 4 --run-dir R",
        (*TRAIN_TINY, "--rl.max-seconds", "0"),
        needs=("real-model",),
        fill={" R": " runs/real-sft"},
    ),
    Command(
        ".venv/bin/python benchmarks/vs_trl_135m.py --sft runs/demo-real/checkpoints/v1 "
        "--trl-python /some/scratch/trl-venv/bin/python --modes full --lean --steps 3 --rounds 2",
        ("--steps", "2", "--rounds", "1"),
        needs=("real-model", "trl"),
        fill={"/some/scratch": "{PEER_DIR}"},
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dist_threads.py --strategy ddp"
        " --updates 10",
        ("--updates", "1"),
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dist_threads.py --strategy fsdp"
        " --updates 10",
        ("--updates", "1"),
    ),
    # Judged rewards: RL from the demo's SFT policy on the judge's reward vs the verifier's
    Command(
        "taurl train --config configs/demo.yaml --policy.model runs/demo/checkpoints/v1 "
        "--sft.data none --rl.updates 20 --run-dir runs/judge-ref --no-progress",
        RL_TINY,
        needs=("tiny-run",),
        provides="runs/judge-ref",
    ),
    Command(
        "taurl train --config configs/search-judged.yaml --policy.model runs/demo/checkpoints/v1 "
        "--sft.data none --rl.updates 20 --run-dir runs/judged --no-progress",
        RL_TINY,
        needs=("tiny-run",),
        provides="runs/judged",
    ),
    Command(
        "python benchmarks/judge_agreement.py --run runs/judged --judge-config "
        "configs/search-judged.yaml --tag final",
        needs=("tiny-run",),
    ),
    Command(
        "python benchmarks/judge_agreement.py --run runs/judge-ref --judge-config "
        "configs/search-judged.yaml --tag final",
        needs=("tiny-run",),
    ),
    Command(
        "python benchmarks/judge_agreement.py --run runs/judged --judge-config "
        "configs/search-judged.yaml --tag final --lm " + REAL + " --limit 60",
        ("--limit", "2"),
        needs=("tiny-run", "real-model"),
    ),
    Command(
        ".venv/bin/python benchmarks/gpu_check.py --dry --out runs/gpu_check.json",
        ("--skip", "cuda_tests", "vllm"),
    ),
    Command(  # engine: vllm inside Ray; the budget: the colocated test left out
        "TAURL_VLLM_PYTHON=.venv-vllm/bin/python PYTHONPATH=src .venv/bin/python -m pytest -q -s "
        "-m vllm tests/test_vllm_ray.py",
        ("-k", "own_node"),
        needs=("vllm",),
    ),
    # the demo at 2 learner ranks and in bf16-mixed; the scale model (docs/scale-out.md)
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/taurl demo --config configs/demo-2ranks.yaml"
        " --run-dir runs/demo-2ranks --no-progress",
        SEARCH_TINY,
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/taurl demo --config configs/demo-bf16.yaml"
        " --run-dir runs/demo-bf16 --no-progress",
        SEARCH_TINY,
        provides="runs/demo-bf16",
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/taurl demo --config configs/demo.yaml --policy.model"
        " runs/demo-bf16/checkpoints/v1 --sft.data none --rl.updates 4 --eval.tasks 2"
        " --eval.trials 1 --train.precision bf16-mixed --run-dir runs/rl-bf16 --no-progress",
        ("--rl.updates", "1"),
        needs=("tiny-run",),
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dist_threads.py --strategy ddp"
        " --updates 3 --out runs/dist_threads.json",
        ("--updates", "1"),
        provides="runs/dist_threads.json",
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/scale_model.py --check"
        " runs/dist_threads.json",
        ("--gloo-mb", "1"),
        needs=("tiny-run",),
    ),
    Command(
        "OMP_NUM_THREADS=1 .venv/bin/taurl train --config configs/real.yaml --policy.model " + REAL
        + " --sft.data none --rl.updates 2 --rl.drop-zero-variance false --eval.tasks 4"
        " --eval.trials 1 --train.precision bf16-mixed --train.activation-checkpointing true"
        " --train.attention sdpa --run-dir runs/real-mem --no-progress",
        ("--rl.updates", "1", "--eval.tasks", "1"),
        needs=("real-model",),
    ),
    Command(".venv/bin/python benchmarks/scale_model.py"),
    Command(".venv/bin/python benchmarks/scale_model.py --mfu 0.073"),
    # search without a planted habit, and multi-hop search (SmolLM2-135M-Instruct)
    Command(
        "taurl train --config configs/real_search_clean.yaml --run-dir runs/search-clean",
        TRAIN_TINY,
        needs=("real-model",),
    ),
    Command(
        f"taurl eval {REAL} --config configs/real_search_zeroshot.yaml",
        ("--tasks", "2"),
        needs=("real-model",),
    ),
    Command(
        "taurl train --config configs/real_search_multihop.yaml --run-dir runs/search-multihop",
        TRAIN_TINY,
        needs=("real-model",),
    ),
    Command(
        f"taurl eval {REAL} --config configs/real_search_multihop_zeroshot.yaml",
        ("--tasks", "2"),
        needs=("real-model",),
    ),
    # laptop baselines and 0.5B speed (docs/baselines.md, Qwen2.5-Coder-0.5B-Instruct)
    Command(
        f"taurl eval {REAL} --config configs/real_code_zeroshot.yaml",
        ("--tasks", "2"),
        needs=("real-model",),
    ),
    Command(
        f"taurl eval {REAL} --config configs/real_rgym_zeroshot.yaml",
        ("--tasks", "2"),
        needs=("real-model",),
    ),
    *(
        Command(f"taurl eval {QWEN} --config configs/{name}.yaml", ("--tasks", "2"),
                needs=("qwen-model",))
        for name in ("real_code_zeroshot", "real_rgym_zeroshot", "real_search_zeroshot",
                     "real_search_multihop_zeroshot")
    ),
    Command(
        f".venv/bin/python benchmarks/engine_135m.py --model {QWEN} --vllm-python "
        ".venv-vllm/bin/python --concurrency 1 32 --rounds 2 --threads 2",
        ("--concurrency", "1", "--rounds", "1", "--max-tokens", "4"),
        needs=("qwen-model", "vllm"),
    ),
    Command(
        f".venv/bin/python benchmarks/learner_limit.py --model {QWEN} --repeats 2",
        ("--rows", "1", "--tokens", "16", "--repeats", "1"),
        needs=("qwen-model",),
    ),
    Command(
        f"taurl train --config configs/real_search_clean.yaml --policy.model {QWEN} "
        "--sft.demos 96 --sft.warmup-steps 2 --rl.updates 1 --rl.max-seconds 0 --eval.tasks 8 "
        "--run-dir runs/qwen-search-sft",
        ("--sft.demos", "16", "--sft.max-steps", "1", "--eval.tasks", "1"),
        needs=("qwen-model",),
        provides="runs/qwen-search-sft",
    ),
    Command(
        ".venv/bin/python benchmarks/vs_trl_135m.py --sft runs/qwen-search-sft/checkpoints/v1 "
        "--trl-python /some/scratch/trl-venv/bin/python --steps 2 --rounds 2",
        ("--rounds", "1", "--modes", "lora"),
        needs=("qwen-model", "trl"),
        fill={"/some/scratch": "{PEER_DIR}"},
    ),
)
