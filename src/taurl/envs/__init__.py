"""Environments: the protocol, the registry, the checker and the built-in envs."""

from taurl.envs.checker import check_env
from taurl.envs.core import Env, Task
from taurl.envs.registry import make, register, registered


def _search_env(**config):
    from taurl.envs.search import SearchEnv

    return SearchEnv(**config)


register("search-v0", _search_env)


def _code_env(**config):
    from taurl.envs.code import CodeEnv

    return CodeEnv(**config)


register("code-v0", _code_env)

__all__ = ["Env", "Task", "check_env", "make", "register", "registered"]
