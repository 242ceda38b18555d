"""The distributed learner: one RL update on N ranks (DDP or FSDP2), the step one rank takes.

    strategy.py  the configured strategy (single | ddp | fsdp) and its checks
    split.py     which rank trains which micro-batch, balanced by tokens (pure)
    metrics.py   the ranks' metrics combined into one rank's (pure)
    group.py     the process group from the environment: gloo on CPU, nccl on CUDA
    wrap.py      the rank's model: DDP replica or FSDP2 shards, gradients summed over ranks;
                 the full weights and AdamW state gathered on rank 0
    rank.py      `RankLearner`: `Learner.update` on the rank's share, global denominator
    wire.py      the driver-rank channel: environment variables, messages, model bytes
    worker.py    a rank's process (``python -m taurl.train.distributed.worker``; torchrun too)
    pool.py      `RankPool`: starts the ranks on this machine (or waits for yours), sends commands
    driver.py    `DistributedLearner`: what the recipe uses in place of `Learner`
    sft.py       SFT steps on the ranks (`ranked_sft_loop`, the recipe's `sft_loop` on N ranks)

docs/scale-out.md ("The distributed learner") has the config, the launchers and what is tested.
"""

from taurl.train.distributed.split import assign_micro_batches, slots
from taurl.train.distributed.strategy import STRATEGIES

__all__ = ["STRATEGIES", "assign_micro_batches", "slots"]
