"""Sessions, the training models and the sampling sessions they own.

A session is what one ``ServiceClient`` opens (``create_session``) and keeps alive with a
heartbeat every 10 s; its training clients are ``<session>:train:<n>`` and its samplers
``<session>:sample:<n>`` (the ids the SDK itself derives for a client created from a
checkpoint). A finished session (``ServiceClient.close``) answers heartbeats with 410, which
stops the SDK's heartbeat loop. Finishing a session releases its training models (each holds
a copy of the base model, so a server that outlives many runs would otherwise grow by one
copy per run); what they saved stays on disk and loads into any later session. Nothing
expires on its own: this is a single-user server on loopback.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from taurl.tinker.models import UnknownId
from taurl.tinker.sampler import SamplerSpec
from taurl.tinker.trainer import TrainingModel


@dataclass
class Session:
    session_id: str
    sdk_version: str
    created: float = field(default_factory=time.time)
    last_heartbeat: float = field(default_factory=time.time)
    finished: str | None = None  # the close status: success | errored | interrupted


class SessionFinished(Exception):
    """A heartbeat for a finished session (answered with HTTP 410)."""


class Registry:
    """Everything the service holds by id (touched on the event loop only)."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, TrainingModel] = {}
        self.samplers: dict[str, SamplerSpec] = {}

    def new_session(self, sdk_version: str) -> Session:
        s = Session(f"s{uuid.uuid4().hex[:12]}", sdk_version)
        self.sessions[s.session_id] = s
        return s

    def session(self, session_id: str) -> Session:
        s = self.sessions.get(session_id)
        if s is None:
            raise UnknownId(f"unknown session {session_id!r}")
        return s

    def heartbeat(self, session_id: str) -> None:
        s = self.session(session_id)
        if s.finished is not None:
            raise SessionFinished(session_id)
        s.last_heartbeat = time.time()

    def finish(self, session_id: str, reason: str) -> None:
        """Mark the session finished (its heartbeats get 410) and release its training
        models. A computation already queued for one keeps its own reference and completes."""
        s = self.session(session_id)
        s.finished = s.finished or reason
        for mid in [m for m in self.models if m.startswith(f"{session_id}:")]:
            del self.models[mid]

    def model(self, model_id: str | None) -> TrainingModel:
        m = self.models.get(model_id or "")
        if m is None:
            raise UnknownId(f"unknown model_id {model_id!r}; create a training client first")
        return m

    def sampler(self, sampler_id: str | None) -> SamplerSpec:
        s = self.samplers.get(sampler_id or "")
        if s is None:
            raise UnknownId(f"unknown sampling session {sampler_id!r}")
        return s


def model_id(session_id: str, seq: int) -> str:
    return f"{session_id}:train:{seq}"


def sampler_id(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"
