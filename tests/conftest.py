"""Session-wide test settings."""

import pytest

import taurl  # noqa: F401  (first: sets OMP_WAIT_POLICY before any test imports torch)


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

    texts = [d.text for d in build_corpus()[::50]] + [t.prompt for t in generate_tasks("train", n=500, seed=0)]
    return build_tokenizer(texts + [envs.make("search-v0").system_prompt], vocab_size=4096)


def pytest_configure(config):
    """Markers registered here (pyproject's list is --strict-markers' other source)."""
    config.addinivalue_line("markers", "vllm: needs a real vLLM server (TAURL_VLLM_PYTHON set); "
                            "run with pytest -m vllm")
