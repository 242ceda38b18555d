"""`taurl serve-tinker` with the real `tinker` SDK (0.38.0): sampling, refusals, the protocol.

Sampling from the base model and from trained LoRA weights on taurl's local engine; the
sampled logprobs against the learner's; requests the server refuses, as the SDK raises them;
idempotent POSTs and polled futures over raw HTTP.
"""

from __future__ import annotations

import warnings

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("starlette")

from tinker import types  # noqa: E402

from taurl.tinker.records import read_samples  # noqa: E402
from tinker_harness import MODEL, SEQ, datum, logprobs  # noqa: E402


@pytest.fixture(scope="module")
def trained(served):
    """A training client taught SEQ (greedy decoding from SEQ[:3] continues it) and a
    sampler of its weights."""
    tc = served[1].create_lora_training_client(MODEL, rank=8, seed=0).result()
    for _ in range(30):
        tc.forward_backward([datum(SEQ)], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=3e-3))
    return tc, tc.save_weights_and_get_sampling_client().result()


def greedy(**kw) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=6, temperature=0.0, **kw)


def prompt(tokens) -> types.ModelInput:
    return types.ModelInput.from_ints(list(tokens))


def test_sampling_from_base_and_from_lora_weights(served, trained):
    base = served[1].create_sampling_client(base_model=MODEL).result()
    _, lora = trained
    taught = lora.sample(prompt(SEQ[:3]), 1, greedy()).result().sequences[0]
    assert taught.tokens == SEQ[3:9] and taught.stop_reason == "length"
    untaught = base.sample(prompt(SEQ[:3]), 1, greedy()).result().sequences[0]
    assert untaught.tokens != SEQ[3:9] and len(untaught.tokens) == 6
    records = read_samples(served[0].service.run_dir)  # the ledger: one row per sequence
    assert [r.metadata["tinker"]["model_path"] is None for r in records[-2:]] == [False, True]
    assert [r.policy_versions for r in records[-2:]] == [[30], [0]]
    assert list(records[-2].segments[1].token_ids) == SEQ[3:9]
    # named sampler weights: a tinker:// path any client can sample from
    tc, _ = trained
    path = tc.save_weights_for_sampler("taught").result().path
    assert path == f"tinker://{tc.model_id}/sampler_weights/taught"
    named = served[1].create_sampling_client(model_path=path).result()
    assert named.sample(prompt(SEQ[:3]), 1, greedy()).result().sequences[0].tokens == SEQ[3:9]


def test_stop_token_ids_and_stop_strings(served, trained):
    tc, lora = trained
    seq = lora.sample(prompt(SEQ[:3]), 1, greedy(stop=[SEQ[5]])).result().sequences[0]
    assert seq.tokens == SEQ[3:6] and seq.stop_reason == "stop"  # the stop id is kept
    tok = served[0].service.models.get(MODEL).tokenizer
    text = tok.decode(SEQ[3:6])
    seq = lora.sample(prompt(SEQ[:3]), 1, greedy(stop=[text])).result().sequences[0]
    assert seq.stop_reason == "stop" and text in tok.decode(seq.tokens)
    assert seq.tokens == SEQ[3:3 + len(seq.tokens)] and len(seq.tokens) <= 3


def test_top_k_and_top_p_narrow_the_draw(trained):
    _, lora = trained
    p = prompt(SEQ[:3])
    want = lora.sample(p, 1, greedy()).result().sequences[0].tokens
    for narrow in ({"top_k": 1}, {"top_p": 1e-6}):
        params = types.SamplingParams(max_tokens=6, temperature=5.0, seed=7, **narrow)
        out = lora.sample(p, 4, params).result()
        assert all(s.tokens == want for s in out.sequences), narrow
    hot = types.SamplingParams(max_tokens=6, temperature=5.0, seed=7)
    assert any(s.tokens != want for s in lora.sample(p, 4, hot).result().sequences)


def test_num_samples_differ_and_a_seed_reproduces_them(served):
    base = served[1].create_sampling_client(base_model=MODEL).result()
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=11)
    first = base.sample(prompt(SEQ[:4]), 6, params).result()
    assert len(first.sequences) == 6
    assert len({tuple(s.tokens) for s in first.sequences}) >= 5
    again = base.sample(prompt(SEQ[:4]), 6, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
    ids = [s.sequence_id for s in first.sequences]
    assert len(set(ids)) == 6


def test_prompt_logprobs_equal_the_learners(served):
    tc = served[1].create_lora_training_client(MODEL, rank=4).result()  # B = 0: the base
    base = served[1].create_sampling_client(base_model=MODEL).result()
    lps = base.compute_logprobs(prompt(SEQ)).result()
    assert lps[0] is None and len(lps) == len(SEQ)
    learner = logprobs(tc.forward([datum(SEQ)], "cross_entropy").result())[0]
    np.testing.assert_allclose(np.array(lps[1:], dtype=np.float32), learner, atol=1e-4)
    out = base.sample(prompt(SEQ), 1, greedy(), include_prompt_logprobs=True,
                      prompt_logprobs_last_n=3).result()
    assert out.prompt_logprobs[:-3] == [None] * (len(SEQ) - 3)
    np.testing.assert_allclose(out.prompt_logprobs[-3:], lps[-3:], atol=1e-6)


def test_sampled_logprobs_equal_the_learners_for_the_same_weights(served, trained):
    tc, lora = trained
    params = types.SamplingParams(max_tokens=10, temperature=1.0, seed=3, stop=[])
    out = lora.sample(prompt(SEQ[:4]), 3, params).result()
    for s in out.sequences:
        full = SEQ[:4] + s.tokens
        learner = logprobs(tc.forward([datum(full)], "cross_entropy").result())[0]
        np.testing.assert_allclose(np.array(s.logprobs), learner[3:], atol=1e-4)
    recs = read_samples(served[0].service.run_dir)[-3:]
    assert [list(r.segments[1].token_ids) for r in recs] == [s.tokens for s in out.sequences]
    assert [list(r.segments[1].logprobs) for r in recs] == [
        np.asarray(s.logprobs, dtype=np.float32).tolist() for s in out.sequences]
    assert [r.token_ids[:4] for r in recs] == [SEQ[:4]] * 3 and len({r.group_id for r in recs}) == 1


def _user_error(excinfo, *phrases):
    e = excinfo.value
    assert isinstance(e, tinker.RequestFailedError), repr(e)
    assert e.category == tinker.types.RequestErrorCategory.User
    for p in phrases:
        assert p in str(e), str(e)


def test_refusals_reach_the_sdk_as_user_errors(served):
    service = served[1]
    with pytest.raises(tinker.RequestFailedError) as e:
        service.create_lora_training_client("no-such-model", rank=4).result()
    _user_error(e, "unknown base model", "tiny")
    tc = service.create_lora_training_client(MODEL, rank=4).result()
    with pytest.raises(tinker.RequestFailedError) as e:
        tc.forward_backward([datum(SEQ)], "cispo").result()
    _user_error(e, "'cispo' is not supported", "cross_entropy")
    bad = datum(SEQ, weights=np.ones(3))  # 3 weights for 11 targets
    with pytest.raises(tinker.RequestFailedError) as e:
        tc.forward_backward([bad], "cross_entropy").result()
    _user_error(e, "data[0]", "weights")
    with pytest.raises(tinker.RequestFailedError) as e:
        tc.forward([datum(SEQ)], "importance_sampling").result()
    _user_error(e, "lacks ['logprobs', 'advantages']")
    path = tc.save_state("refusals").result().path
    with warnings.catch_warnings(), pytest.raises(tinker.RequestFailedError) as e:
        warnings.simplefilter("ignore", FutureWarning)
        tc.load_state(path).result()
    _user_error(e, "load_state must be a training client's first request")
    # the client still works after its refused requests
    assert tc.forward([datum(SEQ)], "cross_entropy").result().metrics["loss:sum"] > 0


def test_idempotent_posts_and_polled_futures(served):
    server, service = served
    sampler = service.create_sampling_client(base_model=MODEL).result()
    body = {"sampling_session_id": sampler._sampling_session_id, "seq_id": 0, "num_samples": 1,
            "prompt": {"chunks": [{"tokens": SEQ[:3], "type": "encoded_text"}]},
            "sampling_params": {"max_tokens": 4, "temperature": 1.0}}
    before = len(read_samples(server.service.run_dir))
    server.service.futures.long_poll_s = 0.0  # answer a pending future at once
    try:
        with httpx.Client(base_url=server.url + "/api/v1", timeout=30) as http:
            key = {"X-Idempotency-Key": "retry-me"}
            first = http.post("/asample", json=body, headers=key).json()
            assert http.post("/asample", json=body, headers=key).json() == first
            polls = []
            while not polls or polls[-1].status_code == 408:
                polls.append(http.post("/retrieve_future", json={"request_id": first["request_id"]},
                                       headers={"Accept": "application/x-protobuf"}))
            assert polls[-1].status_code == 200
            assert polls[-1].headers["content-type"] == "application/x-protobuf"
            assert all(p.json()["type"] == "try_again" for p in polls[:-1])
            assert http.post("/retrieve_future", json={"request_id": "nope"}).status_code == 404
            other = tinker.ServiceClient(base_url=server.url, api_key="tml-local")
            session = other.holder.get_session_id()  # a session of its own, finished here
            beat = {"session_id": session}
            assert http.post("/session_heartbeat", json=beat).status_code == 200
            assert http.post(f"/sessions/{session}/finish",
                             json={"reason": {"type": "success"}}).status_code == 200
            assert http.post("/session_heartbeat", json=beat).status_code == 410  # stops the SDK's
    finally:
        server.service.futures.long_poll_s = 10.0
    assert len(read_samples(server.service.run_dir)) == before + 1  # sampled once


def test_top_k_keeps_the_k_most_likely_ids_and_renormalizes():
    import torch

    from taurl.policy.sampling import sample_tokens

    lp = torch.log(torch.tensor([[0.1, 0.5, 0.3, 0.1]]))
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_tokens(lp, [1.0], [gen], top_k=[2]) for _ in range(3000)])
    assert set(draws.flatten().tolist()) == {1, 2}
    assert abs((draws == 1).float().mean().item() - 0.5 / 0.8) < 0.03
    same = torch.Generator().manual_seed(0)  # top_k 0 keeps every id: the old draw
    assert sample_tokens(lp, [1.0], [same], top_k=[0]).item() == sample_tokens(
        lp, [1.0], [torch.Generator().manual_seed(0)]).item()


def test_the_vllm_engine_refuses_top_k_instead_of_dropping_it():
    import asyncio

    from taurl.errors import EngineError
    from taurl.policy.protocol import SamplingParams
    from taurl.policy.vllm_engine import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)  # no server: the check comes first
    engine.allow_top_p = False
    with pytest.raises(EngineError, match="top_k"):
        asyncio.run(engine.generate([1, 2], SamplingParams(top_k=5)))
