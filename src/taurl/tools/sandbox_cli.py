"""`taurl sandbox exec [limits] -- CMD…`: run one command the way rollouts do.

    taurl sandbox exec -- python3 -c 'print(6 * 7)'
    taurl sandbox exec --timeout 2 --memory-mb 256 --json -- sh -c 'yes | head -c 1000000'
    taurl sandbox exec --workspace ./task --stdin input.txt -- python3 main.py

The command runs in a fresh sandbox (a copy of ``--workspace``, or an empty one) with the
same isolation, rlimits, wall-clock kill and output caps as an episode's. Its stdout and
stderr are passed through (as captured: cut at ``--max-output-kb``) and its exit status
becomes ours (128+N when signal N killed it; 124 on timeout, like timeout(1)). ``--json``
prints the whole `ExecResult` instead.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys

from taurl.errors import ConfigError
from taurl.tools.sandbox import Sandbox, SandboxConfig, SandboxLimits

_D = SandboxLimits()


def add_sandbox_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``sandbox exec`` to the `taurl` command's subparsers."""
    p = sub.add_parser("sandbox", help="run a command in the sandbox (isolation, rlimits, timeout)",
                       description="Sandbox tools. `taurl sandbox exec -- CMD` runs one command "
                                   "the way "
                       "rollouts do.")
    ssub = p.add_subparsers(dest="sandbox_command", metavar="SUBCOMMAND")
    e = ssub.add_parser("exec", help="run one command in a fresh sandbox",
                        formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__,
                        usage="taurl sandbox exec [limits] -- CMD [ARG ...]")
    e.add_argument("--timeout", type=float, default=_D.timeout_s,
                   help="wall-clock seconds (default %(default)s)")
    e.add_argument("--cpu", type=int, default=_D.cpu_s,
                   help="CPU seconds, RLIMIT_CPU (default %(default)s)")
    e.add_argument("--memory-mb", type=int, default=_D.memory_bytes >> 20,
                   help="address space, MiB (default %(default)s)")
    e.add_argument("--nproc", type=int, default=_D.nproc,
                   help="processes + threads (default %(default)s)")
    e.add_argument("--fsize-mb", type=int, default=_D.fsize_bytes >> 20,
                   help="largest file written, MiB (default %(default)s)")
    e.add_argument("--nofile", type=int, default=_D.nofile,
                   help="open file descriptors (default %(default)s)")
    e.add_argument("--tmp-mb", type=int, default=_D.tmp_bytes >> 20,
                   help="size of /tmp, MiB (default %(default)s)")
    e.add_argument("--max-output-kb", type=int, default=_D.max_output_bytes >> 10,
                   help="output kept per stream, KiB (default %(default)s)")
    e.add_argument("--workspace", help="directory copied into the sandbox's /workspace (default: "
                                       "empty)")
    e.add_argument("--stdin", help="file fed to the command's stdin ('-' for ours)")
    e.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment variable")
    e.add_argument("--json", action="store_true", help="print the ExecResult as JSON")
    e.add_argument("--unsafe-no-isolation", action="store_true",
                   help="run WITHOUT namespaces (rlimits and timeout only). Never with untrusted "
                        "code.")
    e.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")


def run_sandbox_command(args: argparse.Namespace) -> int:
    """Run `taurl sandbox exec`; returns the exit status for the shell."""
    if getattr(args, "sandbox_command", None) != "exec":
        raise ConfigError("say what to do: taurl sandbox exec [limits] -- CMD [ARG ...]")
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    problems = [] if cmd else ["no command given: put it after --, e.g. taurl sandbox exec -- "
                               "python3 -c 'print(1)'"]
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            problems.append(f"--env {item!r} must look like NAME=VALUE")
        env[name] = value
    try:
        limits = SandboxLimits(timeout_s=args.timeout, cpu_s=args.cpu,
                               memory_bytes=args.memory_mb << 20,
                               nproc=args.nproc, fsize_bytes=args.fsize_mb << 20,
                               nofile=args.nofile, tmp_bytes=args.tmp_mb << 20,
                               max_output_bytes=args.max_output_kb << 10,
                               max_drain_bytes=max(_D.max_drain_bytes, args.max_output_kb << 10))
    except ConfigError as e:
        problems += e.problems
    if problems:
        raise ConfigError(problems)
    stdin = None
    if args.stdin == "-":
        stdin = sys.stdin.buffer.read()
    elif args.stdin:
        with open(args.stdin, "rb") as f:
            stdin = f.read()
    config = SandboxConfig(limits=limits, env=env, unsafe_no_isolation=args.unsafe_no_isolation)
    with Sandbox.create(config, template=args.workspace) as sb:
        result = asyncio.run(sb.run(cmd, stdin=stdin))
    if args.json:
        print(json.dumps({**dataclasses.asdict(result), "command": cmd}, indent=2))
    else:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
        if result.killed_reason:
            print(f"taurl sandbox: killed ({result.killed_reason}) after {result.wall_s:.2f} s",
                  file=sys.stderr)
    if result.timed_out:
        return 124
    return result.exit_code
