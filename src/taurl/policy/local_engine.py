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

Deterministic mode (``deterministic=True``, docs/reproducibility.md): a row's numbers depend on
the batch it is computed in (a CPU matmul's blocking follows the batch's shape, attention's
reductions the batch's padding), and which requests share a batch depends on timing. In this
mode a collector declares its episodes' slots (`join` / `leave`, `taurl.rollout.episodes.
collect` does) and the worker steps in lock-step with them: it runs a step only once every
slot's request has arrived (or the slot has left), and admits waiting requests in an order
fixed by their content (priority, seed, prompt), not by their arrival. Every batch is then a
function of the episodes alone, so a seed fixes every sampled token and logprob under any
machine load; the cost is that the engine waits out each env step instead of decoding
through it.
"""

import asyncio
import heapq
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from taurl.errors import EngineError
from taurl.policy.engine_worker import BatchWorker, _Request
from taurl.policy.prefix_cache import PrefixCache
from taurl.policy.protocol import EngineHealth, Generation, SamplingParams, check_pause_mode
from taurl.policy.slim_decode import SlimDecoder

log = logging.getLogger("taurl.policy.local_engine")


class LocalEngine(BatchWorker):
    """Continuous-batching engine over any Hugging Face causal LM on this process.

    >>> engine = LocalEngine(model, tokenizer, version=0)          # doctest: +SKIP
    >>> out = await engine.generate(ids, SamplingParams(max_tokens=32, stop=("</search>",)))
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, version: int = 0,
                 max_batch_size: int = 64, seed: int = 0, max_context: int | None = None,
                 prefix_cache_tokens: int = 65536, slim_decode: bool = True,
                 deterministic: bool = False):
        # no dropout: the behaviour logprobs are those of the plain forward
        self.model = model.eval()
        self.tokenizer = tokenizer
        # inputs follow the model (cpu, cuda, ...); sampling draws its uniforms on the CPU so a
        # seeded request samples the same ids on any device
        self.device = next(model.parameters()).device
        self._version = version
        self.max_batch_size = max_batch_size
        cfg = model.config
        self._vocab_size = int(model.get_input_embeddings().num_embeddings)
        self._max_context = max_context or int(getattr(cfg, "max_position_embeddings", 2048))
        eos = (tokenizer.eos_token_id if tokenizer is not None
               else getattr(cfg, "eos_token_id", None))
        self.eos_ids = _ids(eos)
        # a chat model may end its turn with a token other than the tokenizer's EOS (Llama 3's
        # <|eot_id|>): its generation config lists every end id, and HF generate stops at each
        self.eos_ids |= _ids(getattr(getattr(model, "generation_config", None), "eos_token_id",
                                     None))
        self.pad_id = int(getattr(tokenizer, "pad_token_id", None)
                          or 0) if tokenizer is not None else 0
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
        # deterministic mode (module docstring): the slots whose requests each step waits for
        self.deterministic = deterministic
        self._members = 0
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
            raise EngineError(f"prompt has {len(prompt)} tokens; the model's context is "
                              f"{self._max_context}")
        loop = asyncio.get_running_loop()
        gen = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
        req = _Request(prompt, sampling, loop.create_future(), loop, gen, time.perf_counter())
        req.max_new = min(sampling.max_tokens, self._max_context - len(prompt))
        # the queue's order: by arrival, or in deterministic mode by content (arrival only
        # breaks ties between identical requests, whose samples are identical too)
        order = ((sampling.seed if sampling.seed is not None else -1, tuple(prompt),
                  next(self._arrivals))
                 if self.deterministic else (next(self._arrivals),))
        with self._lock:
            heapq.heappush(self._pending, (sampling.priority, order, req))
            self._idle.clear()
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._serve, name="taurl-engine")
                self._worker.start()
        self._wake.set()
        return await req.future

    def join(self, slots: int) -> None:
        """Deterministic mode: `slots` more callers, each with at most one request in flight,
        that every step waits for (until each `leave`s). A collector joins before its
        episodes start and leaves a slot the moment it has no episode left to run."""
        if not self.deterministic:
            raise EngineError("join/leave are the deterministic mode's; build the engine with "
                              "deterministic=True")
        with self._lock:
            self._members += slots
        self._wake.set()

    def leave(self) -> None:
        """One slot of `join` is done: no step waits for it any more."""
        with self._lock:
            self._members = max(0, self._members - 1)
        self._wake.set()

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

    def release_caches(self, wait_s: float = 60.0) -> None:
        """Free what the next weight update rebuilds anyway, while the learner trains: the
        prefix cache (keys/values of the current weights) and the slim decoder's fused and
        packed weight copies (about one copy of the weights). Called between rounds only
        (no request in flight); a request that comes first rebuilds them itself."""
        # the worker stores a finished row's prefix after it returns; a row still decoding
        # (an episode that timed out leaves its row running) reads the fused weights, so
        # nothing is freed unless the worker is idle
        if not self._idle.wait(timeout=wait_s):
            log.warning("release_caches: the engine is still decoding after %.0f s; caches kept",
                        wait_s)
            return
        with self._lock:
            self._prefixes.clear()
            if self._slim is not None:
                self._slim.release()

    async def load_weights(self, checkpoint_dir: str | Path, version: int) -> None:
        """Serve the weights saved at `checkpoint_dir` (an HF model directory) as `version`;
        an adapter checkpoint (LoRA) is served merged, and only as the version it records
        (`taurl.policy.adapter.check_served_version`: a clear error otherwise)."""
        from taurl.policy.adapter import check_served_version

        check_served_version(checkpoint_dir, version)
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


def _wait_any(*events: threading.Event) -> None:
    while not any(e.wait(0.01) for e in events):
        pass


def _read_state_dict(path: Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights saved at `path` (``*.safetensors``), checked against `model`'s keys.

    A tied output layer is not saved (it is the embedding), so its key may be missing.
    """
    from safetensors.torch import load_file

    from taurl.policy.adapter import is_adapter_dir

    if is_adapter_dir(path):  # a LoRA checkpoint: its base with the adapter merged in
        from taurl.policy.adapter import load_merged

        return load_merged(path, device="cpu", dtype=next(model.parameters()).dtype)[0].state_dict()
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

        state = load_policy(path, device="cpu",
                            dtype=next(model.parameters()).dtype)[0].state_dict()
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
