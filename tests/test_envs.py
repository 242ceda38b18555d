"""Every registered environment passes check_env; the registry explains its errors."""

import pytest

from taurl.envs import check_env, make, make_tasks, registered
from taurl.errors import UnknownEnvError


@pytest.mark.parametrize("name", registered())
def test_every_registered_env_passes_check_env(name):
    task = make_tasks(name, "train", n=1, seed=0)[0]
    check_env(make(name), task)


def test_unknown_env_says_did_you_mean():
    with pytest.raises(UnknownEnvError, match="Did you mean 'search-v0'"):
        make("serch-v0")
