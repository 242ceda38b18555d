"""Faults injected and survived: each is a clear error or a counted failure, nothing half-written.

The engine, env and sandbox faults run the real agent loop (`taurl.rollout.episodes.collect`) with a
real tokenizer, env and ledger; only the faulty part is replaced, by a class that says what
it breaks. The full disk is real: a 1 MiB tmpfs mounted for the test (we run as root; the
test is skipped, saying why, where mounting is not permitted).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from taurl import envs
from taurl.data.atomic import DiskWriteError, atomic_write_text
from taurl.data.ledger import Ledger, LedgerWriteError
from taurl.data.runs import RunDir
from taurl.data.trajectory import StopReason
from taurl.policy.engine import Generation
from taurl.rollout.episodes import EpisodeError, EpisodeSpec, collect
from taurl.rollout.loop import RolloutConfig
from taurl.train.checkpoint import save_checkpoint

CONFIG = RolloutConfig(
    max_turns=1, max_action_tokens=4, max_episode_tokens=4, generate_timeout_s=0.5
)


class FaultyEngine:
    """An engine that fails in the way named by `mode`: raise (taurl or foreign error) or hang."""

    version, max_context = 0, 1024

    def __init__(self, mode: str):
        self.mode = mode

    async def generate(self, prompt_ids, sampling) -> Generation:
        if self.mode == "engine_error":
            from taurl.errors import EngineError

            raise EngineError("the server answered 503")
        if self.mode == "crash":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        await asyncio.sleep(3600)  # "hang": a server that accepted the request and never answers
        raise AssertionError("unreachable")


class EnvThatCrashesInReset:
    """search-v0 whose reset raises (a broken env build, a missing data file)."""

    def __init__(self):
        self._env = envs.make("search-v0", max_turns=1)

    def __getattr__(self, name):
        return getattr(self._env, name)

    def reset(self, task, seed=None):
        raise FileNotFoundError("corpus shard 7 is missing")


def specs(n: int, env: str = "search-v0") -> list[EpisodeSpec]:
    tasks = envs.registry.make_tasks(env, "train", n, seed=0)
    return [EpisodeSpec(f"e{i}", t, i, f"g{i}") for i, t in enumerate(tasks)]


def run(engine, make_env, eps, tokenizer, ledger):
    return asyncio.run(
        collect(engine, tokenizer, make_env, eps, config=CONFIG, ledger=ledger, run_id="faults")
    )


@pytest.mark.parametrize("mode, message", [
    ("engine_error", "engine: the server answered 503"),
    ("hang", "engine: no completion within generate_timeout_s=0.5 s (is the server up?)"),
])
def test_an_engine_that_raises_or_hangs_gives_error_records_and_a_round_of_only_those_stops(
        search_tokenizer, mode, message):
    """Each episode is recorded as an error (the learner would drop it); a round in which every
    episode is one has nothing to train on, so it stops the run with the first cause (before:
    it returned the batch, and the learner skipped the update without a word)."""
    with Ledger(":memory:") as ledger:
        with pytest.raises(
            EpisodeError,
            match=r"every one of the 3 episode\(s\) failed or ended by an error"
            rf".*\(3 stored as such\).*the first: e0: {re.escape(message)}",
        ):
            run(
                FaultyEngine(mode), lambda: envs.make("search-v0", max_turns=1), specs(3),
                search_tokenizer, ledger,
            )
        batch = [ledger.get(e) for e in ("e0", "e1", "e2")]  # recorded, as errors
        assert {t.stop_reason for t in batch} == {StopReason.ERROR}
        assert {t.metadata["error"] for t in batch} == {message}
        assert not any(t.valid for t in batch)


def test_a_round_with_one_usable_record_goes_on_and_counts_its_shrunk_group(
    search_tokenizer, caplog
):
    """Groups g0 (e0, e1) and g1 (e2, e3); e1's env cannot be built: a counted failure, and its
    group, trained with one episode fewer, is counted in rollout/shrunk_groups (before: only
    a log line said so)."""
    made = iter([envs.make("search-v0", max_turns=1), None, envs.make("search-v0", max_turns=1),
                 envs.make("search-v0", max_turns=1)])

    def make_env():
        env = next(made)
        if env is None:
            raise OSError("the env's index could not be opened")
        return env

    class OneTokenEngine(FaultyEngine):
        async def generate(self, prompt_ids, sampling):
            return Generation([search_tokenizer.eos_token_id], [-0.1], "eos", 0)

    tasks = envs.registry.make_tasks("search-v0", "train", 2, seed=0)
    eps = [
        EpisodeSpec(f"e{2 * i + j}", t, 2 * i + j, f"g{i}")
        for i, t in enumerate(tasks)
        for j in range(2)
    ]
    with Ledger(":memory:") as ledger, caplog.at_level(logging.WARNING, "taurl"):
        batch, stats = asyncio.run(
            collect(
                OneTokenEngine("ok"), search_tokenizer, make_env, eps, config=CONFIG, ledger=ledger,
                run_id="faults",
            )
        )
    assert [t.episode_id for t in batch] == ["e0", "e2", "e3"]
    assert stats["rollout/failed_episodes"] == 1 and stats["rollout/shrunk_groups"] == 1
    assert (
        "episode produced no record: e1: OSError: the env's index could not be opened"
        in caplog.text
    )


def test_an_engine_that_crashes_stores_nothing_and_says_why(search_tokenizer, caplog):
    with Ledger(":memory:") as ledger, caplog.at_level(logging.WARNING, "taurl.rollout.episodes"):
        with pytest.raises(EpisodeError) as e:
            run(
                FaultyEngine("crash"), lambda: envs.make("search-v0", max_turns=1), specs(2),
                search_tokenizer, ledger,
            )
        assert ledger.count() == 0
    assert str(e.value).startswith(
        "every one of the 2 episode(s) failed, so nothing was stored; the first: e0: "
        "RuntimeError: CUDA error: an illegal memory access was encountered."
    )
    assert "episode produced no record: e1: RuntimeError: CUDA error" in caplog.text


def test_an_env_that_crashes_in_reset_is_an_error_record(search_tokenizer):
    made = iter(
        [
            EnvThatCrashesInReset(),
            envs.make("search-v0", max_turns=1),
            envs.make("search-v0", max_turns=1),
        ]
    )

    class OneTokenEngine(FaultyEngine):  # answers one EOS token, enough for an episode
        async def generate(self, prompt_ids, sampling):
            return Generation([search_tokenizer.eos_token_id], [-0.1], "eos", 0)

    with Ledger(":memory:") as ledger:
        batch, stats = run(
            OneTokenEngine("ok"), lambda: next(made), specs(3), search_tokenizer, ledger
        )
        assert [t.episode_id for t in batch] == ["e0", "e1", "e2"] and ledger.count() == 3
    # the agent loop's contract: a record, ended by the error (the learner drops it),
    # never a raw exception
    assert batch[0].stop_reason is StopReason.ERROR and not batch[0].valid and not batch[0].turns
    assert (
        batch[0].metadata["error"]
        == "env.reset raised FileNotFoundError: corpus shard 7 is missing"
    )
    assert batch[1].valid and batch[2].valid and stats["rollout/failed_episodes"] == 0


def test_the_sandbox_unavailable_is_a_clear_error_before_anything_is_trained(
    search_tokenizer, monkeypatch
):
    # the only candidate, and it is not there
    monkeypatch.setenv("TAURL_BWRAP", "/nonexistent/bwrap")
    with Ledger(":memory:") as ledger:
        with pytest.raises(EpisodeError) as e:
            run(
                FaultyEngine("hang"), lambda: envs.make("code-v0", max_turns=1),
                specs(2, "code-v0"), search_tokenizer, ledger,
            )
        # the sandbox is made at reset: each episode is an error record, none a usable one
        assert ledger.count() == 2 and not any(ledger.get(f"e{i}").valid for i in range(2))
    msg = str(e.value)
    assert "every one of the 2 episode(s) failed or ended by an error" in msg
    assert (
        "SandboxError: bubblewrap isolation does not work here, so the sandbox refuses to run"
        in msg
    )
    assert "bwrap ($TAURL_BWRAP) '/nonexistent/bwrap' is not an executable file" in msg


# ---------------------------------------------------------------------------------------
# A full disk: a real tmpfs of 1 MiB


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip(
            "mounting a tmpfs needs root and mount(8); the full-disk faults are not run here"
        )
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if p.returncode != 0:
        pytest.skip(
            f"mounting a tmpfs is not permitted here ({p.stderr.strip()}); "
            "the full-disk faults are not run"
        )
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill `disk` up, leaving about `leave` bytes free; returns the filler file."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def test_a_full_disk_while_writing_the_ledger_is_a_clear_error_and_keeps_what_was_stored(
    small_disk, search_tokenizer
):
    class OneTokenEngine(FaultyEngine):
        async def generate(self, prompt_ids, sampling):
            return Generation([search_tokenizer.eos_token_id], [-0.1], "eos", 0)

    path = small_disk / "ledger.sqlite"
    make_env = lambda: envs.make("search-v0", max_turns=1)  # noqa: E731
    eps = specs(40)
    with Ledger(path) as ledger:
        run(OneTokenEngine("ok"), make_env, eps[:2], search_tokenizer, ledger)
    filler = fill(small_disk)
    with pytest.raises(LedgerWriteError) as e:  # a start on a full disk
        Ledger(path)
    assert str(e.value).startswith(f"cannot open the ledger {path}: ")
    assert "(is its disk full or read-only?); the ledger file was not changed. Free space" in str(
        e.value
    )
    filler.unlink()
    with Ledger(path) as ledger:  # the disk fills up while the run writes
        filler = fill(small_disk)
        with pytest.raises(LedgerWriteError) as e:
            run(OneTokenEngine("ok"), make_env, eps[2:], search_tokenizer, ledger)
    assert str(e.value).startswith(
        f"cannot write to the ledger {path}: database or disk is full; nothing of this "
        "batch was stored (the transaction was rolled back, earlier episodes are intact)"
    )
    filler.unlink()  # space again: the ledger opens, holds whole records only, and goes on
    with Ledger(path) as ledger:
        stored = ledger.episode_ids()
        assert {"e0", "e1"} <= set(stored)
        # every stored record reads back whole
        assert all(ledger.get(i).episode_id == i for i in stored)
        batch, _ = run(OneTokenEngine("ok"), make_env, eps[:6], search_tokenizer, ledger)
        assert [t.episode_id for t in batch] == [
            f"e{i}" for i in range(6)
        ] and not ledger.rejections()


def test_a_full_disk_while_writing_a_checkpoint_leaves_no_partial_version(small_disk):
    from tokenizers import Tokenizer, models
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, "<unk>"))
    )
    torch.manual_seed(0)
    small = GPT2LMHeadModel(GPT2Config(vocab_size=2, n_embd=8, n_layer=1, n_head=1, n_positions=8))
    # > 1 MiB
    big = GPT2LMHeadModel(GPT2Config(vocab_size=2, n_embd=256, n_layer=2, n_head=2, n_positions=8))
    run_dir = RunDir(small_disk / "run")
    save_checkpoint(run_dir, 1, small, tok, phase="sft")
    before = {p: p.read_bytes() for p in run_dir.checkpoint(1).iterdir()}
    with pytest.raises(DiskWriteError) as e:
        save_checkpoint(run_dir, 2, big, tok, torch.optim.AdamW(big.parameters()), phase="rl")
    assert str(e.value).startswith(
        f"cannot write checkpoint v2 ({run_dir.checkpoint(2)}): the disk is full"
    )
    assert "nothing half-written was kept" in str(e.value)
    assert run_dir.versions() == [1]  # a restart resumes from v1, whole and unchanged
    assert {p: p.read_bytes() for p in run_dir.checkpoint(1).iterdir()} == before
    # no temporary left
    assert [p.name for p in (small_disk / "run" / "checkpoints").iterdir()] == ["v1"]
    # the same for a small file written atomically (state.json, evals/*.json)
    state = small_disk / "run" / "state.json"
    atomic_write_text(state, '{"sft_version": 1}')
    fill(small_disk)
    with pytest.raises(DiskWriteError, match=r"cannot write .*state\.json: the disk is full"):
        atomic_write_text(state, '{"sft_version": 1, "timings": {"x": ' + "1" * 100_000 + "}}")
    assert state.read_text() == '{"sft_version": 1}'
