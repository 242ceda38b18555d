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
