"""`taurl serve-tinker` with the real `tinker` SDK (0.38.0): training clients.

Real HTTP on loopback (uvicorn), the SDK unmodified (futures, polling, protobuf + zstd
bodies), taurl's LoRA learner on a tiny random-init Qwen2.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("starlette")

from tinker import types  # noqa: E402

from tinker_harness import MODEL, SEQ, datum, logprobs, loss  # noqa: E402


@pytest.fixture
def service(served):
    return served[1]


def test_capabilities_and_health(served):
    server, _ = served
    rest = tinker.RestClient(base_url=server.url, api_key="tml-local")
    caps = rest.get_server_capabilities().result()
    assert [m.model_name for m in caps.supported_models] == [MODEL]
    assert caps.supported_models[0].trainable and caps.supported_models[0].sampleable
    tc = served[1].create_lora_training_client(MODEL, rank=4).result()
    assert tc.get_info().model_data.model_name == MODEL and tc.get_info().lora_rank == 4
    served_tok = server.service.models.get(MODEL).tokenizer
    assert tc.get_tokenizer().encode("the city 12") == served_tok.encode("the city 12")


def test_cross_entropy_weight_semantics(service):
    tc = service.create_lora_training_client(MODEL, rank=4).result()
    n = len(SEQ) - 1
    zero = tc.forward([datum(SEQ, weights=np.zeros(n))], "cross_entropy").result()
    assert zero.metrics["loss:sum"] == 0.0
    ones = tc.forward([datum(SEQ, weights=np.ones(n))], "cross_entropy").result()
    omitted = tc.forward([datum(SEQ)], "cross_entropy").result()
    assert omitted.metrics["loss:sum"] == pytest.approx(ones.metrics["loss:sum"], rel=1e-6)
    lp = logprobs(omitted)[0]
    assert lp.shape == (n,) and (lp < 0).all()
    # the loss is −Σ w·logprob, a sum (not a mean) over tokens
    half = np.r_[np.zeros(n // 2), np.ones(n - n // 2)]
    partial = tc.forward([datum(SEQ, weights=half)], "cross_entropy").result()
    assert partial.metrics["loss:sum"] == pytest.approx(-float(lp[n // 2:].sum()), rel=1e-5)
    # top-K cross-entropy: (N, K) targets and weights; weight 1 on the real target only
    topk = types.Datum(model_input=types.ModelInput.from_ints(SEQ[:-1]), loss_fn_inputs={
        "target_tokens": np.stack([SEQ[1:], np.full(n, 3)], axis=1).astype(np.int64),
        "weights": np.stack([np.ones(n), np.zeros(n)], axis=1).astype(np.float32)})
    out = tc.forward([topk], "cross_entropy").result()
    assert out.metrics["loss:sum"] == pytest.approx(omitted.metrics["loss:sum"], rel=1e-5)
    assert logprobs(out)[0].shape == (2 * n,) and out.loss_fn_outputs[0]["logprobs"].shape == [n, 2]


def test_forward_backward_and_optim_step_lower_the_loss(service, served):
    tc = service.create_lora_training_client(MODEL, rank=8, seed=1).result()
    data = [datum(SEQ), datum(SEQ[3:] + SEQ[:3])]
    first = loss(tc, data)
    for _ in range(5):
        fb = tc.forward_backward(data, "cross_entropy")
        step = tc.optim_step(types.AdamParams(learning_rate=5e-3))
        fb.result()
        assert "grad_norm:mean" in step.result().metrics
    assert loss(tc, data) < 0.8 * first
    rows = [json.loads(line) for line in (served[0].service.run_dir / "metrics.jsonl")
            .read_text().splitlines()]
    mine = [r for r in rows if r["tinker/model_id"] == tc.model_id]
    assert [r["tinker/op"] for r in mine].count("forward_backward") == 5
    assert max(r["step"] for r in mine) == 5


def test_save_state_then_a_fresh_clients_load_state_reproduces_the_losses(service):
    data = [datum(SEQ)]
    a = service.create_lora_training_client(MODEL, rank=4, seed=2).result()
    for _ in range(2):
        a.forward_backward(data, "cross_entropy")
        a.optim_step(types.AdamParams(learning_rate=1e-2))
    path = a.save_state("two-steps").result().path
    assert path == f"tinker://{a.model_id}/weights/two-steps"
    saved = loss(a, data)
    a.forward_backward(data, "cross_entropy")
    a.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after_one_more = loss(a, data)

    b = service.create_lora_training_client(MODEL, rank=4, seed=99).result()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # load_state is deprecated in the SDK
        b.load_state_with_optimizer(path).result()
    assert loss(b, data) == pytest.approx(saved, abs=1e-6)
    b.forward_backward(data, "cross_entropy")
    b.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert loss(b, data) == pytest.approx(after_one_more, abs=1e-5)  # Adam's moments came too

    c = service.create_training_client_from_state(path).result()  # weights only
    assert c.model_id != a.model_id and loss(c, data) == pytest.approx(saved, abs=1e-6)


def test_forward_backward_custom_equals_cross_entropy(service):
    weights = np.linspace(0.0, 1.0, len(SEQ) - 1)
    data = [datum(SEQ, weights=weights)]
    a = service.create_lora_training_client(MODEL, rank=4, seed=3).result()
    b = service.create_lora_training_client(MODEL, rank=4, seed=3).result()

    def neg_ll(batch, lps):
        import torch

        w = [torch.tensor(d.loss_fn_inputs["weights"].data) for d in batch]
        return sum(-(lp * wi).sum() for lp, wi in zip(lps, w, strict=True)), {}

    ce = a.forward_backward(data, "cross_entropy").result()
    custom = b.forward_backward_custom(data, neg_ll).result()
    assert custom.metrics["loss:sum"] == pytest.approx(ce.metrics["loss:sum"], rel=1e-5)
    a.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    b.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert loss(b, data) == pytest.approx(loss(a, data), rel=1e-5)


def test_importance_sampling_and_ppo(service):
    tc = service.create_lora_training_client(MODEL, rank=4).result()
    n = len(SEQ) - 1
    lp = logprobs(tc.forward([datum(SEQ)], "cross_entropy").result())[0]
    adv = np.linspace(-1.0, 1.0, n)
    rl = datum(SEQ, logprobs=lp, advantages=adv)  # on-policy: every ratio is 1
    for loss_fn in ("importance_sampling", "ppo"):
        out = tc.forward([rl], loss_fn).result()
        assert out.metrics["loss:sum"] == pytest.approx(-float(adv.sum()), abs=1e-4)
        np.testing.assert_allclose(logprobs(out)[0], lp, atol=1e-6)
    # off-policy: sampler logprobs 1 nat lower → ratio e; ppo clips it at 1.2
    shifted = datum(SEQ, logprobs=lp - 1.0, advantages=np.ones(n))
    assert loss(tc, [shifted], "importance_sampling") == pytest.approx(-np.e * n, rel=1e-4)
    assert loss(tc, [shifted], "ppo") == pytest.approx(-1.2 * n, rel=1e-4)


def test_the_cli_command_checks_its_models(capsys, tmp_path):
    from taurl.cli.main import main

    assert main(["serve-tinker", "--model", str(tmp_path / "missing"), "--run-dir",
                 str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "serve-tinker" in err and "--model" in err and "missing" in err


def test_a_forward_backward_split_into_parallel_chunks_equals_one_call(served):
    """The SDK sends chunks of one call at once (the first last); the server's answer
    is the one-chunk answer: outputs in datum order, the same loss and gradients."""
    server, service = served
    data = [datum(SEQ[:k]) for k in (12, 5, 9, 3, 7)]
    whole = service.create_lora_training_client(MODEL, rank=4, seed=5).result()
    server.service.client_config["fwdbwd_max_chunk_len"] = 2  # fetched by new clients
    try:
        chunked_service = tinker.ServiceClient(base_url=server.url, api_key="tml-local")
        chunked = chunked_service.create_lora_training_client(MODEL, rank=4, seed=5).result()
    finally:
        server.service.client_config["fwdbwd_max_chunk_len"] = 1024
    a = whole.forward_backward(data, "cross_entropy").result()
    b = chunked.forward_backward(data, "cross_entropy").result()
    assert [len(x) for x in logprobs(b)] == [11, 4, 8, 2, 6]
    rows = [json.loads(line) for line in (server.service.run_dir / "metrics.jsonl")
            .read_text().splitlines()]
    sizes = [r["tinker/datums"] for r in rows if r["tinker/model_id"] == chunked.model_id
             and r["tinker/op"] == "forward_backward"]
    assert sorted(sizes) == [1, 2, 2]  # three requests reached the server
    for x, y in zip(logprobs(a), logprobs(b), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6)
    assert b.metrics["loss:sum"] == pytest.approx(a.metrics["loss:sum"], rel=1e-5)
    whole.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    chunked.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert loss(chunked, data) == pytest.approx(loss(whole, data), rel=1e-5)
