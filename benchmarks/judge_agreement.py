"""How often a judge agrees with the env's verifier on a run's held-out episodes.

    python benchmarks/judge_agreement.py --run runs/judged --judge-config configs/search-judged.yaml
    python benchmarks/judge_agreement.py --run runs/judged \
        --judge-config configs/search-judged.yaml \
        --lm ~/.cache/taurl/models/smollm2-135m-instruct --limit 60

Reads the run's holdout episodes of one evaluation (``--tag``: final or sft) from its ledger
and scores each record afresh with the judge of ``--judge-config``'s ``reward:`` and with the
env's registered verifier (neither reads the stored reward): prints the agreement rate, its
task-clustered 95% interval, Cohen's κ and the confusion counts as JSON
(`taurl.reward.judged.Agreement`). Any run works, a verifier-trained one too.

``--lm MODEL`` replaces the judge by a local chat model judging with a rubric
(`taurl.reward.judge.RubricJudge`: the delimited prompt, the task with its reference answers
shown): its verdict is the more likely of ``SCORE: 0`` and ``SCORE: 10`` after the prompt
(one forward pass, greedy, no sampling: a constrained choice between the two verdicts the
rubric allows), parsed by the strict parser like any reply. ``--limit`` caps the episodes
(a 135M model on a loaded CPU takes seconds per prompt).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from taurl import envs
from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.recipe.config import TrainConfig
from taurl.recipe.validate import load_config
from taurl.reward.judged import build_judge, episode_agreement

RUBRIC = ("Award 10 if the response's final answer names the same thing as the reference "
          "answer, else 0.")


class ChoiceBackend:
    """A local HF chat model whose reply is the more likely of ``SCORE: 0`` / ``SCORE: 10``."""

    def __init__(self, path: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.name = torch, Path(path).name
        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path).eval()
        ten, zero = self.tok.encode("SCORE: 10"), self.tok.encode("SCORE: 0")
        n = next(i for i, (a, b) in enumerate(zip(ten, zero, strict=False)) if a != b)
        self.prefix_ids, self.ten_id, self.zero_id = ten[:n], ten[n], zero[n]

    def complete(self, prompt: str) -> str:
        ids = self.tok.apply_chat_template([{"role": "user", "content": prompt}],
                                           add_generation_prompt=True, tokenize=True)
        ids = list(getattr(ids, "input_ids", ids)) + self.prefix_ids
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([ids])).logits[0, -1]
        ten = bool(logits[self.ten_id] > logits[self.zero_id])
        return f"SCORE: {10 if ten else 0}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a run directory (its ledger and config)")
    ap.add_argument("--judge-config", required=True, help="a config whose reward: is a judge")
    ap.add_argument("--tag", default="final", help="the evaluation: final | sft")
    ap.add_argument("--lm", default="", help="judge with this local chat model instead")
    ap.add_argument("--limit", type=int, default=0, help="at most this many episodes (0: all)")
    a = ap.parse_args()
    run = RunDir(Path(a.run))
    reward = load_config(TrainConfig, path=a.judge_config).reward
    if not reward.get("kind") == "judge":
        raise SystemExit(f"{a.judge_config} has no reward.kind: judge")
    if a.lm:
        from taurl.reward.judge import Rubric, RubricJudge
        from taurl.reward.judged import ShownReference

        judge = ShownReference(RubricJudge(Rubric(RUBRIC), ChoiceBackend(str(Path(a.lm)
                                                                              .expanduser()))))
    else:
        judge = build_judge(reward)
    with Ledger(run.ledger) as ledger:
        held = [t for t in ledger.query(split="holdout")
                if t.episode_id.startswith(f"eval-holdout-{a.tag}-")]
    if a.limit:
        held = held[:a.limit]
    if not held:
        raise SystemExit(f"no eval-holdout-{a.tag}-* episodes in {run.ledger}")
    verifier = envs.spec(held[0].env_name).make_verifier()
    t0 = time.perf_counter()
    result = episode_agreement(held, judge, verifier, float(reward.get("pass_at", 0.8)))
    out = {"run": str(a.run), "tag": a.tag, "judge": judge.version,
           "verifier": getattr(verifier, "name", type(verifier).__name__),
           **dataclasses.asdict(result), "judge_stats": dict(judge.stats),
           "seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
