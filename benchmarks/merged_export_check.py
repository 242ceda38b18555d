"""A run's final policy exported merged (`taurl export --merged`), loaded by plain transformers,
scores the tokens the run sampled with that policy as they were recorded.

Works on any run (LoRA or full fine-tuning): the newest checkpoint is exported to a plain HF
directory, ``AutoModelForCausalLM.from_pretrained`` loads it, and every episode in the ledger
sampled wholly by that version (the final evaluations' episodes) is rescored with one forward at
the temperature it was sampled at; the largest |Δ log π| over their action tokens is printed.
`tests/train/test_lora.py` checks the same on a tiny model at 1e-4; this runs it on a real one:

    .venv/bin/python benchmarks/merged_export_check.py --run runs/real-lora
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--run", required=True, help="a finished run directory")
    ap.add_argument("--out", default="", help="where to export (default: a temporary directory)")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from taurl.data.ledger import Ledger
    from taurl.policy.export import export_merged
    from taurl.policy.logprobs import sequence_logprobs

    run = Path(a.run)
    summary = json.loads((run / "summary.json").read_text())
    version = summary["train"]["policy_version"]
    temperature = summary["config"]["eval_temperature"]
    out = Path(a.out or tempfile.mkdtemp(prefix="taurl-merged-")) / "final"
    export_merged(run, out)
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    with Ledger(run / "ledger.sqlite") as ledger:
        sampled = [
            t for t in ledger.query(min_version=version) if set(t.policy_versions) == {version}
        ]
    if not sampled:
        raise SystemExit(f"no episode sampled wholly by v{version} in {run}/ledger.sqlite")
    worst, tokens = 0.0, 0
    with torch.no_grad():
        for t in sampled:
            mask = torch.tensor(t.action_mask, dtype=torch.bool)
            got = sequence_logprobs(plain, t.token_ids, temperature=temperature)[mask]
            worst = max(worst, float((got - torch.tensor(t.logprobs)[mask]).abs().max()))
            tokens += int(mask.sum())
    print(
        json.dumps(
            {
                "run": str(run),
                "version": version,
                "lora": bool(summary["config"].get("lora")),
                "episodes": len(sampled),
                "action_tokens": tokens,
                "max_abs_logprob_diff": worst,
                "export": str(out),
            }
        )
    )


if __name__ == "__main__":
    main()
