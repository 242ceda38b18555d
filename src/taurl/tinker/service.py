"""The service behind the routes: sessions, training clients, samplers, futures.

Every model computation runs on one compute thread, in the order requests arrived: the
SDK sends a training client's requests one after another (each once the previous POST was
answered), so arrival order is the client's order and gradients, optimizer steps and saves
interleave exactly as the client issued them. Sampling decodes on the engines' own threads.
A request is checked when it arrives: one the server refuses (unknown model, unsupported
loss, malformed datum, ``load_state`` not first, ...) gets a future that has already failed
with category ``user``, which the SDK raises as ``tinker.RequestFailedError``.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from taurl.tinker import checkpoints, wire
from taurl.tinker.futures import FutureStore, Payload
from taurl.tinker.models import ModelRegistry, RequestError
from taurl.tinker.records import Recorder, SampledSequence, SampleSource, sample_records
from taurl.tinker.sampler import (
    EnginePool,
    SamplerSpec,
    check_sample_request,
    engine_params,
    prompt_logprobs,
    prompt_tokens,
    run_sample,
    seeds,
)
from taurl.tinker.sessions import Registry, model_id, sampler_id
from taurl.tinker.trainer import LoraSpec, TrainingModel, checkpoint_meta

log = logging.getLogger("taurl.tinker")


class TinkerService:
    """State and operations of one ``taurl serve-tinker`` (use it on the server's loop)."""

    def __init__(self, models: dict[str, str], run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.models = ModelRegistry(models)
        self.registry = Registry()
        self.futures = FutureStore()
        self.engines = EnginePool(self.models)
        self.recorder = Recorder(self.run_dir)
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="taurl-tinker")
        # the flags a new SDK client fetches once (``/api/v1/client/config``): API keys (no JWT
        # exchange), plain httpx, zstd fwd/bwd bodies, a future polled per request (no
        # retrieve_futures), custom losses run on the client; the SDK splits a
        # forward_backward into chunks of at most `fwdbwd_max_chunk_len` datums
        self.client_config: dict[str, Any] = {
            "pjwt_auth_enabled": False, "use_pyqwest_transport": False,
            "proto_compress_fwdbwd": True, "sample_use_retrieve_futures": False,
            "custom_loss_server_side": False, "sample_join_sampling_session": False,
            "fwdbwd_max_chunk_len": 1024}

    def close(self) -> None:
        self.compute.shutdown(wait=False, cancel_futures=True)
        self.recorder.close()

    # -- futures --------------------------------------------------------------------
    def submit(self, fn: Callable[[], Payload], **extra: Any) -> dict[str, Any]:
        """Run `fn` on the compute thread; answer its future's id at once."""
        rid, fut = self.futures.new()
        task = asyncio.get_running_loop().run_in_executor(self.compute, fn)
        task.add_done_callback(lambda t: fut.set_result(_outcome(t)))
        return {"request_id": rid, **extra}

    def spawn(self, coro: Any, **extra: Any) -> dict[str, Any]:
        """Run the coroutine on this loop; answer its future's id at once."""
        rid, fut = self.futures.new()
        task = asyncio.ensure_future(coro)
        task.add_done_callback(lambda t: fut.set_result(_outcome(t)))
        return {"request_id": rid, **extra}

    def refused(self, e: RequestError, **extra: Any) -> dict[str, Any]:
        return {"request_id": self.futures.resolved(Payload.json(wire.failed(str(e)))), **extra}

    # -- models ---------------------------------------------------------------------
    def capabilities(self) -> dict[str, Any]:
        return {"supported_models": [{"model_name": name, "trainable": True, "sampleable": True}
                                     for name in self.models.names]}

    def create_model(self, req: Any) -> dict[str, Any]:
        try:
            session = self.registry.session(req.session_id)
            self.models.check(req.base_model)
            if req.lora_config is None:
                raise RequestError("this server trains LoRA adapters only; pass a LoraConfig "
                                   "(create_lora_training_client)")
            if req.lora_config.rank < 1:
                raise RequestError(f"LoRA rank must be >= 1, got {req.lora_config.rank}")
            _check_adam(req.optimizer_config)
        except RequestError as e:
            return self.refused(e)
        mid = model_id(session.session_id, req.model_seq_id)
        c = req.lora_config
        spec = LoraSpec(c.rank, c.seed or 0, c.train_mlp, c.train_attn, c.train_unembed)

        def build() -> Payload:
            m = TrainingModel(mid, self.models.get(req.base_model), spec)
            self.registry.models[mid] = m
            self.recorder.training("create_model", mid, 0, base_model=req.base_model,
                                   lora_rank=spec.rank)
            return Payload.json({"model_id": mid, "type": "create_model"})

        return self.submit(build, model_id=mid)

    def get_info(self, req: Any) -> dict[str, Any]:
        m = self.registry.model(req.model_id)
        arch = (getattr(m.base.model.config, "architectures", None) or [None])[0]
        return {"type": "get_info", "model_id": m.model_id, "is_lora": True,
                "lora_rank": m.lora.rank, "model_name": m.base.name,
                "model_data": {"arch": arch, "model_name": m.base.name,
                               "tokenizer_id": str(m.base.path)}}

    # -- training -------------------------------------------------------------------
    def forward_backward(self, req: wire.FwdBwdRequest) -> dict[str, Any]:
        try:
            m = self.registry.model(req.model_id)
            m.check_forward_backward(req)
        except RequestError as e:
            return self.refused(e, model_id=req.model_id)
        m.requests += 1

        def run() -> Payload:
            outputs, metrics = m.forward_backward(req)
            self.recorder.training("forward" if req.forward_only else "forward_backward",
                                   m.model_id, m.steps, loss_fn=req.loss_fn,
                                   loss_sum=metrics["loss:sum"], datums=len(req.data),
                                   tokens=sum(len(d.tokens) for d in req.data))
            return Payload(wire.encode_forward_backward_output(outputs, metrics), wire.PROTO)

        return self.submit(run, model_id=m.model_id)

    def optim_step(self, req: Any) -> dict[str, Any]:
        try:
            m = self.registry.model(req.model_id)
            if type(req.optim_params).__name__ != "AdamParams":
                raise RequestError("this server's training clients use Adam; pass AdamParams")
        except RequestError as e:
            return self.refused(e, model_id=req.model_id)
        m.requests += 1

        def run() -> Payload:
            metrics = m.optim_step(req.optim_params)
            self.recorder.training("optim_step", m.model_id, m.steps, **{
                k.split(":")[0]: v for k, v in metrics.items()})
            return Payload.json({"metrics": metrics})

        return self.submit(run, model_id=m.model_id)

    def save(self, req: Any, *, sampler: bool) -> dict[str, Any]:
        """``save_weights`` (training state) or ``save_weights_for_sampler``."""
        kind = "sampler_weights" if sampler else "weights"
        try:
            m = self.registry.model(req.model_id)
            ephemeral = sampler and req.path is None
            name = checkpoints.check_name(req.path) if req.path else (
                f"ephemeral-{uuid.uuid4().hex[:8]}" if ephemeral else f"step-{m.steps}")
            cp = checkpoints.CheckpointPath(m.model_id, kind, name)
            if cp.directory(self.run_dir).exists() and not getattr(req, "overwrite", False):
                raise RequestError(f"{cp.uri} exists; pass overwrite=True or another name")
            sid = None
            if ephemeral:
                session = m.model_id.split(":")[0]
                sid = sampler_id(session, req.sampling_session_seq_id or 0)
        except RequestError as e:
            return self.refused(e, model_id=req.model_id)
        m.requests += 1

        def run() -> Payload:
            from taurl.data.atomic import fsync_tree, replace_dir

            final = cp.directory(self.run_dir)
            tmp = final.with_name(f".{final.name}.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            m.save(tmp, optimizer=not sampler,
                   meta={"path": cp.uri, "base_path": str(m.base.path.resolve())})
            fsync_tree(tmp)
            replace_dir(tmp, final)
            self.recorder.training("save_weights_for_sampler" if sampler else "save_state",
                                   m.model_id, m.steps, path=cp.uri)
            if sid is not None:
                self.registry.samplers[sid] = SamplerSpec(sid, m.base.name, cp.uri, final)
                return Payload.json({"sampling_session_id": sid,
                                     "type": "save_weights_for_sampler"})
            return Payload.json({"path": cp.uri, "type": "save_weights_for_sampler" if sampler
                                 else "save_weights"})

        return self.submit(run, model_id=m.model_id)

    def load(self, req: Any) -> dict[str, Any]:
        """``load_weights``: onto a new client (create-via-load) or as a client's first request."""
        try:
            cp, directory = checkpoints.existing(req.path, self.run_dir)
            meta = checkpoint_meta(directory)
            if req.optimizer and not (directory / "optimizer.pt").is_file():
                raise RequestError(f"{cp.uri} holds no optimizer state; load it without the "
                                   "optimizer, or save it with save_state")
            if req.session_id is not None:  # create_training_client_from_state
                self.registry.session(req.session_id)
                mid, m = model_id(req.session_id, req.model_seq_id or 0), None
                base_name = self.models.check(req.base_model or meta["base_model"])
            else:  # TrainingClient.load_state: only as the client's first request
                m = self.registry.model(req.model_id)
                mid, base_name = m.model_id, m.base.name
                if req.seq_id != 1 or m.requests:
                    raise RequestError("load_state must be a training client's first request "
                                       "(this one already ran requests); create a client with "
                                       "create_training_client_from_state instead")
                if meta["base_model"] != base_name or meta["lora"]["rank"] != m.lora.rank:
                    raise RequestError(f"{cp.uri} is a rank-{meta['lora']['rank']} adapter of "
                                       f"{meta['base_model']!r}; this client is rank "
                                       f"{m.lora.rank} on {base_name!r}")
                m.requests += 1
        except RequestError as e:
            return self.refused(e, model_id=getattr(req, "model_id", None))

        def run() -> Payload:
            model = m
            if model is None:
                model = TrainingModel(mid, self.models.get(base_name), LoraSpec(**meta["lora"]))
                model.requests = 1
            model.load(directory, optimizer=req.optimizer)
            self.registry.models[mid] = model
            self.recorder.training("load_state", mid, model.steps, path=cp.uri,
                                   optimizer=req.optimizer)
            return Payload.json({"path": cp.uri, "model_id": mid, "type": "load_weights"})

        return self.submit(run, model_id=mid)

    # -- sampling -------------------------------------------------------------------
    def create_sampling_session(self, req: Any) -> dict[str, Any]:
        session = self.registry.session(req.session_id)
        sid = sampler_id(session.session_id, req.sampling_session_seq_id)
        self.registry.samplers[sid] = self._sampler_spec(sid, req.model_path, req.base_model)
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    def _sampler_spec(self, sid: str, model_path: str | None, base: str | None) -> SamplerSpec:
        if model_path:
            cp, directory = checkpoints.existing(model_path, self.run_dir)
            return SamplerSpec(sid, checkpoint_meta(directory)["base_model"], cp.uri, directory)
        if not base:
            raise RequestError("give model_path or base_model")
        return SamplerSpec(sid, self.models.check(base), None, None)

    def get_sampler(self, sid: str) -> dict[str, Any]:
        s = self.registry.sampler(sid)
        return {"sampler_id": s.sampler_id, "base_model": s.base_model, "model_path": s.model_path}

    def asample(self, req: Any) -> dict[str, Any]:
        rid_hint = uuid.uuid4().hex[:12]
        ids = [f"{rid_hint}:{i}" for i in range(max(req.num_samples, 1))]
        try:
            spec = (self.registry.sampler(req.sampling_session_id) if req.sampling_session_id
                    else self._sampler_spec("direct", req.model_path, req.base_model))
            prompt = prompt_tokens(req.prompt)
            check_sample_request(req, len(prompt))
            base = self.models.get(spec.base_model)
            if max(prompt) >= base.vocab_size:
                raise RequestError(f"the prompt has token ids outside [0, {base.vocab_size})")
            params = engine_params(req.sampling_params, base.max_context - len(prompt))[0]
        except RequestError as e:
            return self.refused(e, sample_sequence_ids=ids)
        return self.spawn(self._sample(spec, req, prompt, params, ids), sample_sequence_ids=ids)

    async def _sample(self, spec: SamplerSpec, req: Any, prompt: list[int], params: Any,
                      ids: list[str]) -> Payload:
        loop = asyncio.get_running_loop()
        engine = await loop.run_in_executor(self.compute, self.engines.engine, spec)
        seqs = await run_sample(engine, prompt, params, req.num_samples)
        plps = None
        if req.prompt_logprobs:
            plps = await loop.run_in_executor(self.compute, prompt_logprobs, engine.model, prompt,
                                              req.prompt_logprobs_last_n)
        sp = req.sampling_params.model_dump(mode="json")
        tok = self.models.get(spec.base_model).tokenizer
        source = SampleSource(
            request_id=ids[0].split(":")[0], sampler_id=spec.sampler_id,
            session_id=None if spec.sampler_id == "direct" else spec.sampler_id.split(":")[0],
            base_model=spec.base_model, model_path=spec.model_path, version=engine.version)
        records = sample_records(
            self.recorder.run_id, source, prompt,
            [SampledSequence(sid, s.tokens, s.logprobs, g.finish_reason, p.seed)
             for sid, (s, g), p in zip(ids, seqs, seeds(params, len(seqs)), strict=True)],
            sp, lambda t: tok.decode(t, skip_special_tokens=False), plps)
        await loop.run_in_executor(None, self.recorder.samples, records)
        return Payload(wire.encode_sample_response([s for s, _ in seqs], plps), wire.PROTO)


def _check_adam(config: Any) -> None:
    if config is not None and getattr(config, "type", "adamw") != "adamw":
        raise RequestError(f"optimizer {config.type!r} is not supported; this server uses Adam")


def _outcome(task: Any) -> Payload:
    """A finished computation's result, or its failure as the SDK's error shape."""
    if task.cancelled():
        return Payload.json(wire.failed("the request was cancelled", "server"))
    exc = task.exception()
    if exc is None:
        return task.result()
    if isinstance(exc, RequestError):
        return Payload.json(wire.failed(str(exc)))
    log.error("a request failed on the server", exc_info=exc)
    return Payload.json(wire.failed(f"{type(exc).__name__}: {exc}", "server"))
