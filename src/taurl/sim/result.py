"""What one simulated schedule measured (definitions: `taurl.sim.simulator`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SimResult:
    schedule: str
    kind: str
    eta: int
    interrupt: bool
    overprovision: float
    stale: str
    updates: int
    seed: int
    sim_time_s: float
    trained_tokens: int
    trained_tokens_per_s: float
    learner_idle_frac: float
    generator_bubble_frac: float
    generator_mean_batch: float  # time-averaged sequences decoding
    staleness_mean: float
    staleness_p95: float
    max_staleness: float
    tokens_wasted: int
    tokens_wasted_frac: float  # of all tokens decoded
    episodes_trained: int
    episodes_dropped: int  # too stale at consumption (async)
    episodes_aborted: int  # over-provisioned and not needed
    length_bias: float
    # sync: share of a batch's generation time after 95% of it finished
    tail_time_share: float | None
    top5_token_share: float  # share of generated tokens in the longest 5% of decided episodes
    speedup_vs_sync: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)
