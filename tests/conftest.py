"""Session-wide test settings."""

import logging
import os
import re

import pytest

# as the taurl command does (taurl.cli.main), before any test imports torch: spinning OpenMP
# workers collapse throughput on the shared cores tests run on
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session", autouse=True)
def taurl_cache(tmp_path_factory):
    """Every test builds and loads the BM25 index in a private cache, never in ~/.cache."""
    path = tmp_path_factory.getbasetemp() / "taurl-cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TAURL_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def search_tokenizer(taurl_cache):
    """A BPE tokenizer for search-v0 episodes (a slice of the corpus, 500 training
    questions and the system prompt), trained once for every module that needs one."""
    from taurl import envs
    from taurl.envs.search import build_corpus, generate_tasks
    from taurl.policy import build_tokenizer

    texts = [d.text for d in build_corpus()[::50]] + [
        t.prompt for t in generate_tasks("train", n=500, seed=0)
    ]
    return build_tokenizer(texts + [envs.make("search-v0").system_prompt], vocab_size=4096)


@pytest.fixture
def one_thread():
    """torch on one CPU thread for the test: one summation order, so results compare bitwise."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_configure(config):
    """Markers registered here (pyproject's list is --strict-markers' other source)."""
    config.addinivalue_line("markers", "vllm: needs a real vLLM server (TAURL_VLLM_PYTHON set); "
                            "run with pytest -m vllm")
    config.addinivalue_line("markers", "attack: must fail when its protection is switched off "
                            "(tests/mutation_check.py)")
    config.addinivalue_line(
        "markers",
        "limits: must fail when the sandbox's resource limits are lifted (tests/mutation_check.py)",
    )
    config.addinivalue_line(
        "markers", "mutation_exempt(mutation, reason): skipped under that mutation"
    )


# --- the mutation check (tests/mutation_check.py): honoured here only, never by src/ ---

MUTATION = os.environ.get("TAURL_TEST_MUTATION", "")


@pytest.fixture(scope="session", autouse=True)
def mutation():
    """Switch a protection off for the whole session when TAURL_TEST_MUTATION names one."""
    if not MUTATION:
        yield None
        return
    from mutation_check import apply

    with pytest.MonkeyPatch.context() as mp:
        apply(MUTATION, mp)
        yield MUTATION


def pytest_collection_modifyitems(config, items):
    if not MUTATION:
        return
    from mutation_check import EXEMPT

    for item in items:
        for mark in item.iter_markers("mutation_exempt"):
            if mark.args[0] == MUTATION:
                item.add_marker(pytest.mark.skip(reason=EXEMPT + mark.args[1]))


# --- pytest-xdist: `make test` runs `pytest -n 2 --dist loadfile` ----------------------
# Each test file is one unit on one worker (its module fixtures are built once, its tests run
# in order). The files that start sandboxes share one unit: every sandbox runs as the same
# host uid, whose process limit (nproc) test_sandbox_security's fork tests fill for seconds,
# which would fail a sandbox starting on the other worker meanwhile. (xdist's own
# `xdist_group` mark does not group under pytest 9: it renames `_nodeid`, which pytest 9 no
# longer reads; its scheduler hook does the same job.)
STARTS_SANDBOXES = re.compile(r"[Ss]andbox|zygote|WarmPython|CodeEnv|code-v0|code\.yaml")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    starts: dict[str, bool] = {}

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path not in starts:
                text = (
                    (config.rootpath / path).read_text(encoding="utf-8")
                    if path.endswith(".py")
                    else ""
                )
                starts[path] = bool(STARTS_SANDBOXES.search(text))
            return "sandbox-starting files" if starts[path] else path

    return FileScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread_per_worker():
    """Under xdist, each worker keeps to one torch thread (two workers on two cores)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
    yield


@pytest.fixture
def gate_forward():
    """``gate(model, at_call) -> (reached, release)``: the model's `at_call`-th forward sets
    `reached` and blocks until `release` is set (30 s at most), so a test can act while an
    engine is inside a decode step. An engine over a gated model needs ``slim_decode=False``:
    its slim path decodes without calling the model's forward."""
    import functools
    import threading

    def gate(model, at_call: int):
        reached, release = threading.Event(), threading.Event()
        calls = {"n": 0}
        forward = model.forward

        @functools.wraps(forward)
        def gated(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == at_call:
                reached.set()
                release.wait(30)
            return forward(*args, **kwargs)

        model.forward = gated
        return reached, release

    return gate


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(TinkerServer, tinker.ServiceClient): `taurl serve-tinker` on loopback serving a tiny
    random-init policy as "tiny", one per test module (tests/test_tinker_*.py)."""
    pytest.importorskip("tinker")
    pytest.importorskip("starlette")
    from tinker_harness import build_policy, start

    policy = build_policy(tmp_path_factory.mktemp("policy"))
    server, client = start(policy, tmp_path_factory.mktemp("run"))
    yield server, client
    server.stop()
    # the SDK's session keeps a heartbeat thread after its server is gone; its warning every
    # 10 s for the rest of the test session says only that this test server stopped
    logging.getLogger("tinker.lib.internal_client_holder").addFilter(_stopped_server_heartbeats)


def _stopped_server_heartbeats(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Session heartbeat failed")
