"""Rescore a finished run's RL action segments with the checkpoint of the version that sampled each.

Every action segment records its policy version and behaviour logprobs (T = the run's
temperature). This recomputes log_softmax(logits / T)[id] of each segment's ids under
RUN/checkpoints/v<version> (fp32, CPU) and prints one JSON object: how many RL episodes and
action segments there are (by version), how many actions a weight swap split into pieces of
two versions (partial rollouts), how many segments could be rescored (a run keeps only some
checkpoints) and the largest |recorded - recomputed| logprob. For `engine: vllm` it checks
that the server's logprobs were those of the version the ledger says, piece by piece:

    .venv/bin/python benchmarks/rescore_run.py RUN_DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from taurl.data.ledger import Ledger
from taurl.data.runs import RunDir
from taurl.policy import load_policy
from taurl.policy.logprobs import sequence_logprobs


def rescore(run_dir: Path, temperature: float) -> dict:
    run, models = RunDir(run_dir), {}

    def model(v: int):
        path = run_dir / "checkpoints" / f"v{v}"
        if v not in models:
            models[v] = load_policy(path)[0].eval() if path.is_dir() else None
        return models[v]

    out = {
        "rl_episodes": 0,
        "action_segments": 0,
        "by_version": {},
        "split_actions": 0,
        "rescored": 0,
        "max_abs_diff": 0.0,
    }
    with Ledger(run.ledger) as ledger:
        for eid in ledger.episode_ids():
            tr = ledger.get(eid)
            if tr.split != "train":  # evaluation episodes are not trained on
                continue
            out["rl_episodes"] += 1
            ids, pos = tr.token_ids, 0
            for s in tr.segments:
                if s.kind == "action" and s.token_ids:
                    out["action_segments"] += 1
                    out["by_version"][s.policy_version] = (
                        out["by_version"].get(s.policy_version, 0) + 1
                    )
                    if (m := model(s.policy_version)) is not None:
                        lp = sequence_logprobs(m, ids[:pos + len(s.token_ids)], temperature)[pos:]
                        diff = float((lp - torch.tensor(s.logprobs)).abs().max())
                        out["rescored"] += 1
                        out["max_abs_diff"] = max(out["max_abs_diff"], diff)
                pos += len(s.token_ids)
            out["split_actions"] += sum(
                t.action_segment + 1 < len(tr.segments)
                and tr.segments[t.action_segment + 1].kind == "action"
                for t in tr.turns
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--temperature", type=float, default=1.0, help="the run's sampling temperature")
    a = ap.parse_args()
    print(json.dumps(rescore(a.run_dir, a.temperature)))


if __name__ == "__main__":
    main()
