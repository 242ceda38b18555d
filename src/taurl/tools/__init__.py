"""Tools the agent acts with, and the sandbox that runs its code (`taurl.tools.sandbox`)."""

from taurl.tools.sandbox import ExecResult, Sandbox, SandboxConfig, SandboxLimits, find_bwrap
from taurl.tools.sandbox_pool import SandboxPool

__all__ = ["ExecResult", "Sandbox", "SandboxConfig", "SandboxLimits", "SandboxPool", "find_bwrap"]
from taurl.tools.executor import CallOutcome, ToolBox, render_value, run_blocking  # noqa: E402
from taurl.tools.gate import DEFAULT_RULES, RULES, Gate, GateConfig, GateDecision, RuleAction  # noqa: E402
from taurl.tools.parsers import ParseResult, ToolCall, parse_hermes, parse_xml  # noqa: E402
from taurl.tools.specs import SCOPES, ToolSpec, function_spec, tool, validate_arguments  # noqa: E402
from taurl.tools.tool_env import ToolEnv  # noqa: E402

__all__ += [
    "DEFAULT_RULES", "RULES", "SCOPES", "CallOutcome", "Gate", "GateConfig", "GateDecision",
    "ParseResult", "RuleAction", "ToolBox", "ToolCall", "ToolEnv", "ToolSpec", "function_spec",
    "parse_hermes", "parse_xml", "render_value", "run_blocking", "tool", "validate_arguments",
]
