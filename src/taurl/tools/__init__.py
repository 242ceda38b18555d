"""Tools the agent acts with, and the sandbox that runs its code (`taurl.tools.sandbox`)."""

from taurl.tools.sandbox import ExecResult, Sandbox, SandboxConfig, SandboxLimits, find_bwrap
from taurl.tools.sandbox_pool import SandboxPool

__all__ = ["ExecResult", "Sandbox", "SandboxConfig", "SandboxLimits", "SandboxPool", "find_bwrap"]
