"""The schedules the simulator compares, as one typed record each.

* ``sync`` — generate a batch on version v, train it (the generator waits), sync, repeat.
  Staleness 0; the generator idles through the learner step and the batch's long tail.
* ``one_step`` — one-step-ahead (batch-synchronous overlap): the generator produces batch
  k+1 on version ≥ k while the learner trains batch k; the new weights are loaded at a batch
  boundary. Staleness ≤ 1; the long tail of each batch still stalls the generator.
* ``async`` — bounded asynchrony with staleness bound η (AReaL, arXiv 2505.24298 §5):
  groups are admitted whenever AReaL's capacity allows,

      capacity = min(max_concurrent − running, (η + v + 1)·B − (accepted + running)),

  v the version new tokens start on, B the batch in episodes, accepted the finished
  episodes kept so far (a dropped one frees its place: without that the learner could
  starve); the learner takes the first complete groups and drops, counted, any group
  whose oldest token is more than η versions behind it. At a version change the in-flight
  actions either finish on the old weights first (``interrupt: False``: the generator
  drains — no new turn starts — then syncs) or are interrupted (``interrupt: True``: sync
  now, re-prefill the interrupted contexts, continue on the new weights). With
  ``stale: mask`` nothing is dropped: the tokens older than η are masked from the loss
  (counted as wasted) and the rest of the episode is trained — the partial-rollout option
  of issue 11; every token's version is tracked (a segment splits where the version changes).
  With ``max_batch`` = k > 0, at most k sequences decode at once and the other ready turns
  wait, the oldest group first — the real engine's ``max_batch_size`` with the async
  schedule's priorities (`taurl.policy.engine`: SamplingParams.priority is the group
  index); an episode's first token, and so its age, is counted from when it decodes.
* ``overprovision`` — ``sync`` that starts ⌈(1 + overprovision)·groups⌉ groups and trains
  on the first complete ones; the rest are aborted (tokens counted as wasted).
"""

from __future__ import annotations

from dataclasses import dataclass

from taurl.credit.registry import did_you_mean
from taurl.errors import ConfigError

KINDS = ("sync", "one_step", "async", "overprovision")


@dataclass(frozen=True)
class Schedule:
    kind: str = "sync"  # sync | one_step | async | overprovision
    eta: int = 0  # staleness bound η of async (sync and overprovision: 0, one_step: 1)
    interrupt: bool = False  # async: interrupt in-flight actions at a version change
    # overprovision: extra groups started, as a share of the batch's groups
    overprovision: float = 0.0
    # async: a group with tokens older than η is dropped, or ("mask") those tokens are masked
    stale: str = "drop"
    # async: sequences decoding at once (0: no cap); the rest wait, oldest group first
    max_batch: int = 0

    @property
    def bound(self) -> int:
        """The staleness no trained episode may exceed under this schedule."""
        return {"sync": 0, "overprovision": 0, "one_step": 1}.get(self.kind, self.eta)

    @property
    def label(self) -> str:
        if self.kind == "async":
            return (f"async(eta={self.eta}{',interrupt' if self.interrupt else ''}"
                    f"{',mask' if self.stale == 'mask' else ''}"
                    f"{f',cap={self.max_batch}' if self.max_batch else ''})")
        if self.kind == "overprovision":
            return f"overprovision(+{self.overprovision:g})"
        return self.kind

    def problems(self) -> list[str]:
        out = []
        if self.kind not in KINDS:
            out.append(f"schedule kind {self.kind!r} is "
                       f"unknown.{did_you_mean(self.kind, list(KINDS))} One of: {', '.join(KINDS)}")
        if isinstance(self.eta, bool) or not isinstance(self.eta, int) or self.eta < 0:
            out.append(f"schedule eta must be an integer >= 0, got {self.eta!r}")
        elif self.kind in ("sync", "overprovision") and self.eta != 0:
            out.append(f"schedule {self.kind} is on-policy: eta must be 0 (use async for eta > 0)")
        if not isinstance(self.overprovision, (int, float)) or self.overprovision < 0:
            out.append(f"schedule overprovision must be >= 0, got {self.overprovision!r}")
        elif self.overprovision and self.kind != "overprovision":
            out.append("overprovision applies to kind overprovision only")
        if self.interrupt and self.kind != "async":
            out.append("interrupt applies to kind async only")
        if isinstance(self.max_batch, bool) or not isinstance(self.max_batch,
                                                              int) or self.max_batch < 0:
            out.append("schedule max_batch must be an integer >= 0 (0: no cap), got "
                       f"{self.max_batch!r}")
        elif self.max_batch and self.kind != "async":
            out.append("max_batch applies to kind async only")
        if self.stale not in ("drop", "mask"):
            out.append(f"schedule stale must be drop or mask, got {self.stale!r}")
        elif self.stale == "mask" and self.kind != "async":
            out.append("stale: mask applies to kind async only")
        return out

    def check(self) -> Schedule:
        if problems := self.problems():
            raise ConfigError(problems)
        return self


def standard_schedules(eta: int = 4, overprovision: float = 0.25,
                       max_batch: int = 0) -> list[Schedule]:
    """The comparison of issue 11: sync, one-step-ahead, async at η with/without interruption,
    over-provisioning; with `max_batch` > 0 (the real pipeline's default: one batch of sequences)
    also async at 1 and η with interruption and that row cap."""
    capped = ([Schedule("async", eta=1, interrupt=True, max_batch=max_batch),
               Schedule("async", eta=eta, interrupt=True, max_batch=max_batch)] if max_batch
              else [])
    return [Schedule("sync"), Schedule("one_step"), Schedule("async", eta=1),
            Schedule("async", eta=1, interrupt=True),
            Schedule("async", eta=eta), Schedule("async", eta=eta, interrupt=True),
            Schedule("async", eta=eta, interrupt=True, stale="mask"), *capped,
            Schedule("overprovision", overprovision=overprovision)]
