"""Sandbox latency and throughput: cold creation, warm commands, 32 concurrent sandboxes.

    cold       new workspace (mkdir) + bwrap with every namespace + `true` + delete
    warm       one command in an existing (pooled) workspace: `true`, `python3 -c pass`,
               and `python3 -S -c pass` / `-I -S` (no site import: Python's own startup
               is most of the time; the sandbox adds the rest)
    reset      a pooled workspace reset from a template of --template-files small files
    zygote     `pass` and `print(1)` through a warm Python zygote (taurl.tools.zygote): one
               python3 per sandbox, each request a fresh fork of it
    bare       `true` and `python3 -S -c pass` spawned with no sandbox (the floor)
    throughput --concurrency sandboxes from a SandboxPool, each running --per-worker
               commands back to back; commands/s over the wall time

Goals on the 2-core dev machine: cold P99 <= 50 ms, warm P99 <= 20 ms. Run from the repo
root:

    .venv/bin/python benchmarks/sandbox.py
    .venv/bin/python benchmarks/sandbox.py --n 500 --concurrency 8 32 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from taurl.tools import Sandbox, SandboxConfig, SandboxPool
from taurl.tools import workspace as ws
from taurl.tools.zygote import WarmPython, acquire_warm

PY = ["python3", "-c", "pass"]
PY_S = ["python3", "-S", "-c", "pass"]
PY_IS = ["python3", "-I", "-S", "-c", "pass"]


def pct(xs: list[float], q: int) -> float:
    """q-th percentile in ms (statistics.quantiles, 'inclusive' method)."""
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1e3


def make_template(n_files: int) -> Path:
    d = Path(tempfile.mkdtemp(prefix="taurl-bench-tmpl-"))
    (d / "tests").mkdir()
    for i in range(n_files):
        (d / ("tests" if i % 2 else ".") / f"f{i}.py").write_text(
            f"def f{i}(x):\n    return x + {i}\n" * 20
        )
    return d


async def timed_runs(sb: Sandbox, cmd: list[str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = await sb.run(cmd)
        out.append(time.perf_counter() - t)
        if not r.ok:
            raise SystemExit(f"{cmd} failed in the sandbox: {r}")
    return out


async def cold(cfg: SandboxConfig, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        sb = Sandbox.create(cfg)
        r = await sb.run(["/bin/true"])
        sb.close()
        out.append(time.perf_counter() - t)
        if not r.ok:
            raise SystemExit(f"cold `true` failed: {r}")
    return out


async def throughput(cfg: SandboxConfig, conc: int, per_worker: int, cmd: list[str]) -> float:
    async with SandboxPool(conc, config=cfg) as pool:

        async def worker() -> None:
            async with pool.acquire() as sb:
                for _ in range(per_worker):
                    r = await sb.run(cmd)
                    if not r.ok:
                        raise SystemExit(f"{cmd} failed under load: {r}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        return conc * per_worker / (time.perf_counter() - t0)


async def zygote_runs(wp: WarmPython, src: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = await wp.run_code(src)
        out.append(time.perf_counter() - t)
        if not r.ok:
            raise SystemExit(f"{src!r} failed in the zygote: {r}")
    return out


async def zygote_throughput(cfg: SandboxConfig, conc: int, per_worker: int) -> float:
    async with SandboxPool(conc, config=cfg) as pool:
        zygotes = [acquire_warm(pool) for _ in range(conc)]
        wps = await asyncio.gather(*(z.__aenter__() for z in zygotes))  # started, not timed

        async def worker(wp: WarmPython) -> None:
            for _ in range(per_worker):
                r = await wp.run_code("pass")
                if not r.ok:
                    raise SystemExit(f"zygote `pass` failed under load: {r}")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(wp) for wp in wps))
        rate = conc * per_worker / (time.perf_counter() - t0)
        await asyncio.gather(*(z.__aexit__(None, None, None) for z in zygotes))
        return rate


def bare(cmd: list[str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, check=True)
        out.append(time.perf_counter() - t)
    return out


async def run(args: argparse.Namespace) -> None:
    cfg = SandboxConfig()
    Sandbox.create(cfg).close()  # probe isolation once, outside the measurements
    tmpl = make_template(args.template_files)
    rows: list[tuple[str, list[float], str]] = []
    rows.append(("bare `true` (no sandbox)", bare(["/bin/true"], args.n), ""))
    rows.append(
        ("bare python3 -S -c pass", bare(["/usr/bin/python3", "-S", "-c", "pass"], args.n), "")
    )
    rows.append(("cold: workspace + bwrap + true", await cold(cfg, args.n), "<= 50"))
    async with SandboxPool(1, config=cfg, template=tmpl) as pool, pool.acquire() as sb:
        for name, cmd in (("true", ["/bin/true"]), ("python3 -c pass", PY),
                          ("python3 -S -c pass", PY_S),
                          ("python3 -I -S -c pass", PY_IS)):  # fmt: skip
            rows.append((f"warm: {name}", await timed_runs(sb, cmd, args.n), "<= 20"))
        resets = []
        for _ in range(args.n):
            t = time.perf_counter()
            ws.reset_workspace(sb.workspace, tmpl, sb.owner)
            resets.append(time.perf_counter() - t)
        rows.append((f"reset from a {args.template_files}-file template", resets, ""))
        starts = []
        for _ in range(max(2, args.n // 10)):
            t = time.perf_counter()
            async with WarmPython.start(sb) as wp:
                starts.append(time.perf_counter() - t)
        rows.append(("zygote start (bwrap + python3, once/episode)", starts, ""))
        async with WarmPython.start(sb) as wp:
            for src in ("pass", "print(1)"):
                rows.append((f"warm zygote: {src}", await zygote_runs(wp, src, args.n), "<= 20"))
    ws.clear_workspace(tmpl)

    load = os.getloadavg()
    print(
        f"\nsandbox latency, n={args.n} each, {os.cpu_count()} CPUs, load "
        f"{load[0]:.2f} {load[1]:.2f}"
    )
    print(f"{'measure':44s} {'P50 ms':>8s} {'P99 ms':>8s} {'max ms':>8s}  goal P99")
    for name, xs, goal in rows:
        print(f"{name:44s} {pct(xs, 50):8.1f} {pct(xs, 99):8.1f} {max(xs) * 1e3:8.1f}  {goal}")
    print(f"\nthroughput, {args.per_worker} commands per sandbox")
    print(f"{'concurrent sandboxes':>20s} {'true cmd/s':>12s} {'python3 -S cmd/s':>18s}"
          f" {'zygote pass/s':>14s}")  # fmt: skip
    for c in args.concurrency:
        t_true = await throughput(cfg, c, args.per_worker, ["/bin/true"])
        t_py = await throughput(cfg, c, args.per_worker, PY_S)
        t_zy = await zygote_throughput(cfg, c, args.per_worker)
        print(f"{c:>20d} {t_true:12.1f} {t_py:18.1f} {t_zy:14.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=200, help="samples per latency measure")
    ap.add_argument(
        "--concurrency", type=int, nargs="+", default=[32], help="sandboxes running at once"
    )
    ap.add_argument(
        "--per-worker", type=int, default=10, help="commands each concurrent sandbox runs"
    )
    ap.add_argument("--template-files", type=int, default=20, help="files in the pool's template")
    args = ap.parse_args()
    if args.n < 2 or args.per_worker < 1 or min(args.concurrency) < 1:
        ap.error("--n must be >= 2, --per-worker and --concurrency >= 1")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
