"""A `taurl serve-tinker` run's ledger, exported and checked (issue 36's must-show).

The real `tinker` SDK trains a LoRA client for a few steps and samples from the base model
and from two saved sampler versions; ``taurl export RUN`` writes the ledger and
``taurl export --merged`` each sampler checkpoint as a plain HF directory; every sampled
token's logprob is then recomputed with a plain ``transformers`` forward of the exported
weights of the row's own version and must be within 1e-4 of what the service recorded —
and off by more than that under the other version's weights, so the check can fail. Also
the REST listing of training runs and checkpoints (``tinker.RestClient``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("starlette")

from tinker import types  # noqa: E402

from tinker_harness import MODEL, SEQ, datum  # noqa: E402

TOL = 1e-4


def recomputed(model, row: dict) -> np.ndarray:
    """log_softmax(logits / T)[id] of each loss-masked id of `row`: a plain HF forward."""
    import torch

    ids = torch.tensor([row["token_ids"]])
    temperature = row["metadata"]["sampling"]["temperature"] or 1.0  # greedy: T = 1
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits / temperature, -1).gather(-1, ids[0, 1:, None])[:, 0]
    mask = np.asarray(row["loss_mask"][1:], dtype=bool)
    return lp.numpy()[mask]


def recorded(row: dict) -> np.ndarray:
    return np.asarray(row["logprobs"], dtype=np.float64)[np.asarray(row["loss_mask"]) == 1]


@pytest.fixture(scope="module")
def sampled(served):
    """Two sampler versions of one training client (3 and 6 optimizer steps) and the base,
    each sampled: (run dir, their tinker:// paths, the training client)."""
    _, client = served
    tc = client.create_lora_training_client(MODEL, rank=4, seed=1).result()
    paths = []
    for v in range(2):
        for _ in range(3):
            tc.forward_backward([datum(SEQ)], "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=2e-2))
        paths.append(tc.save_weights_for_sampler(f"ledger-v{v}").result().path)
    samplers = [client.create_sampling_client(base_model=MODEL).result()] + [
        client.create_sampling_client(model_path=p).result() for p in paths]
    for i, sampler in enumerate(samplers):
        for temperature, start in ((1.0, SEQ[:3]), (0.7, SEQ[2:6])):
            params = types.SamplingParams(max_tokens=6, temperature=temperature, seed=10 + i,
                                          stop=[])
            sampler.sample(types.ModelInput.from_ints(start), 2, params).result()
    return served[0].service.run_dir, paths, tc


def test_every_sampled_logprob_recomputes_from_its_exported_version(sampled, served,
                                                                     tmp_path):
    from transformers import AutoModelForCausalLM

    from taurl.cli.main import main

    run, paths, _ = sampled
    assert main(["export", str(run), "--out", str(tmp_path / "t.jsonl")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    ours = [r for r in rows if r["metadata"]["tinker"]["model_path"] in (None, *paths)]
    assert len(ours) == 3 * 2 * 2  # 3 samplers x 2 prompts x 2 samples
    assert main(["inspect", str(run), "--no-color"]) == 0  # a service run reads like any run
    weights = {None: (Path(served[0].service.models.specs[MODEL]), 0)}
    for i, path in enumerate(paths):
        out = tmp_path / f"merged-{i}"
        assert main(["export", "--merged", str(run), str(out), "--checkpoint", path]) == 0
        meta = json.loads((out / "taurl.json").read_text())
        assert meta["exported_from"] == path and meta["version"] == 3 * (i + 1)
        weights[path] = (out, meta["version"])
    models = {p: AutoModelForCausalLM.from_pretrained(d).float().eval()
              for p, (d, _) in weights.items()}
    for row in ours:
        path = row["metadata"]["tinker"]["model_path"]
        n_prompt = len(row["segments"][0]["token_ids"])
        n_sampled = len(row["segments"][1]["token_ids"])
        # token-exact: only the sampled ids are in the loss mask, each with its version
        assert row["loss_mask"] == row["action_mask"] == [0] * n_prompt + [1] * n_sampled
        assert row["source"] == "policy" and n_sampled > 0
        assert set(np.array(row["token_versions"])[n_prompt:]) == {weights[path][1]}
        assert row["policy_versions"] == [weights[path][1]]
        diff = np.abs(recomputed(models[path], row) - recorded(row))
        assert diff.max() <= TOL, (path, diff.max())
        # the check can fail: another version's weights do not reproduce the row
        other = paths[0] if path != paths[0] else paths[1]
        assert np.abs(recomputed(models[other], row) - recorded(row)).max() > TOL


def test_export_merged_refuses_a_missing_checkpoint_and_a_used_directory(sampled, tmp_path,
                                                                         capsys):
    from taurl.cli.main import main
    from taurl.errors import Error
    from taurl.tinker.export import export_merged

    run, paths, _ = sampled
    gone = paths[0].replace("ledger-v0", "nope")
    assert main(["export", "--merged", str(run), str(tmp_path / "x"), "--checkpoint", gone]) != 0
    assert f"no checkpoint at {gone}" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "f").write_text("x")
    directory = next((Path(run) / "tinker").glob("*/sampler_weights/ledger-v0"))
    with pytest.raises(Error, match="not an empty directory"):
        export_merged(directory, tmp_path / "used")


def test_rest_client_lists_training_runs_and_checkpoints(sampled, served):
    run, paths, tc = sampled
    state = tc.save_state("ledger-state").result().path
    rest = tinker.RestClient(base_url=served[0].url, api_key="tml-local")
    listed = rest.list_checkpoints(tc.model_id).result().checkpoints
    by_path = {c.tinker_path: c for c in listed}
    assert set(by_path) >= {*paths, state}
    assert by_path[paths[1]].checkpoint_type == "sampler"
    assert by_path[paths[1]].checkpoint_id == "sampler_weights/ledger-v1"
    assert by_path[state].checkpoint_type == "training" and by_path[state].size_bytes > 0
    times = [c.time for c in listed]
    assert times == sorted(times)
    got = rest.get_training_run(tc.model_id).result()
    assert (got.base_model, got.is_lora, got.lora_rank) == (MODEL, True, 4)
    assert got.last_checkpoint.tinker_path == state
    assert got.last_sampler_checkpoint.tinker_path == paths[1]
    assert rest.get_training_run_by_tinker_path(paths[0]).result().training_run_id == tc.model_id
    runs = rest.list_training_runs(limit=50).result()
    assert tc.model_id in [r.training_run_id for r in runs.training_runs]
    assert runs.cursor.total_count >= 1
    mine = rest.list_user_checkpoints(limit=2).result()
    assert len(mine.checkpoints) == 2 and mine.checkpoints[0].tinker_path == state  # newest
    with pytest.raises(tinker.NotFoundError):
        rest.list_checkpoints("no-such-run").result()
