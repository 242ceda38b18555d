"""Environments: the protocol, the registry, the checker and the built-in envs."""

from taurl.envs.checker import check_env
from taurl.envs.core import Env, Task
from taurl.envs.registry import make, make_tasks, register, registered


def _search_env(**config):
    from taurl.envs.search import SearchEnv

    return SearchEnv(**config)


def _search_tasks(split, n, seed=0, families=None, split_by="country"):
    from taurl.envs.search import generate_tasks

    return generate_tasks(split, n=n, seed=seed, families=families, split_by=split_by)


def _code_env(**config):
    from taurl.envs.code import CodeEnv

    return CodeEnv(**config)


def _code_tasks(split, n, seed=0):
    from taurl.envs.code import generate_tasks

    return generate_tasks(split, n=n, seed=seed)


register("search-v0", _search_env, tasks=_search_tasks)
register("code-v0", _code_env, tasks=_code_tasks)

__all__ = ["Env", "Task", "check_env", "make", "make_tasks", "register", "registered"]
