"""The local inference engine: token in, token out, with continuous batching.

Many agent loops call ``await engine.generate(prompt_ids, sampling)`` at once. A single
worker thread serves them all: new requests are prefilled together (left-padded) and
merged into the running batch, every decode step advances every active sequence by one
token in one shared forward pass over a KV cache, and a finished sequence leaves the
batch at once so its slot is free for the next request (continuous batching).

What comes back is exactly what was sampled: the ids, their behaviour logprobs
``log_softmax(logits / T)[id]`` (before top-p truncation, the quantity the learner
recomputes; at T = 0, greedy, the logprobs are those of T = 1) and the policy version
that served the request. Nothing is decoded and re-encoded.

Finish reasons: ``"stop"`` (a stop string or stop token id appeared; the ids that
completed it are kept, so the stream stays token-exact), ``"eos"`` (the model's end
token), ``"length"`` (max_tokens or the model's context ran out), ``"abort"`` (ended by
``pause("abort")``; the partial ids and logprobs are returned, nothing is lost).

The engine contract (`Engine`): ``generate``, ``load_weights(checkpoint_dir, version)``,
``pause(mode)`` / ``resume()`` around an update, ``health()``, ``version``,
``max_context``. `make_engine` builds one from a config key (``local`` or ``vllm``).
No completion ever mixes two policy versions: a weight load waits until nothing is in
flight (or refuses while paused requests are kept), so ``Generation.policy_version`` is
the version that produced every one of its tokens.
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from taurl.errors import EngineError
from taurl.policy.kv_cache import BatchKV
from taurl.policy.slim_decode import SlimDecoder, agrees

PREFILL_PAD_WASTE = 0.25  # padding a prefill forward may add, as a share of its real tokens

log = logging.getLogger("taurl.engine")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    temperature: 0 means greedy. top_p: nucleus mass kept (1.0 keeps all).
    stop: strings that end the completion once the decoded new text contains one.
    stop_token_ids: ids that end the completion (the engine's EOS always does).
    seed: makes the draw reproducible for this request (None: the engine's generator).
    priority: lower is served first when requests wait for a place in the running batch
        (vLLM's convention); equal priorities are first come, first served. `LocalEngine`
        honours it; the vLLM client does not send it (a server runs first come, first served).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    priority: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise EngineError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise EngineError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise EngineError(f"max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class Generation:
    """One completion. token_ids and logprobs: (n,), aligned."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "eos" | "length" | "abort"
    policy_version: int
    stop_matched: str | int | None = None  # the stop string or id that ended it
    prompt_tokens: int = 0
    queue_s: float = 0.0  # time waiting for a batch slot
    generate_s: float = 0.0  # time from admission to the last token


PAUSE_MODES = ("wait", "abort", "keep")


@dataclass(frozen=True)
class EngineHealth:
    """What `Engine.health` reports. ok: the engine can serve now; detail: why not."""

    ok: bool
    version: int
    paused: bool = False
    in_flight: int = 0
    detail: str = ""


@runtime_checkable
class Generator(Protocol):
    """What the agent loop needs: sample a completion (scripted engines offer only this)."""

    @property
    def version(self) -> int: ...

    @property
    def max_context(self) -> int: ...

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation: ...


@runtime_checkable
class Engine(Generator, Protocol):
    """The full engine contract the recipe needs (local, or an HTTP server).

    generate: prompt ids -> sampled ids, behaviour logprobs, finish reason, and the policy
      version that produced every token (`Generation.policy_version`).
    load_weights: serve the checkpoint at `checkpoint_dir` as policy `version`; returns
      when the new weights serve (verified, for a server). Requests that arrive meanwhile
      wait; none is served by two versions.
    pause(mode): stop serving. "wait": in-flight requests finish first; "abort": they end
      now with finish_reason "abort" and their partial tokens; "keep": they freeze and
      continue at `resume` (a weight load while any is kept is refused: it would mix two
      versions in one completion). New requests wait until `resume`.
    health: whether the engine can serve now, and its version.
    close: release what the engine holds (a server it started, connections).
    """

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None: ...

    async def pause(self, mode: str = "wait") -> None: ...

    async def resume(self) -> None: ...

    async def health(self) -> EngineHealth: ...

    def close(self) -> None: ...


def check_pause_mode(mode: str) -> str:
    if mode not in PAUSE_MODES:
        raise EngineError(f"unknown pause mode {mode!r}; choose one of {list(PAUSE_MODES)}")
    return mode


def make_engine(kind: str, checkpoint_dir: str | Path, tokenizer: Any, *, version: int,
                **options: Any) -> Engine:
    """The engine named `kind` serving the checkpoint at `checkpoint_dir` as `version`.

    kind "local": `LocalEngine` in this process over its own copy of the weights; options
      are LocalEngine's (max_batch_size, seed, max_context, prefix_cache_tokens, slim_decode).
    kind "vllm": `VLLMEngine` over a vLLM OpenAI-compatible server; options are
      `VLLMEngine.from_options`'s (url, or python to start a local server; ...). The
      server is made to serve `checkpoint_dir` as `version` before this returns.
    Several engines behind one (`taurl.policy.router.EngineRouter`: an episode sticks to
    one, new episodes go to the least loaded): ``replicas: N`` (N engines of `kind`, e.g.
    N local vLLM servers), or for vllm ``url: [URL, ...]`` (one client per server).
    """
    replicas = options.pop("replicas", 1)
    urls = options.get("url")
    if isinstance(urls, (list, tuple)) or replicas != 1:
        from taurl.policy.router import EngineRouter

        if not isinstance(replicas, int) or replicas < 1:
            raise EngineError(f"engine_options replicas must be an integer >= 1, got {replicas!r}")
        if isinstance(urls, (list, tuple)):
            if kind != "vllm" or replicas != 1:
                raise EngineError("engine_options url as a list is for engine 'vllm', without replicas")
            per = [{**options, "url": u} for u in urls]
        else:
            per = [dict(options) for _ in range(replicas)]
            for i, o in enumerate(per):  # servers taurl starts: one cache and log directory each
                if isinstance(o.get("server_options"), dict) and o["server_options"].get("cache_dir"):
                    o["server_options"] = {**o["server_options"],
                                           "cache_dir": str(Path(o["server_options"]["cache_dir"]) / f"r{i}")}
        engines: list[Engine] = []
        try:
            for o in per:
                engines.append(make_engine(kind, checkpoint_dir, tokenizer, version=version, **o))
        except BaseException:
            for e in engines:
                e.close()
            raise
        return EngineRouter(engines)
    if kind == "local":
        from taurl.policy.model import load_policy

        model, _ = load_policy(checkpoint_dir)
        allowed = {"max_batch_size", "seed", "max_context", "prefix_cache_tokens", "slim_decode"}
        if unknown := sorted(set(options) - allowed):
            raise EngineError(f"unknown engine_options {unknown} for engine 'local'; "
                              f"it takes {sorted(allowed)}")
        return LocalEngine(model, tokenizer, version=version, **options)
    if kind == "vllm":
        from taurl.policy.vllm_engine import VLLMEngine

        return VLLMEngine.from_options(checkpoint_dir, tokenizer, version=version, **options)
    raise EngineError(f"unknown engine {kind!r}; choose 'local' or 'vllm'")


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    generator: torch.Generator | None
    submitted: float
    max_new: int = 0
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    admitted: float = 0.0


class LocalEngine:
    """Continuous-batching engine over any Hugging Face causal LM on this process.

    >>> engine = LocalEngine(model, tokenizer, version=0)          # doctest: +SKIP
    >>> out = await engine.generate(ids, SamplingParams(max_tokens=32, stop=("</search>",)))
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, version: int = 0,
                 max_batch_size: int = 64, seed: int = 0, max_context: int | None = None,
                 prefix_cache_tokens: int = 65536, slim_decode: bool = True):
        self.model = model.eval()  # no dropout: the behaviour logprobs are those of the plain forward
        self.tokenizer = tokenizer
        # inputs follow the model (cpu, cuda, ...); sampling draws its uniforms on the CPU so a
        # seeded request samples the same ids on any device
        self.device = next(model.parameters()).device
        self._version = version
        self.max_batch_size = max_batch_size
        cfg = model.config
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._max_context = max_context or int(getattr(cfg, "max_position_embeddings", 2048))
        eos = tokenizer.eos_token_id if tokenizer is not None else getattr(cfg, "eos_token_id", None)
        self.eos_ids = _ids(eos)
        # a chat model may end its turn with a token other than the tokenizer's EOS (Llama 3's
        # <|eot_id|>): its generation config lists every end id, and HF generate stops at each
        self.eos_ids |= _ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
        self.pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0) if tokenizer is not None else 0
        self._generator = torch.Generator().manual_seed(seed)
        # transformers renamed `past_key_values` to `cache`; use whichever forward takes
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        # prefill needs the last position's logits only; a forward without the option gives all
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # requests waiting for a row: a heap of (priority, arrival, request), so the oldest
        # of the most urgent goes first (the async schedule ranks by group age)
        self._pending: list[tuple[int, int, _Request]] = []
        self._arrivals = itertools.count()
        self._lock = threading.Lock()  # guards _pending and the worker flag
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        self._paused = False
        self._mode = "wait"  # the pause mode in force while paused
        self._abort = False  # set by pause("abort"): the worker ends its running rows
        self._kept = 0  # rows frozen by pause("keep")
        self._running = 0
        self._idle = threading.Event()  # no row is running (the batch is empty)
        self._idle.set()
        self._frozen = threading.Event()  # the worker holds its rows for pause("keep")
        self.stats = {"steps": 0, "tokens": 0, "prefills": 0, "batch_size_sum": 0,
                      "prefill_tokens": 0, "prefix_tokens_reused": 0, "prefill_rows_shared": 0}
        self._prefixes = PrefixCache(prefix_cache_tokens)
        # decode steps without transformers' per-call Python (taurl.policy.slim_decode), for the
        # architectures it knows; the first decode step checks it against the model's forward
        self._slim = SlimDecoder.for_model(model) if slim_decode else None
        self._slim_checked = False
        self.stats["slim_decode"] = 0.0

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    # -- public API --------------------------------------------------------------------
    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EngineError("prompt_ids is empty; render the prompt with the chat template first")
        if min(prompt) < 0 or max(prompt) >= self._vocab_size:
            raise EngineError(f"prompt_ids must be in [0, {self._vocab_size}) for this model; "
                              "was the prompt encoded with the model's own tokenizer?")
        if len(prompt) >= self._max_context:
            raise EngineError(f"prompt has {len(prompt)} tokens; the model's context is {self._max_context}")
        loop = asyncio.get_running_loop()
        gen = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        req = _Request(prompt, sampling, loop.create_future(), loop, gen, time.perf_counter())
        req.max_new = min(sampling.max_tokens, self._max_context - len(prompt))
        with self._lock:
            heapq.heappush(self._pending, (sampling.priority, next(self._arrivals), req))
            self._idle.clear()
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="taurl-engine")
                self._worker.start()
        self._wake.set()
        return await req.future

    async def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Serve `state_dict` as policy `version` once every in-flight request is done.

        New requests wait during the swap, so no completion ever mixes two versions.
        """
        was_paused = self._paused
        if not was_paused:
            await self.pause("wait")
        try:
            if self._kept:
                raise EngineError(f"{self._kept} request(s) are paused with mode 'keep'; loading "
                                  "weights now would mix two policy versions in one completion. "
                                  "Pause with 'wait' or 'abort' before a weight update.")
            with torch.no_grad():
                self.model.load_state_dict(state_dict)
            if self._slim is not None:
                self._slim.refresh()  # its fused weights are copies of the old ones
            self._prefixes.clear()  # keys/values of the old weights must not serve the new ones
            self._version = version
        finally:
            if not was_paused:
                await self.resume()

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None:
        """Serve the weights saved at `checkpoint_dir` (an HF model directory) as `version`."""
        state = await asyncio.to_thread(_read_state_dict, Path(checkpoint_dir), self.model)
        await self.update_weights(state, version)

    async def pause(self, mode: str = "wait") -> None:
        """Stop serving (`Engine.pause`); returns once no forward pass is running."""
        check_pause_mode(mode)
        with self._lock:
            self._paused = True
            self._mode = mode
            self._frozen.clear()
            if mode == "abort":
                self._abort = True
        self._wake.set()
        if mode == "keep":
            await asyncio.to_thread(_wait_any, self._idle, self._frozen)
        else:
            await asyncio.to_thread(self._idle.wait)

    async def resume(self) -> None:
        with self._lock:
            self._paused = False
            self._mode = "wait"
            self._abort = False
            self._kept = 0
        self._wake.set()

    async def health(self) -> EngineHealth:
        alive = self._worker is None or self._worker.is_alive()
        return EngineHealth(ok=alive, version=self._version, paused=self._paused,
                            in_flight=len(self._pending) + self._running,
                            detail="" if alive else "the engine worker thread died")

    def close(self) -> None:  # nothing held beyond this process's memory
        return None

    # -- the worker ----------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            self._serve_loop()
        finally:  # whatever ended the loop, no caller may wait forever
            with self._lock:
                stranded = [r for _, _, r in self._pending] if self._worker is threading.current_thread() else []
                if stranded:
                    self._pending.clear()
                    self._worker = None
                    self._idle.set()
            for r in stranded:
                self._resolve(r, exc=EngineError("the engine worker stopped unexpectedly"))

    def _serve_loop(self) -> None:
        batch: list[_Request] = []
        kv: BatchKV | None = None
        while True:
            admitted: list[_Request] = []
            with self._lock:
                abort, self._abort = self._abort, False
                frozen = self._paused and self._mode == "keep"
                if not self._paused:
                    while self._pending and len(batch) + len(admitted) < self.max_batch_size:
                        admitted.append(heapq.heappop(self._pending)[2])
                if abort:  # end the running rows now, with what they have sampled so far
                    for r in batch:
                        self._resolve(r, reason="abort")
                    batch, kv = [], None
                self._running = len(batch) + len(admitted)
                if not batch and not admitted and not self._pending:
                    self._idle.set()
                    self._worker = None
                    return
                if frozen and batch:
                    self._kept = len(batch)
            if frozen and batch:  # paused with mode "keep": hold the rows and their KV
                self._frozen.set()
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            if not batch and not admitted:  # paused with work waiting
                self._idle.set()
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                with torch.no_grad():
                    if admitted:
                        new_kv, logits, admitted = self._prefill(admitted)
                        offset = len(batch)  # admitted rows sit after the running ones
                        batch, kv = batch + admitted, new_kv if kv is None else kv.merge(new_kv)
                        done = self._sample_and_finish(admitted, logits)
                        batch, kv = self._drop(batch, kv, [offset + i for i in done])
                    if batch:
                        logits = self._decode(batch, kv)
                        done = self._sample_and_finish(batch, logits)
                        batch, kv = self._drop(batch, kv, done)
            except Exception as e:  # fail every request in flight, never hang a caller
                for r in batch + admitted:
                    self._resolve(r, exc=EngineError(f"engine step failed: {type(e).__name__}: {e}"))
                batch, kv = [], None

    def _prefill(self, reqs: list[_Request]) -> tuple[BatchKV, torch.Tensor, list[_Request]]:
        """Prefill new rows; identical prompts (a GRPO group's first turn: G rollouts of one
        task) are computed once and their keys/values copied to every row that asked.
        Returns the cache, the last logits and the requests in the order of its rows."""
        slot: dict[tuple[int, ...], int] = {}  # prompt -> its row among the unique ones
        unique: list[_Request] = []
        inverse = []  # reqs[i] takes row inverse[i] of the unique prefill
        for r in reqs:
            if (key := tuple(r.prompt)) not in slot:
                slot[key] = len(unique)
                unique.append(r)
            inverse.append(slot[key])
        now = time.perf_counter()
        for r in reqs:
            r.admitted = now
        kv, logits, order = self._prefill_unique(unique)
        if len(unique) == len(reqs):
            return kv, logits, [unique[u] for u in order]
        askers: dict[int, list[_Request]] = {}
        for r, u in zip(reqs, inverse, strict=True):
            askers.setdefault(u, []).append(r)
        rows = [row for row, u in enumerate(order) for _ in askers[u]]
        self.stats["prefill_rows_shared"] += len(reqs) - len(unique)
        return kv.select(rows), logits[rows], [r for u in order for r in askers[u]]

    def _prefill_unique(self, reqs: list[_Request]) -> tuple[BatchKV, torch.Tensor, list[int]]:
        """Prefill rows of distinct prompts; a row whose prompt extends a finished sequence
        reuses its KV. Returns the cache, the last logits and which request each row is.

        Rows of very different new lengths are prefilled in separate forwards (longest first,
        a chunk grows while its padding stays under `PREFILL_PAD_WASTE` of its real tokens):
        one forward pads every row to the longest, and after a weight swap, when whole
        contexts are prefilled again, that padding was most of the prefill's work.
        """
        prefixes = [self._prefixes.take(r.prompt) for r in reqs]
        starts = [0 if p is None else p[0][0].shape[2] for p in prefixes]
        new = [len(r.prompt) - s for r, s in zip(reqs, starts, strict=True)]
        order = sorted(range(len(reqs)), key=lambda i: -new[i])
        chunks: list[list[int]] = []
        real = 0  # real new tokens of the last chunk
        for i in order:  # a chunk's first row is its longest: every row is padded to it
            if chunks and (len(chunks[-1]) + 1) * new[chunks[-1][0]] <= (1 + PREFILL_PAD_WASTE) * (real + new[i]):
                chunks[-1].append(i)
                real += new[i]
            else:
                chunks.append([i])
                real = new[i]
        kv, logits = None, []
        for c in chunks:
            part, lg = self._prefill_rows([reqs[i] for i in c], [prefixes[i] for i in c], [starts[i] for i in c])
            kv = part if kv is None else kv.merge(part)
            logits.append(lg)
        self.stats["prefill_tokens"] += sum(new)
        self.stats["prefix_tokens_reused"] += sum(starts)
        return kv, torch.cat(logits), [i for c in chunks for i in c]

    def _prefill_rows(self, reqs: list[_Request], prefixes: list, starts: list[int]) -> tuple[BatchKV, torch.Tensor]:
        """One forward over `reqs` (their cached prefixes given).

        Layout per row: [padding][reused prefix][padding][new tokens]; the mask hides the
        padding and positions are explicit, so the holes change nothing.
        """
        past = BatchKV.from_prefixes(prefixes)
        width = max(len(r.prompt) - s for r, s in zip(reqs, starts, strict=True))
        ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(reqs), width), dtype=torch.long)
        positions = torch.zeros((len(reqs), width), dtype=torch.long)
        for i, (r, s) in enumerate(zip(reqs, starts, strict=True)):
            n = len(r.prompt) - s
            ids[i, width - n:] = torch.tensor(r.prompt[s:])
            mask[i, width - n:] = 1
            positions[i, width - n:] = torch.arange(s, len(r.prompt))
        ids, mask, positions = (x.to(self.device) for x in (ids, mask, positions))
        if past is None:
            kv = BatchKV.empty(mask, [len(r.prompt) for r in reqs])
        else:
            kv = BatchKV(past.cache, torch.cat([past.mask, mask], dim=1), [len(r.prompt) for r in reqs])
        out = self.model(input_ids=ids, attention_mask=kv.mask, position_ids=positions,
                         use_cache=True, **self._last_only, **{self._cache_kw: kv.cache})
        kv.zero_padding()
        self.stats["prefills"] += 1
        return kv, out.logits[:, -1, :].float()

    def _decode(self, batch: list[_Request], kv: BatchKV) -> torch.Tensor:
        ids = torch.tensor([[r.out_ids[-1]] for r in batch], dtype=torch.long, device=self.device)
        positions = torch.tensor([[n] for n in kv.lengths], dtype=torch.long, device=self.device)
        mask = kv.extend_mask()
        if self._slim is not None and self._slim_checked:
            logits = self._slim(ids, positions[:, 0], mask, kv.cache)
        elif self._slim is not None:  # the first decode step: the model's forward on a copy checks it
            trial = kv.clone()
            ref = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             use_cache=True, **{self._cache_kw: trial.cache}).logits[:, -1, :]
            logits = self._slim(ids, positions[:, 0], mask, kv.cache)
            # agreed: this step is served by the slim path like every later one (the same
            # request gives the same numbers whenever it runs); else the model's step stands
            if not self._check_slim(logits, ref):
                logits, kv.cache = ref, trial.cache
        else:
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                use_cache=True, **{self._cache_kw: kv.cache}).logits[:, -1, :]
        kv.advance()
        self.stats["steps"] += 1
        self.stats["batch_size_sum"] += len(batch)
        return logits.float()

    def _check_slim(self, slim_logits: torch.Tensor, logits: torch.Tensor) -> bool:
        """Keep the slim decode path only if it computes what the model's forward does."""
        diff = agrees(slim_logits, logits)
        self._slim_checked = True
        if diff is None:
            log.warning("the slim decode path disagrees with %s's forward; decoding with the "
                        "model's own forward", type(self.model).__name__)
            self._slim = None
            return False
        self.stats["slim_decode"] = 1.0
        return True

    def _sample_and_finish(self, reqs: list[_Request], logits: torch.Tensor) -> list[int]:
        """Sample one token per row, append it, return the rows that are finished."""
        temps = torch.tensor([r.sampling.temperature for r in reqs], device=logits.device).unsqueeze(-1)
        greedy = temps.squeeze(-1) == 0
        logprobs_all = torch.log_softmax(logits / torch.where(temps > 0, temps, torch.ones_like(temps)), dim=-1)
        tokens = sample_tokens(logprobs_all, [r.sampling.top_p for r in reqs],
                               [r.generator or self._generator for r in reqs])
        tokens = torch.where(greedy, logits.argmax(-1), tokens)
        chosen = logprobs_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).tolist()
        done = []
        for i, (r, tok) in enumerate(zip(reqs, tokens.tolist(), strict=True)):  # one device sync
            r.out_ids.append(tok)
            r.out_logprobs.append(chosen[i])
            reason, matched = self._finish_reason(r, tok)
            if reason is not None:
                self._resolve(r, reason=reason, matched=matched)
                done.append(i)
        self.stats["tokens"] += len(reqs)
        return done

    def _finish_reason(self, r: _Request, tok: int) -> tuple[str | None, Any]:
        if tok in r.sampling.stop_token_ids:
            return "stop", tok
        if tok in self.eos_ids:
            return "eos", tok
        if r.sampling.stop:
            # Each token holds >= 1 byte, so a stop string completed by this token lies
            # within the last len(stop) + 1 tokens; earlier matches would have stopped us.
            window = max(len(s.encode()) for s in r.sampling.stop) + 1
            text = self.tokenizer.decode(r.out_ids[-window:], skip_special_tokens=False)
            for s in r.sampling.stop:
                if s in text:
                    return "stop", s
        if len(r.out_ids) >= r.max_new:
            return "length", None
        return None, None

    def _drop(self, batch: list[_Request], kv: BatchKV, done: list[int]):
        if not done:
            return batch, kv
        for i in done:  # keep what was computed: the agent's next turn extends this sequence
            r = batch[i]
            self._prefixes.put(r.prompt + r.out_ids[:-1], kv.row(i))
        if len(done) == len(batch):
            return [], None
        order = kv.remove(done)  # in place; the last rows take the finished rows' places
        return [batch[i] for i in order], kv

    def _resolve(self, r: _Request, reason: str = "", matched: Any = None, exc: Exception | None = None) -> None:
        if r.future.done():
            return
        if exc is not None:
            r.loop.call_soon_threadsafe(_set_exception, r.future, exc)
            return
        now = time.perf_counter()
        gen = Generation(list(r.out_ids), list(r.out_logprobs), reason, self._version, matched,
                         len(r.prompt), queue_s=(r.admitted or now) - r.submitted,
                         generate_s=now - (r.admitted or now))
        r.loop.call_soon_threadsafe(_set_result, r.future, gen)


def _wait_any(*events: threading.Event) -> None:
    while not any(e.wait(0.01) for e in events):
        pass


def _read_state_dict(path: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights saved at `path` (``*.safetensors``), checked against `model`'s keys.

    A tied output layer is not saved (it is the embedding), so its key may be missing.
    """
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        raise EngineError(f"no *.safetensors weights in {str(path)!r}; pass a checkpoint directory "
                          "written by save_pretrained (e.g. RUN/checkpoints/vN)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    own = model.state_dict()
    for k in set(own) - set(state):  # a tied weight: take its saved twin (same storage here)
        twin = next((j for j in state if j in own and own[j].data_ptr() == own[k].data_ptr()), None)
        if twin is not None:
            state[k] = state[twin]
    missing, unexpected = set(own) - set(state), set(state) - set(own)
    if missing or unexpected:
        # some architectures save under other names than their modules use (GPT-NeoX's
        # embed_out is lm_head in transformers 5): let transformers apply its own key mapping
        from taurl.policy.model import load_policy

        state = load_policy(path, device="cpu", dtype=next(model.parameters()).dtype)[0].state_dict()
        missing, unexpected = set(own) - set(state), set(state) - set(own)
    if missing or unexpected:
        raise EngineError(f"the checkpoint at {str(path)!r} does not fit the served model: "
                          f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}; "
                          "was it saved from the same architecture?")
    return state


def _ids(x: Any) -> set[int]:
    """An id, a list of ids or None, as a set."""
    if x is None:
        return set()
    return {int(x)} if isinstance(x, int) else {int(i) for i in x}


def _set_result(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: Exception) -> None:
    if not fut.done():
        fut.set_exception(exc)


def sample_tokens(logprobs: torch.Tensor, top_p: Sequence[float],
                  generators: Sequence[torch.Generator]) -> torch.Tensor:
    """Draw one id per row from softmax(logprobs) restricted to its top-p nucleus.

    logprobs: (B, V) normalized log-probabilities. Each row draws its uniform number from
    its own generator, so a seeded request samples the same ids whatever batch it is in
    (inverse-CDF sampling: the first id whose cumulative mass exceeds u).
    """
    probs = logprobs.exp()
    # CPU generators (device-independent draws), moved to where the probabilities are
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).unsqueeze(-1).to(probs.device, probs.dtype)
    if all(p >= 1.0 for p in top_p):  # no nucleus: skip the sort (the common case)
        cum = probs.cumsum(-1)
        return torch.searchsorted(cum, u * cum[:, -1:]).clamp(max=probs.shape[-1] - 1).squeeze(-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    p = torch.tensor(top_p, dtype=probs.dtype, device=probs.device).unsqueeze(-1)
    # keep the smallest prefix whose mass reaches top_p (always at least one id)
    sorted_p = torch.where(cum - sorted_p < p, sorted_p, torch.zeros_like(sorted_p))
    cum = sorted_p.cumsum(-1)
    idx = torch.searchsorted(cum, u * cum[:, -1:]).clamp(max=probs.shape[-1] - 1)
    return order.gather(-1, idx).squeeze(-1)


class PrefixCache:
    """Keys/values of finished sequences, for the agent's next turn (which extends one).

    LRU, bounded in tokens; an entry is used once (the next turn's row replaces it). A
    lookup tries every cached length, longest first: a few hundred tuple compares.
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], list] = OrderedDict()
        self._tokens = 0

    def put(self, ids: list[int], kv: list) -> None:
        if self.max_tokens <= 0 or len(ids) > self.max_tokens or not ids:
            return
        key = tuple(ids)
        if key in self._entries:
            return
        self._entries[key] = kv
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def take(self, prompt: list[int]):
        """The cached KV of the longest cached proper prefix of `prompt`, removed; or None."""
        for n in sorted({len(k) for k in self._entries if len(k) < len(prompt)}, reverse=True):
            key = tuple(prompt[:n])
            if key in self._entries:
                self._tokens -= n
                return self._entries.pop(key)
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
