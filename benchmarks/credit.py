"""Time the advantage estimators on a large synthetic batch.

    python benchmarks/credit.py                  # 100,000 trajectories x 10 turns
    python benchmarks/credit.py --estimators grpo gigpo salt --repeat 5

The batch is random but shaped like real data: groups of `--group-size` trajectories with
1..T turns, binary outcomes, and states drawn from a small per-position vocabulary so that
GiGPO's anchor groups and the graph's shared nodes actually form. Building the batch is
not timed; each estimator's best-of-`--repeat` wall time is printed with its target.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from taurl.credit import TurnBatch, broadcast_to_tokens, compute_advantages, padded_token_turn_index
from taurl.data.trajectory import Segment, StopReason, Trajectory, Turn

TARGETS_S = {"grpo": 1.0, "gigpo": 5.0}  # the targets, on the 2-core dev machine


def synthetic_batch(n: int, turns: int, group_size: int, states: int, seed: int) -> TurnBatch:
    rng = np.random.default_rng(seed)
    num_turns = rng.integers(1, turns + 1, size=n)
    mask = np.arange(turns)[None, :] < num_turns[:, None]
    # a state depends on the position and a small random choice: trajectories of a group meet
    state = rng.integers(0, states, size=(n, turns)) + 1000 * np.arange(turns)[None, :]
    action = rng.integers(0, states, size=(n, turns))
    return TurnBatch.build(
        rewards=(rng.random(n) < 0.4).astype(np.float64),
        group=np.arange(n) // group_size,
        turn_mask=mask,
        state_hash=state,
        action_hash=action,
    )


def synthetic_records(n: int, turns: int, group_size: int, seed: int) -> list[Trajectory]:
    """`n` trajectory records of `turns` turns: 64-token actions, 128-token observations."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        segs, ts = [Segment("prompt", tuple(range(200)))], []
        for k in range(turns):
            segs.append(Segment("action", tuple(range(64)), (-1.0,) * 64, 0))
            segs.append(Segment("observation", tuple(range(128))))
            ts.append(
                Turn(
                    k, f"search {rng.integers(4)}", {"kind": "search"},
                    f"results {rng.integers(4)}", len(segs) - 2, len(segs) - 1, "stop",
                    env_reward=float(k == turns - 1),
                )
            )
        out.append(
            Trajectory(
                f"e{i}", "r", f"t{i // group_size}", f"t{i // group_size}", "train", "bench", "0",
                0, tuple(segs), tuple(ts), ({"role": "user", "content": "task"},), True, False,
                StopReason.ANSWERED, reward=1.0,
            )
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument(
        "--trajectories", type=int, default=100_000, help="trajectories in the batch (N)"
    )
    p.add_argument("--turns", type=int, default=10, help="most turns per trajectory (T)")
    p.add_argument("--group-size", type=int, default=8, help="trajectories per group")
    p.add_argument("--states", type=int, default=4, help="distinct states per turn position")
    p.add_argument("--repeat", type=int, default=3, help="runs per estimator; the best is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--estimators",
        nargs="+",
        default=["grpo", "gigpo", "rloo", "reinforce_pp", "salt"],
        help="registered estimator names to time",
    )
    p.add_argument(
        "--records",
        type=int,
        default=10_000,
        help="also time TurnBatch.from_trajectories and the token broadcast on this "
        "many records (0: skip)",
    )
    args = p.parse_args(argv)

    batch = synthetic_batch(args.trajectories, args.turns, args.group_size, args.states, args.seed)
    print(f"batch: {batch.num_trajectories} trajectories, {int(batch.turn_mask.sum())} turns, "
          f"{batch.num_groups} groups")
    for name in args.estimators:
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            compute_advantages(batch, name)
            best = min(best, time.perf_counter() - t0)
        target = TARGETS_S.get(name)
        verdict = (
            ""
            if target is None
            else f"  (target < {target:g} s: {'ok' if best < target else 'MISSED'})"
        )
        print(f"{name:>22}: {best:.3f} s{verdict}")
    if args.records:
        trajs = synthetic_records(args.records, args.turns, args.group_size, args.seed)
        t0 = time.perf_counter()
        batch = TurnBatch.from_trajectories(trajs)
        t1 = time.perf_counter()
        tok = broadcast_to_tokens(
            compute_advantages(batch, "grpo").advantages, padded_token_turn_index(trajs)
        )
        t2 = time.perf_counter()
        print(f"{'from_trajectories':>22}: {t1 - t0:.3f} s for {len(trajs)} records")
        print(f"{'grpo + token broadcast':>22}: {t2 - t1:.3f} s for {tok.size:,} token slots")


if __name__ == "__main__":
    main()
