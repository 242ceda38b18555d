"""The local engine's worker thread: continuous batching over one KV cache.

One thread serves every caller of `LocalEngine.generate`: new requests are prefilled
together (left-padded, identical prompts once, a prompt that extends a finished sequence
from its cached keys/values) and merged into the running batch; every decode step advances
every row by one token in one forward pass; a finished row leaves at once, so its slot is
free for the next request. Results go back to each caller's event loop thread-safely.
In deterministic mode a step waits for every joined slot's request (`LocalEngine`'s docstring).

`BatchWorker` is the worker half of `LocalEngine` (a mixin): it uses the state that
`LocalEngine.__init__` sets (model, lock, pending heap, events, stats, prefix cache).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from taurl.errors import EngineError
from taurl.policy.kv_cache import BatchKV
from taurl.policy.protocol import Generation, SamplingParams
from taurl.policy.sampling import sample_tokens
from taurl.policy.slim_decode import agrees

PREFILL_PAD_WASTE = 0.25  # padding a prefill forward may add, as a share of its real tokens

log = logging.getLogger("taurl.engine")


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


class BatchWorker:
    """The worker thread of `LocalEngine`: admit, prefill, decode, sample, finish."""

    # -- the worker ----------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            self._serve_loop()
        finally:  # whatever ended the loop, no caller may wait forever
            with self._lock:
                stranded = ([r for _, _, r in self._pending]
                            if self._worker is threading.current_thread() else [])
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
                # deterministic mode: a step waits until every slot's request is here (LocalEngine)
                waiting = not self._paused and len(batch) + len(self._pending) < self._members
                if not self._paused and not waiting:
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
                elif not waiting and (batch or admitted):
                    # a forward runs next: a pause taken from here on must wait for it (idle may
                    # still be set from a paused wait with work queued, and pause trusts it)
                    self._idle.clear()
            if waiting and (batch or self._pending):  # lock-step: a slot's request is still to come
                self._wake.wait(1.0)  # generate, join and leave set it; the timeout is a safety net
                self._wake.clear()
                continue
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
                    self._resolve(r, exc=EngineError(
                        f"engine step failed: {type(e).__name__}: {e}"))
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
            if (chunks and (len(chunks[-1]) + 1) * new[chunks[-1][0]]
                    <= (1 + PREFILL_PAD_WASTE) * (real + new[i])):
                chunks[-1].append(i)
                real += new[i]
            else:
                chunks.append([i])
                real = new[i]
        kv, logits = None, []
        for c in chunks:
            part, lg = self._prefill_rows([reqs[i] for i in c], [prefixes[i] for i in c],
                                          [starts[i] for i in c])
            kv = part if kv is None else kv.merge(part)
            logits.append(lg)
        self.stats["prefill_tokens"] += sum(new)
        self.stats["prefix_tokens_reused"] += sum(starts)
        return kv, torch.cat(logits), [i for c in chunks for i in c]

    def _prefill_rows(self, reqs: list[_Request], prefixes: list,
                      starts: list[int]) -> tuple[BatchKV, torch.Tensor]:
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
            kv = BatchKV(past.cache, torch.cat([past.mask, mask], dim=1),
                         [len(r.prompt) for r in reqs])
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
        elif self._slim is not None:
            # the first decode step: the model's forward on a copy checks it
            trial = kv.clone()
            ref = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                             use_cache=True, **{self._cache_kw: trial.cache}).logits[:, -1, :]
            # the check: its arithmetic through the model's own layers (bit for bit the forward's
            # where the kernels are the same); the packed GEMMs were each checked when packed
            exact = self._slim(ids, positions[:, 0], mask, kv.clone().cache, exact=True)
            logits = self._slim(ids, positions[:, 0], mask, kv.cache)
            # agreed: this step is served by the slim path like every later one (the same
            # request gives the same numbers whenever it runs); else the model's step stands
            if not self._check_slim(exact, ref):
                logits, kv.cache = ref, trial.cache
            else:  # what the packed GEMMs' rounding moved the served step from the forward's
                self.stats["slim_max_dlogp"] = float(
                    (torch.log_softmax(logits.float(), -1)
                     - torch.log_softmax(ref.float(), -1)).abs().max())
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
        temps = torch.tensor([r.sampling.temperature for r in reqs],
                             device=logits.device).unsqueeze(-1)
        greedy = temps.squeeze(-1) == 0
        logprobs_all = torch.log_softmax(logits / torch.where(temps > 0, temps,
                                                              torch.ones_like(temps)), dim=-1)
        tokens = sample_tokens(logprobs_all, [r.sampling.top_p for r in reqs],
                               [r.generator or self._generator for r in reqs],
                               top_k=[r.sampling.top_k for r in reqs])
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

    def _resolve(self, r: _Request, reason: str = "", matched: Any = None,
                 exc: Exception | None = None) -> None:
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


def _set_result(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: Exception) -> None:
    if not fut.done():
        fut.set_exception(exc)
