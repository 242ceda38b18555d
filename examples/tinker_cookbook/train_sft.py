"""tinker-cookbook's `supervised.train`, unmodified, on a JSONL of conversations, against
`taurl serve-tinker`. Only configuration: the base URL, the model name (a local directory,
so the cookbook's `get_tokenizer` loads it without the network), the renderer and paths.

    python train_sft.py --base-url http://127.0.0.1:8765 \
        --model ~/.cache/taurl/models/smollm2-135m-instruct --data data/sft.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig


def config(args: argparse.Namespace) -> train.Config:
    model = str(Path(args.model).expanduser())
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model, renderer_name=args.renderer,
        max_length=256, batch_size=args.batch_size)
    return train.Config(
        log_path=args.log_path, model_name=model, recipe_name="taurl_sft_example",
        renderer_name=args.renderer, base_url=args.base_url,
        dataset_builder=FromConversationFileBuilder(file_path=args.data, common_config=common,
                                                    shuffle_seed=args.seed),
        learning_rate=args.lr, num_epochs=args.epochs, lora_rank=args.rank,
        save_every=0, eval_every=0, infrequent_eval_every=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8765")
    parser.add_argument("--model", default="~/.cache/taurl/models/smollm2-135m-instruct")
    parser.add_argument("--renderer", default="qwen3_instruct")  # ChatML, as SmolLM2 uses
    parser.add_argument("--data", default="data/sft.jsonl")
    parser.add_argument("--log-path", default="runs/cookbook_sft")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0, help="the data's shuffle seed")
    asyncio.run(train.main(config(parser.parse_args())))


if __name__ == "__main__":
    main()
