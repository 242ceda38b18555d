"""tinker-cookbook's `rl.train`, unmodified, on the countries task (countries_rl.py), against
`taurl serve-tinker`. Only configuration: base URL, model name (a local directory), renderer,
budgets and paths.

    python train_rl.py --base-url http://127.0.0.1:8765 \
        --model ~/.cache/taurl/models/smollm2-135m-instruct --log-path runs/cookbook_rl
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from countries_rl import CountriesDatasetBuilder
from tinker_cookbook.rl import train


def config(args: argparse.Namespace) -> train.Config:
    model = str(Path(args.model).expanduser())
    builder = CountriesDatasetBuilder(
        model_name=model, renderer_name=args.renderer, batch_size=args.batch_size,
        group_size=args.group_size, n_batches=args.steps, seed=args.seed)
    return train.Config(
        log_path=args.log_path, model_name=model, recipe_name="taurl_rl_example",
        renderer_name=args.renderer, base_url=args.base_url, dataset_builder=builder,
        learning_rate=args.lr, max_tokens=args.max_tokens, lora_rank=args.rank,
        temperature=args.temperature, eval_every=0, save_every=0, num_groups_to_log=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765")
    parser.add_argument("--model", default="~/.cache/taurl/models/smollm2-135m-instruct")
    parser.add_argument("--renderer", default="qwen3_instruct")  # ChatML, as SmolLM2 uses
    parser.add_argument("--log-path", default="runs/cookbook_rl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4, help="groups (questions) a step")
    parser.add_argument("--group-size", type=int, default=4, help="samples per question")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(train.main(config(parser.parse_args())))


if __name__ == "__main__":
    main()
