"""Write the supervised run's data: chat conversations, one JSON object a line, in the
format tinker-cookbook's `FromConversationFileBuilder` reads (`{"messages": [...]}`).

The task is two-number addition answered in one fixed sentence ("17 + 25 = 42."). The base
model rarely answers in exactly that form, so the SFT loss has room to fall, and every
answer is checkable. Deterministic: the same seed writes the same file.

    python make_sft_jsonl.py --out data/sft.jsonl --n 64
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def conversation(a: int, b: int) -> dict[str, list[dict[str, str]]]:
    """One user question and the assistant's one-sentence answer."""
    return {"messages": [
        {"role": "user", "content": f"What is {a} + {b}? Answer in one short sentence."},
        {"role": "assistant", "content": f"{a} + {b} = {a + b}."},
    ]}


def conversations(n: int, seed: int = 0) -> list[dict[str, list[dict[str, str]]]]:
    rng = random.Random(seed)
    return [conversation(rng.randint(1, 50), rng.randint(1, 50)) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/sft.jsonl")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for convo in conversations(args.n, args.seed):
            f.write(json.dumps(convo) + "\n")
    print(f"wrote {args.n} conversations to {out}")


if __name__ == "__main__":
    main()
