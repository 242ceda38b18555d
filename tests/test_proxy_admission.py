"""Admission control at the proxy (`taurl.proxy.admission`): 429 + Retry-After, the
agent's `openai` SDK honouring it, the runner waiting before it starts an agent.

The admission policies here are fakes (scripted refusals); the real one comes from the
async schedule's staleness bound. The HTTP server, the SDK and the capture are real.
"""

from __future__ import annotations

import asyncio
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

import httpx  # noqa: E402

from taurl.data.trajectory import StopReason, validate_trajectory  # noqa: E402
from taurl.envs.search import generate_tasks  # noqa: E402
from taurl.errors import Error  # noqa: E402
from taurl.policy import build_tokenizer  # noqa: E402
from taurl.proxy import runner  # noqa: E402
from taurl.proxy.admission import (  # noqa: E402
    MAX_RETRY_AFTER_S,
    AdmissionRequest,
    checked_delay,
    retry_after_headers,
)
from taurl.proxy.experts import ReplyEngine  # noqa: E402
from taurl.proxy.runner import AgentConfig, run_agent_episode  # noqa: E402
from taurl.proxy.server import ProxyLimits, ProxyServer  # noqa: E402
from taurl.rollout.episodes import EpisodeSpec  # noqa: E402

TASK = generate_tasks("train", n=1, seed=0)[0]


class Refuse:
    """A fake admission policy: refuse the requests `when` picks, `times` times, for `wait` s."""

    def __init__(self, when, wait: float, times: int = 1):
        self.when, self.wait, self.left = when, wait, times
        self.asked: list[tuple[float, AdmissionRequest]] = []

    def __call__(self, req: AdmissionRequest) -> float | None:
        self.asked.append((time.monotonic(), req))
        if self.left > 0 and self.when(req):
            self.left -= 1
            return self.wait
        return None


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(
        [t.prompt for t in generate_tasks("train", n=40, seed=0)] * 2, vocab_size=500
    )


def two_call_agent(max_retries: int):
    def agent(task: str, base_url: str, retriever_url: str) -> str:
        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=max_retries)
        messages = [{"role": "user", "content": task}]
        for turn in range(2):
            reply = client.chat.completions.create(model="m", messages=messages).choices[0].message
            messages += [
                reply.model_dump(exclude_none=True),
                {"role": "user", "content": f"Sure ({turn})?"},
            ]
        return reply.content or ""
    return agent


def play(tok, admission, agent, eid="e0"):
    spec = EpisodeSpec(eid, TASK, 0, "g")
    with ProxyServer(
        None, tok, limits=ProxyLimits(max_action_tokens=16), admission=admission
    ) as proxy:
        trajs = asyncio.run(run_agent_episode(
            proxy, AgentConfig(callable="t:agent", timeout_s=30, name="t"), agent, spec, run_id="t",
            env_name="search-v0", env_version="1", verifier=None,
            engine=ReplyEngine(tok, ["Paris", "<answer>France</answer>"]), source="expert"))
        return trajs, proxy


def test_the_delay_is_checked_and_sent_as_retry_after_headers():
    assert [checked_delay(x) for x in (None, 0, -3.0)] == [None, None, None]
    assert (
        checked_delay(0.25) == 0.25
        and checked_delay(1e6) == checked_delay(float("inf")) == MAX_RETRY_AFTER_S
    )
    # Retry-After takes whole seconds (rounded up); retry-after-ms is exact (the SDK reads it first)
    assert retry_after_headers(0.3) == {
        "Retry-After": "1",
        "retry-after-ms": "300",
        "x-should-retry": "true",
    }
    assert retry_after_headers(2.5)["Retry-After"] == "3"


def test_a_refused_call_is_a_429_with_retry_after_and_records_nothing(tok):
    admission = Refuse(lambda r: r.kind == "call", 1.2, times=1)
    engine = ReplyEngine(tok, ["a", "b"])
    with ProxyServer(engine, tok, admission=admission, open_on_call=True) as proxy:
        url = f"{proxy.base_url('s')}/chat/completions"
        first = httpx.post(url, json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)
        msgs = [{"role": "user", "content": "hi"}, first.json()["choices"][0]["message"],
                {"role": "user", "content": "more"}]
        refused = httpx.post(url, json={"messages": msgs}, timeout=30)
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "staleness_bound"
        assert refused.headers["retry-after"] == "2" and refused.headers["retry-after-ms"] == "1200"
        ep = proxy.episodes["s"]
        # the refusal sampled nothing
        assert ep.calls == 1 and ep.throttled == 1 and proxy.throttled == 1
        again = httpx.post(url, json={"messages": msgs}, timeout=30)
        assert again.status_code == 200 and ep.calls == 2
        assert len(ep.capture.chains) == 1  # the retried call still extends the same token stream
        proxy.end("s")  # after the end: 409, and the SDK is told not to retry it
        late = httpx.post(url, json={"messages": msgs}, timeout=30)
        assert late.status_code == 409 and late.headers["x-should-retry"] == "false"
    # the first call of a standalone episode is asked as "episode", later ones as "call"
    assert [r.kind for _, r in admission.asked] == ["episode", "call", "call"]


def test_the_openai_sdk_retries_a_429_after_the_retry_after_delay(tok):
    admission = Refuse(lambda r: r.kind == "call" and r.calls == 1, 1.2)
    trajs, proxy = play(tok, admission, two_call_agent(max_retries=2))
    traj = validate_trajectory(trajs[-1])
    assert proxy.throttled == 1 and traj.metadata["throttled_calls"] == 1
    assert traj.stop_reason is StopReason.ANSWERED and len(traj.turns) == 2 and len(trajs) == 1
    (t_refused, _), (t_retry, _) = admission.asked[-2:]
    # the SDK waited the header's 1.2 s, not its own first backoff (0.375-0.5 s)
    assert 1.2 <= t_retry - t_refused < 5.0


def test_an_agent_without_retries_fails_its_episode_on_a_429_and_it_is_counted(tok):
    trajs, proxy = play(
        tok, Refuse(lambda r: r.kind == "call" and r.calls == 1, 0.5), two_call_agent(max_retries=0)
    )
    traj = trajs[-1]
    assert (
        traj.stop_reason is StopReason.ERROR and not traj.valid and "429" in traj.metadata["error"]
    )
    assert proxy.throttled == 1 and traj.metadata["throttled_calls"] == 1


def test_the_runner_waits_for_admission_before_it_starts_the_agent(tok):
    admission = Refuse(lambda r: r.kind == "episode", 0.3, times=2)
    trajs, proxy = play(tok, admission, two_call_agent(max_retries=0))
    traj = trajs[-1]
    # the agent never saw a 429
    assert traj.stop_reason is StopReason.ANSWERED and proxy.throttled == 0
    assert traj.metadata["admission_waits"] == 2 and traj.metadata[
        "admission_wait_s"
    ] == pytest.approx(0.6)
    times = [t for t, _ in admission.asked]
    assert times[2] - times[0] >= 0.6
    assert [r.kind for _, r in admission.asked] == ["episode"] * 3 + ["call", "call"]


def test_an_episode_never_admitted_fails_after_the_runner_s_patience(tok, monkeypatch):
    monkeypatch.setattr(runner, "ADMISSION_PATIENCE_S", 0.5)
    with pytest.raises(Error, match="not admitted within 0.5 s"):
        play(tok, Refuse(lambda r: True, 0.3, times=99), two_call_agent(max_retries=0))


def retrying_agent(task: str, base_url: str, retriever_url: str) -> str:
    return two_call_agent(max_retries=2)(task, base_url, retriever_url)


def test_collect_counts_throttled_calls_and_admission_waits(tok, tmp_path):
    from pathlib import Path

    from taurl import envs
    from taurl.data.ledger import Ledger
    from taurl.proxy.collect import collect_agent
    from taurl.rollout.loop import RolloutConfig

    tasks = generate_tasks("train", n=2, seed=5)
    specs = [EpisodeSpec(f"a{i}", t, i, f"g{i}") for i, t in enumerate(tasks)]
    refusals = {
        "a0": Refuse(lambda r: r.kind == "episode", 0.2),
        "a1": Refuse(lambda r: r.calls == 1, 0.3),
    }
    with Ledger(tmp_path / "l.sqlite") as ledger:
        trajs, stats = asyncio.run(
            collect_agent(
                None,
                tok,
                lambda: envs.make("search-v0", top_k=1, max_doc_chars=80),
                specs,
                agent={"callable": f"{Path(__file__)}:retrying_agent"},
                config=RolloutConfig(max_action_tokens=16),
                ledger=ledger,
                run_id="t",
                source="expert",
                admission=lambda r: refusals[r.episode_id](r),
                engine_for=lambda s: ReplyEngine(tok, ["Paris", "<answer>France</answer>"]),
            )
        )
        assert len(ledger) == 2
    assert all(t.stop_reason is StopReason.ANSWERED for t in trajs)
    assert stats["rollout/throttled_calls"] == 1 and stats["rollout/admission_waits"] == 1
    assert stats["rollout/admission_wait_s"] == pytest.approx(0.2)
