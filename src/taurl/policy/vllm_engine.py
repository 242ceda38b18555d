"""`VLLMEngine`: the engine contract over a vLLM OpenAI-compatible HTTP server.

Token in, token out: the prompt goes as ids to ``/v1/completions`` with
``return_token_ids``; the sampled ids and their logprobs come back, nothing is re-encoded.
Start the server with ``--logprobs-mode processed_logprobs`` (`taurl.policy.vllm_server`
does) so a sampled token's logprob is ``log_softmax(logits / T)[id]``, the quantity the
learner recomputes; the default (raw) mode gives T = 1 logprobs at any temperature.

Routes used (vLLM 0.32.0, read from its source; the dev ones need
``VLLM_SERVER_DEV_MODE=1``): ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``;
``POST /pause?mode=abort|wait|keep``, ``POST /resume``, ``POST /abort_requests``
``{"request_ids": [...]}`` (vllm/entrypoints/rl/online/api_router.py);
``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}``
(vllm/entrypoints/serve/dev/rpc/api_router.py, `GPUModelRunner.reload_weights`);
``POST /update_weight_version {"new_version": "N"}``, ``GET /weight_info``;
``POST /reset_prefix_cache``.

Exactness rules this engine keeps:
- one version per completion: the client holds new requests and waits for in-flight
  ones before a reload, so ``Generation.policy_version`` is the version of every token;
- a reload is verified: a probe (a fixed prompt, T = 1, fixed seed) must give logprobs
  within ``probe_atol`` of a plain fp32 forward of the new checkpoint (``verify="exact"``),
  and, when it is off by more than float noise, must not be closer to the previous
  policy's probe than to the new one; with
  ``verify="change"`` (no local forward, for big models) it must differ from the
  previous probe unless the weight files are byte-identical. vLLM reload calls are known
  to keep stale weights silently (CPU 0.32.0 keeps the old ``lm_head`` of tied models);
- retries never draw a second sample: a request that was never sent is retried; one that
  may have reached the server is aborted there by its request id first, then re-sent
  with the same seed (every request carries a seed), so the retry is the same draw;
- partial rollouts (``pause("abort")``, then a reload, then ``resume``): vLLM 0.32.0's
  /pause?mode=abort ends every request it holds with finish_reason "abort", and a
  non-streamed answer then carries all the ids and logprobs sampled before the cut (the
  output processor accumulates them, `RequestState.make_request_output`), so the
  `Generation` is "abort" with those ids, as LocalEngine's; the rollout continues from
  them on the new weights by a new request that prefills them again (exact). Not used:
  mode "keep" then a reload would let the frozen requests continue on the new weights
  over KV computed by the old ones (neither policy's distribution), so `_load` refuses it;
  the per-token ``weight_versions`` spans vLLM records are only on its scale-out
  /inference/v1/generate route, not /v1/completions;
- a request that reaches the server after its /pause (it passed this client's gate just
  before) is queued there unsampled until /resume; `_drain` aborts it by id and
  `generate` sends it again after the resume, recorded as the version then served;
- ``top_p < 1`` is refused (``allow_top_p=True`` for evaluation only): processed
  logprobs are then renormalized over the nucleus, which the learner's full softmax
  does not reproduce, so the importance ratio would be biased.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from taurl.errors import EngineError
from taurl.policy.coroutines import run_coroutine
from taurl.policy.http import HTTPError, Response, request
from taurl.policy.protocol import EngineHealth, Generation, SamplingParams, check_pause_mode
from taurl.policy.vllm_sync import WeightSync, _check_same_model, _short

log = logging.getLogger(__name__)

VERIFY_MODES = ("exact", "change", "none")
TOP_P_REFUSED = (
    "top_p < 1 is refused by VLLMEngine for training: vLLM's processed logprobs are then "
    "renormalized over the kept nucleus, while the learner recomputes log_softmax(logits / T) "
    "over the whole vocabulary, so every importance ratio would be biased. Sample with "
    "top_p = 1 for training (temperature still applies), or pass allow_top_p=True "
    "(engine_options: {allow_top_p: true}) for evaluation, where no ratio is formed.")


class VLLMEngine(WeightSync):
    """An `Engine` over one vLLM OpenAI-compatible server at `url`.

    >>> engine = VLLMEngine("http://127.0.0.1:8000", tokenizer, version=3)  # doctest: +SKIP
    >>> engine.connect("runs/x/checkpoints/v3")      # checks the model, reloads, verifies
    >>> out = await engine.generate(ids, SamplingParams(max_tokens=32))

    model_name: the served name (None: the server's only model). timeout_s: one request's
    limit. retries: re-sends after a transport failure. max_concurrency: requests in
    flight at once from this client. verify: "exact" | "change" | "none" (module
    docstring); probe_atol: the largest probe |logprob diff| from the new checkpoint's fp32
    forward; probe_noise: a smaller diff is float noise (fp32 servers: ~5e-7), never
    staleness (reloading the same checkpoint is fine). A bf16 server: verify="change". server: a
    `VLLMServer` this engine owns (closed by `close`; its exit is reported when requests fail).
    """

    def __init__(self, url: str, tokenizer: Any = None, *, version: int = 0,
                 model_name: str | None = None, timeout_s: float = 600.0,
                 connect_timeout_s: float = 5.0, retries: int = 2, retry_wait_s: float = 0.5,
                 max_concurrency: int = 256, allow_top_p: bool = False, verify: str = "exact",
                 probe_tokens: int = 8, probe_atol: float = 1e-3, probe_noise: float = 1e-5,
                 seed: int = 0,
                 server: Any = None):
        if verify not in VERIFY_MODES:
            raise EngineError(f"unknown verify mode {verify!r}; choose one of {list(VERIFY_MODES)}")
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self._version = version
        self.model_name = model_name
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self.retry_wait_s = retry_wait_s
        self.max_concurrency = max_concurrency
        self.allow_top_p = allow_top_p
        self.verify = verify
        self.probe_tokens = probe_tokens
        self.probe_atol = probe_atol
        self.probe_noise = probe_noise
        self.server = server
        self._rng = random.Random(seed)
        self._max_context = 0
        self._served_root: str | None = None
        self._lock = threading.Lock()  # guards the counters below across event loops
        self._paused = False
        self._pause_mode = "wait"
        self._in_flight = 0
        self._last_probe: dict[str, Any] | None = None  # the served policy's probe answer
        self._weights_hash: str | None = None
        self.stats = {"requests": 0, "tokens": 0, "retries": 0, "aborted_on_retry": 0,
                      "reloads": 0, "reload_s": 0.0, "verify_s": 0.0, "resent_after_pause": 0}
        self._live: set[str] = set()  # request ids on their way to or on the server
        self._late: set[str] = set()  # of those, the ones `_drain` aborted after the pause

    # -- construction from a config ----------------------------------------------------
    @classmethod
    def from_options(cls, checkpoint_dir: str | Path, tokenizer: Any, *, version: int,
                     url: str | None = None, python: str | None = None,
                     server_options: dict[str, Any] | None = None,
                     max_batch_size: int | None = None, **options: Any) -> VLLMEngine:
        """Connect to the server at `url`, or start one with `python` (the vLLM venv's
        interpreter; default ``$TAURL_VLLM_PYTHON``), serving `checkpoint_dir` as `version`.

        max_batch_size (the recipe's concurrency) caps this client's requests in flight.
        server_options: `VLLMServer`'s (port, cache_dir, kv_cache_gib, max_model_len, ...).
        """
        from taurl.policy.adapter import serving_dir

        # a LoRA checkpoint: the server starts on its merged copy
        checkpoint_dir = serving_dir(checkpoint_dir)
        server = None
        if url is None:
            from taurl.policy.vllm_server import VLLMServer

            server = VLLMServer(checkpoint_dir, python=python, **(server_options or {}))
            server.start()
            url = server.url
        elif python is not None or server_options:
            raise EngineError("engine_options give both url (an existing server) and python/"
                              "server_options (start one); give one of them")
        if max_batch_size is not None:
            options.setdefault("max_concurrency", max_batch_size)
        try:
            engine = cls(url, tokenizer, version=version, server=server, **options)
        except TypeError as e:
            if server is not None:
                server.stop()
            raise EngineError(f"bad engine_options for engine 'vllm': {e}") from e
        try:
            engine.connect(checkpoint_dir)
        except BaseException:
            engine.close()
            raise
        return engine

    def connect(self, checkpoint_dir: str | Path) -> None:
        """Check the server serves a model shaped like `checkpoint_dir`, then load it."""
        run_coroutine(self._connect(Path(checkpoint_dir)))

    async def _connect(self, checkpoint_dir: Path) -> None:
        models = await self._call("GET", "/v1/models")
        data = (models.body or {}).get("data") if isinstance(models.body, dict) else None
        if not data:
            raise EngineError(f"the server at {self.url} lists no model at /v1/models: "
                              f"{models.body!r}")
        names = [m.get("id") for m in data]
        if self.model_name is None:
            if len(data) > 1:
                raise EngineError(f"the server at {self.url} serves {names}; set model_name")
            self.model_name = names[0]
        if self.model_name not in names:
            raise EngineError(f"the server at {self.url} serves {names}, not {self.model_name!r}; "
                              "point url at the right server or fix model_name")
        info = data[names.index(self.model_name)]
        self._max_context = int(info.get("max_model_len") or 0)
        self._served_root = info.get("root")
        _check_same_model(self._served_root, checkpoint_dir, self.url)
        await self._load(checkpoint_dir, self._version)

    # -- the engine contract ----------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        if not self._max_context:
            raise EngineError("VLLMEngine is not connected; call connect(checkpoint_dir) first")
        return self._max_context

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        if sampling.top_p < 1 and not self.allow_top_p:
            raise EngineError(TOP_P_REFUSED)
        if sampling.top_k:  # refused rather than silently dropped
            raise EngineError("VLLMEngine does not send top_k; sample with top_k on the local "
                              "engine (engine: local)")
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EngineError("prompt_ids is empty; render the prompt with the chat template first")
        if len(prompt) >= self.max_context:
            raise EngineError(f"prompt has {len(prompt)} tokens; the server's context is "
                              f"{self.max_context}")
        t_submit = time.perf_counter()
        seed = sampling.seed if sampling.seed is not None else self._rng.randrange(2**31)
        while True:
            await self._enter()
            version = self._version  # no reload runs while this request is in flight
            t_start = time.perf_counter()
            try:
                choice, late = await self._complete(prompt, sampling, seed=seed)
            finally:
                with self._lock:
                    self._in_flight -= 1
            if not late:
                break
            # it reached the server after the pause and sat in its queue, unsampled, until
            # `_drain` aborted it: sent again after `resume`, with the same seed, on (and
            # recorded as) the version then served, as LocalEngine serves a queued request
            self.stats["resent_after_pause"] += 1
        ids = [int(t) for t in choice.get("token_ids") or []]
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        if len(lps) != len(ids) or any(x is None for x in lps):
            raise EngineError(f"the server returned {len(ids)} token ids but {len(lps)} logprobs; "
                              "is it vLLM >= 0.10 with return_token_ids support?")
        reason, matched = _finish(choice, sampling)
        self.stats["tokens"] += len(ids)
        return Generation(ids, [float(x) for x in lps], reason, version, matched, len(prompt),
                          queue_s=t_start - t_submit, generate_s=time.perf_counter() - t_start)

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None:
        """Reload the server's weights from `checkpoint_dir`, record `version`, verify (an
        adapter only as the version it records: `taurl.policy.adapter.check_served_version`)."""
        from taurl.policy.adapter import check_served_version

        check_served_version(checkpoint_dir, version)
        await self._load(Path(checkpoint_dir), version)

    async def pause(self, mode: str = "wait") -> None:
        """Hold new requests here and pause the server (`Engine.pause`)."""
        check_pause_mode(mode)
        with self._lock:
            self._paused, self._pause_mode = True, mode
        await self._admin("POST", f"/pause?mode={mode}")
        if mode != "keep":  # the server drained or aborted; its last answers may be on the way
            await self._drain()

    async def resume(self) -> None:
        await self._admin("POST", "/resume")
        with self._lock:
            self._paused, self._pause_mode = False, "wait"

    async def health(self) -> EngineHealth:
        try:
            r = await request("GET", self.url + "/health", timeout_s=10,
                              connect_timeout_s=self.connect_timeout_s)
            ok, detail = r.status == 200, "" if r.status == 200 else f"/health answered {r.status}"
        except HTTPError as e:
            ok, detail = False, self._dead(str(e))
        return EngineHealth(ok, self._version, self._paused, self._in_flight, detail)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()

    # -- requests ---------------------------------------------------------------------
    async def _enter(self) -> None:
        """Wait while paused or over the concurrency cap, then count this request in."""
        while True:
            with self._lock:
                if not self._paused and self._in_flight < self.max_concurrency:
                    self._in_flight += 1
                    self.stats["requests"] += 1
                    return
            await asyncio.sleep(0.002)

    async def _drain(self) -> None:
        """Wait until no request of this client is in flight, the server being paused.

        vLLM 0.32.0's pause (abort or wait) only covers the requests it holds when it is
        called; one that arrives later (it passed `_enter` just before the pause) is queued,
        unsampled, until /resume (`Scheduler.schedule` admits no waiting request while
        PAUSED_NEW), so waiting for it would hang the update. Once the server answered
        /pause nothing runs there, so such a request is aborted by id (it has sampled
        nothing) and `generate` sends it again after the resume.
        """
        t0 = time.perf_counter()
        while self._in_flight:
            await asyncio.sleep(0.002)
            if time.perf_counter() - t0 > 0.05 and self._live:
                # answers in transit had time to land
                with self._lock:
                    stuck = sorted(self._live)
                    self._late.update(stuck)
                await self._call("POST", "/abort_requests",
                                 {"request_ids": [f"cmpl-{r}-0" for r in stuck]}, 10)
                t0 = time.perf_counter()

    def _body(self, prompt: list[int], sampling: SamplingParams, seed: int, request_id: str,
              max_tokens: int, ignore_eos: bool = False) -> dict[str, Any]:
        return {"model": self.model_name, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "seed": seed,
                "logprobs": 0, "return_token_ids": True, "stop": list(sampling.stop),
                "stop_token_ids": list(sampling.stop_token_ids), "include_stop_str_in_output": True,
                "skip_special_tokens": False, "spaces_between_special_tokens": False,
                "ignore_eos": ignore_eos, "request_id": request_id, "n": 1, "stream": False}

    async def _complete(self, prompt: list[int], sampling: SamplingParams, *,
                        ignore_eos: bool = False,
                        seed: int | None = None) -> tuple[dict[str, Any], bool]:
        """One completion choice, and whether `_drain` aborted it unsampled after a pause
        (then it must be sent again); retried on transport failures without a second sample."""
        # a seed on every request: a re-send after an abort is the same draw, not a new one
        if seed is None:
            seed = sampling.seed if sampling.seed is not None else self._rng.randrange(2**31)
        max_tokens = min(sampling.max_tokens, self.max_context - len(prompt))
        base = uuid.uuid4().hex
        for attempt in range(self.retries + 1):
            rid = f"taurl-{base}-{attempt}"
            body = self._body(prompt, sampling, seed, rid, max_tokens, ignore_eos)
            with self._lock:
                self._live.add(rid)
            try:
                r = await request("POST", self.url + "/v1/completions", body,
                                  timeout_s=self.timeout_s,
                                  connect_timeout_s=self.connect_timeout_s)
            except HTTPError as e:
                self._forget(rid)
                if attempt == self.retries:
                    raise EngineError(self._dead(f"completion failed after {attempt + 1} "
                                                 f"attempt(s): {e}")) from e
                self.stats["retries"] += 1
                if e.sent:  # it may be running on the server: end it before sending it again
                    await self._abort_quietly(rid)
                await asyncio.sleep(self.retry_wait_s * (attempt + 1))
                continue
            aborted_late = self._forget(rid)
            if r.status in (429, 503) and attempt < self.retries:  # refused before any sampling
                self.stats["retries"] += 1
                await asyncio.sleep(self.retry_wait_s * (attempt + 1))
                continue
            if r.status >= 500:  # the engine behind the API server failed (or is shutting down)
                raise EngineError(self._dead(f"/v1/completions answered {r.status}: "
                                             f"{_short(r.body)}"))
            if r.status != 200:
                raise EngineError(f"/v1/completions answered {r.status}: {_short(r.body)}")
            choices = r.body.get("choices") if isinstance(r.body, dict) else None
            if not choices:
                raise EngineError(f"/v1/completions answered without choices: {_short(r.body)}")
            late = (aborted_late and choices[0].get("finish_reason") == "abort"
                    and not choices[0].get("token_ids"))
            return choices[0], late
        raise AssertionError("unreachable")

    def _forget(self, rid: str) -> bool:
        """Take `rid` off the live set; True when `_drain` aborted it after a pause."""
        with self._lock:
            self._live.discard(rid)
            late = rid in self._late
            self._late.discard(rid)
        return late

    async def _abort_quietly(self, request_id: str) -> None:
        # vLLM names the engine request "cmpl-{request_id}-{choice}"
        try:
            await request("POST", self.url + "/abort_requests",
                          {"request_ids": [f"cmpl-{request_id}-0"]},
                          timeout_s=10, connect_timeout_s=self.connect_timeout_s)
            self.stats["aborted_on_retry"] += 1
        except HTTPError:
            pass  # the server is gone: nothing runs there any more

    async def _call(self, method: str, path: str, payload: Any = None,
                    timeout_s: float = 60.0) -> Response:
        try:
            return await request(method, self.url + path, payload, timeout_s=timeout_s,
                                 connect_timeout_s=self.connect_timeout_s)
        except HTTPError as e:
            raise EngineError(self._dead(str(e))) from e

    async def _admin(self, method: str, path: str, payload: Any = None,
                     timeout_s: float = 600.0) -> Any:
        r = await self._call(method, path, payload, timeout_s)
        if r.status == 404:
            raise EngineError(f"the server at {self.url} has no {path.split('?')[0]} route: start "
                              "it with VLLM_SERVER_DEV_MODE=1 (taurl.policy.vllm_server does)")
        if r.status != 200:
            raise EngineError(f"{method} {path} answered {r.status}: {_short(r.body)}")
        return r.body

    def _dead(self, what: str) -> str:
        if self.server is not None:
            code = self.server.exit_code()
            state = "is running" if code is None else f"exited with code {code}"
            return (f"{what}; the vLLM server taurl started {state}; its log "
                    f"ends:\n{self.server.log_tail()}")
        return (f"{what}. No vLLM server answers at {self.url}: start one with "
                "`python -m taurl.policy.vllm_server --model DIR` (docs/models-and-engines.md) or "
                "fix the url")

def _finish(choice: dict[str, Any], sampling: SamplingParams) -> tuple[str, Any]:
    """taurl's finish reason from vLLM's (finish_reason, stop_reason)."""
    reason, matched = choice.get("finish_reason"), choice.get("stop_reason")
    if reason == "length":
        return "length", None
    if reason == "abort":
        return "abort", None
    if reason == "stop":
        if matched is None:  # vLLM reports EOS as "stop" with no stop_reason
            return "eos", (choice.get("token_ids") or [None])[-1]
        if isinstance(matched, int) and matched not in sampling.stop_token_ids:
            return "eos", matched  # a generation-config end id
        return "stop", matched
    raise EngineError(f"the server ended a completion with finish_reason {reason!r}")


__all__ = ["VLLMEngine", "TOP_P_REFUSED"]
