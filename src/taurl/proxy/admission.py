"""Admission control at the proxy: HTTP 429 with Retry-After when a call must wait.

An asynchronous pipeline bounds staleness: no sample may be trained more than η policy
versions after the version that produced it (docs/design.md#versions). Rollouts that start while the
learner is far behind would break the bound, so the schedule refuses to *start* them
until the learner catches up (AReaL, arXiv:2505.24298, caps rollouts in flight this way:
roughly, admit a new one only while ``N_started ≤ (v + η + 1) · B``, v the current
version, B the batch size). The proxy
does not know the schedule; it asks an `Admission` policy before each model call:

    admission(AdmissionRequest) -> None            # admit
                                -> seconds (float) # refuse for now: retry after that long

The real policy comes from the async schedule (its staleness bound and the learner's
progress); this module holds the protocol, the request record and the HTTP form of a
refusal. Tests use fake policies.

Where it is asked (`ProxyServer.call`, `runner.run_agent_episode`):

* ``kind="episode"``: before an episode's first model call. The agent runner asks *before
  it starts the agent* and waits the retry-after itself (counted as
  ``rollout/admission_waits`` and ``rollout/admission_wait_s``), so an agent never sees
  an episode-level refusal; a standalone agent (``taurl proxy``) gets the 429 instead.
* ``kind="call"``: before every later call of an admitted episode (a policy that pauses
  rollouts mid-episode, e.g. while weights load). The agent gets the 429 with the
  headers below; the official `openai` SDK retries 429s by default (``max_retries=2``)
  and waits exactly the header's delay when it is in (0, 120] s (openai-python 3.57,
  ``_base_client._calculate_retry_timeout``; tested). Each 429 is counted
  (``rollout/throttled_calls``); an agent built with ``max_retries=0`` fails its episode
  (one counted agent error, as any agent failure).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

# the most a refusal may ask to wait: the openai SDK ignores Retry-After above 120 s and
# falls back to its own backoff, which would break the schedule's timing silently
MAX_RETRY_AFTER_S = 120.0


@dataclass(frozen=True)
class AdmissionRequest:
    """What the policy is asked about.

    kind: "episode" (the episode's first model call) or "call" (a later one).
    calls: model calls the episode has made so far. policy_version: the engine's version.
    """

    episode_id: str
    kind: str
    calls: int
    policy_version: int


Admission = Callable[[AdmissionRequest], "float | None"]


def checked_delay(seconds: float | None) -> float | None:
    """The policy's answer as a delay in (0, MAX_RETRY_AFTER_S], or None to admit.

    A policy answering 0 or less admits (there is nothing to wait for); above the cap it is
    cut to the cap, so the agent's SDK still honours it.
    """
    if seconds is None:
        return None
    s = float(seconds)
    if not math.isfinite(s):
        return MAX_RETRY_AFTER_S
    return None if s <= 0 else min(s, MAX_RETRY_AFTER_S)


def retry_after_headers(seconds: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds (RFC 9110 §10.2.3 allows only integers, rounded up)
    and ``retry-after-ms`` (what the openai SDK reads first, exact); ``x-should-retry``."""
    return {"Retry-After": str(max(1, math.ceil(seconds))),
            "retry-after-ms": str(round(seconds * 1000)), "x-should-retry": "true"}
