"""Environments: the protocol, the registry and the built-in envs."""

from taurl.envs.core import Env, Task
from taurl.envs.registry import make, register, registered

__all__ = ["Env", "Task", "make", "register", "registered"]
