"""Environments: the protocol, the registry, the checker and the built-in envs."""

from taurl.envs.checker import check_env
from taurl.envs.core import Env, Task
from taurl.envs.registry import import_env_modules, make, make_tasks, register, registered, spec


def _search_tasks(split, n, seed=0, families=None, split_by="country"):
    from taurl.envs.search import generate_tasks

    return generate_tasks(split, n=n, seed=seed, families=families, split_by=split_by)


def _search_expert(task, rng, p_skip_search=0.0, p_guess_right=0.5):
    from taurl.envs.search.expert import search_expert

    return search_expert(task, rng, p_skip_search=p_skip_search, p_guess_right=p_guess_right)


def _search_verifier():
    from taurl.envs.search.verifier import SearchVerifier

    return SearchVerifier()


def _search_hooks():
    from taurl.envs.search.hooks import SearchPolicyHooks

    return SearchPolicyHooks()


def _code_tasks(split, n, seed=0, families=None):
    from taurl.envs.code import generate_tasks

    return generate_tasks(split, n=n, seed=seed, families=families)


def _code_expert(task, rng, p_bug=0.0, p_skip_tests=0.0):
    from taurl.envs.code import expert

    return expert(task, rng, p_bug=p_bug, p_skip_tests=p_skip_tests)


def _code_hooks():
    from taurl.envs.code.hooks import CodePolicyHooks

    return CodePolicyHooks()


def _code_verifier():
    from taurl.envs.code import make_holdout_verifier

    return make_holdout_verifier()


def _frozenlake_tasks(split, n, seed=0, size=4, slippery=False, p_frozen=0.8):
    from taurl.envs.gym.frozenlake import frozenlake_tasks

    return frozenlake_tasks(split, n=n, seed=seed, size=size, slippery=slippery, p_frozen=p_frozen)


def _frozenlake_expert(task, rng, p_random=0.0, max_moves=64):
    from taurl.envs.gym.frozenlake import frozenlake_expert

    return frozenlake_expert(task, rng, p_random=p_random, max_moves=max_moves)


def _frozenlake_verifier():
    from taurl.envs.gym.frozenlake import frozenlake_verifier

    return frozenlake_verifier()


def _taxi_tasks(split, n, seed=0, rainy=False):
    from taurl.envs.gym.taxi import taxi_tasks

    return taxi_tasks(split, n=n, seed=seed, rainy=rainy)


def _taxi_expert(task, rng, p_random=0.0, max_moves=64):
    from taurl.envs.gym.taxi import taxi_expert

    return taxi_expert(task, rng, p_random=p_random, max_moves=max_moves)


def _taxi_verifier():
    from taurl.envs.gym.taxi import taxi_verifier

    return taxi_verifier()


# factories as "module:attr" strings are imported on first use (Gymnasium's entry points)
register("search-v0", "taurl.envs.search:SearchEnv", tasks=_search_tasks, expert=_search_expert,
         verifier=_search_verifier, policy_hooks=_search_hooks)
register("code-v0", "taurl.envs.code:CodeEnv", tasks=_code_tasks, expert=_code_expert, verifier=_code_verifier,
         policy_hooks=_code_hooks)
register("frozenlake-v0", "taurl.envs.gym.frozenlake:frozenlake_env", tasks=_frozenlake_tasks,
         expert=_frozenlake_expert, verifier=_frozenlake_verifier)
register("taxi-v0", "taurl.envs.gym.taxi:taxi_env", tasks=_taxi_tasks, expert=_taxi_expert, verifier=_taxi_verifier)

__all__ = ["Env", "Task", "check_env", "import_env_modules", "make", "make_tasks", "register", "registered", "spec"]
