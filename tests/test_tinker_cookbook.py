"""tinker-cookbook 0.6.1's `supervised.train` and `rl.train`, unmodified, on `taurl serve-tinker`.

The cookbook is configured only (base URL, model name, renderer, paths), as a user would:
the model name is the served model's directory, so the cookbook's `get_tokenizer` loads it
with no network. Real HTTP on loopback, the tiny random-init Qwen2 of the other Tinker tests
(examples/tinker_cookbook runs the same modules on SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref

import pytest

pytest.importorskip("tinker")
pytest.importorskip("starlette")
pytest.importorskip("tinker_cookbook")

from taurl.tinker.records import read_samples  # noqa: E402
from tinker_harness import SEQ, build_policy, datum, loss  # noqa: E402

CONVERSATION = {"messages": [{"role": "user", "content": "the city number 3 lies in"},
                             {"role": "assistant", "content": "country 3 and its answer is 9"}]}


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_cookbook_supervised_train_two_steps(tmp_path, monkeypatch):
    from tinker_cookbook.supervised import train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    from taurl.tinker.server import TinkerServer

    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    policy = str(build_policy(tmp_path / "policy"))
    data = tmp_path / "sft.jsonl"
    # one conversation 8 times: both batches are the same data, so step 1 (after one update
    # on it) must have a lower loss than step 0
    data.write_text("\n".join(json.dumps(CONVERSATION) for _ in range(8)) + "\n")
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=policy,
                                            renderer_name="role_colon", max_length=64,
                                            batch_size=4)
    with TinkerServer({policy: policy}, tmp_path / "server") as server:
        config = train.Config(
            log_path=str(tmp_path / "sft"), model_name=policy, recipe_name="taurl_test",
            renderer_name="role_colon", base_url=server.url, lora_rank=4,
            dataset_builder=FromConversationFileBuilder(file_path=str(data),
                                                        common_config=common),
            learning_rate=1e-2, lr_schedule="constant", num_epochs=1,
            save_every=0, eval_every=0, infrequent_eval_every=0)
        asyncio.run(train.main(config))

    steps = [r for r in read_jsonl(tmp_path / "sft" / "metrics.jsonl") if "train_mean_nll" in r]
    assert [r["step"] for r in steps] == [0, 1]
    assert steps[1]["train_mean_nll"] < steps[0]["train_mean_nll"]
    ops = [r["tinker/op"] for r in read_jsonl(tmp_path / "server" / "metrics.jsonl")]
    assert ops.count("optim_step") == 2 and ops.count("forward_backward") == 2
    final = read_jsonl(tmp_path / "sft" / "checkpoints.jsonl")[-1]
    assert final["name"] == "final" and final["state_path"].startswith("tinker://")


def test_finished_session_releases_its_training_models(tmp_path, monkeypatch):
    """Each cookbook run is one ServiceClient session whose training client holds a copy of
    the base model; closing the session must free it (the server grew by one model a run
    before), while what it saved still loads into a later session."""
    import tinker

    from taurl.tinker.server import TinkerServer

    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    policy = str(build_policy(tmp_path / "policy"))
    with TinkerServer({"tiny": policy}, tmp_path / "server") as server:
        registry = server.service.registry
        first = tinker.ServiceClient(base_url=server.url, api_key="tml-local")
        tc = first.create_lora_training_client("tiny", rank=4).result()
        tc.forward_backward([datum(SEQ)], "cross_entropy").result()
        tc.optim_step(tinker.types.AdamParams(learning_rate=1e-2)).result()
        before = loss(tc, [datum(SEQ)])
        state = tc.save_state("kept").result().path
        held = weakref.ref(registry.models[tc.model_id])
        first.close("success").result()
        assert tc.model_id not in registry.models
        gc.collect()
        assert held() is None  # nothing else keeps the model (and its base copy) alive

        second = tinker.ServiceClient(base_url=server.url, api_key="tml-local")
        again = second.create_training_client_from_state(state)
        assert loss(again, [datum(SEQ)]) == pytest.approx(before, rel=1e-5)
        second.close("success").result()


def test_cookbook_rl_train_one_step_on_the_example_task(tmp_path, monkeypatch):
    """`rl.train` with the example's RLDatasetBuilder (examples/tinker_cookbook/countries_rl.py):
    the cookbook samples through the server, scores with the example's env and trains."""
    import sys
    from pathlib import Path

    from tinker_cookbook.rl import train

    from taurl.tinker.server import TinkerServer

    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("TINKER_API_KEY", "tml-local")
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "examples" / "tinker_cookbook"))
    monkeypatch.delitem(sys.modules, "countries_rl", raising=False)
    from countries_rl import CountriesDatasetBuilder

    policy = str(build_policy(tmp_path / "policy"))
    builder = CountriesDatasetBuilder(model_name=policy, renderer_name="role_colon",
                                      batch_size=2, group_size=2, n_batches=1)
    with TinkerServer({policy: policy}, tmp_path / "server") as server:
        config = train.Config(
            log_path=str(tmp_path / "rl"), model_name=policy, recipe_name="taurl_test",
            renderer_name="role_colon", base_url=server.url, dataset_builder=builder,
            learning_rate=1e-3, max_tokens=8, lora_rank=4, eval_every=0, save_every=0)
        asyncio.run(train.main(config))

    episodes = read_jsonl(tmp_path / "rl" / "iteration_000000" / "train_rollout_summaries.jsonl")
    assert len(episodes) == 4 and all(e["steps"][0]["ac_len"] > 0 for e in episodes)
    assert len(read_samples(tmp_path / "server")) == 4  # the ledger: one row per sequence
    ops = [r["tinker/op"] for r in read_jsonl(tmp_path / "server" / "metrics.jsonl")]
    assert "optim_step" in ops
