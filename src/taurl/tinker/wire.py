"""The Tinker wire formats: zstd bodies, the SDK's protobuf messages, futures' JSON shapes.

The `tinker` SDK (0.38.0) sends ``/api/v1/forward_backward`` as a protobuf
``ForwardBackwardRequest`` (optionally zstd-compressed, ``Content-Encoding: zstd``) and asks
``/api/v1/retrieve_future`` for ``SampleResponse`` and ``ForwardBackwardOutput`` results as
protobuf (``Accept: application/x-protobuf``); every other body is JSON. The schema is the
SDK's own (``tinker.proto.tinker_public_pb2``), so the server and the client cannot drift
apart; this module only converts between those messages and numpy arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

PROTO = "application/x-protobuf"

_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32}  # tinker_public.DType (bfloat16 not sent)


class WireError(ValueError):
    """A request body the server cannot read (answered as HTTP 400)."""


@dataclass
class WireDatum:
    """One `tinker.Datum` as arrays: the input tokens and the named loss inputs."""

    tokens: list[int]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    images: int = 0  # image / audio chunks (this server serves text models only)


@dataclass
class FwdBwdRequest:
    """A decoded ``ForwardBackwardRequest``."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


def decompress(body: bytes, encoding: str | None) -> bytes:
    """The body as sent before ``Content-Encoding`` (zstd or none)."""
    if not encoding or encoding == "identity":
        return body
    if encoding != "zstd":
        raise WireError(f"unsupported Content-Encoding {encoding!r}; send zstd or none")
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    except zstandard.ZstdError as e:
        raise WireError(f"the zstd body does not decompress: {e}") from None


def _pb() -> Any:
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


def tensor_array(msg: Any) -> np.ndarray:
    """A ``tinker_public.Tensor`` (dense or sparse CSR) as a dense numpy array."""
    dtype = _DTYPES.get(msg.dtype)
    if dtype is None:
        raise WireError(f"unsupported tensor dtype {msg.dtype} (send float32 or int64)")
    shape = list(msg.shape)
    if msg.HasField("sparse_csr"):
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
        col = np.frombuffer(csr.col_indices, dtype=np.int64)
        if len(shape) != 2 or len(crow) != shape[0] + 1 or len(col) != len(values):
            raise WireError(f"a sparse CSR tensor of shape {shape} has inconsistent indices")
        dense = np.zeros(shape, dtype=dtype)
        for row in range(shape[0]):
            lo, hi = int(crow[row]), int(crow[row + 1])
            dense[row, col[lo:hi]] = values[lo:hi]
        return dense
    data = np.frombuffer(msg.dense, dtype=dtype)
    if shape and int(np.prod(shape)) != data.size:
        raise WireError(f"a tensor of shape {shape} carries {data.size} values")
    return data.reshape(shape) if shape else data


def decode_forward_backward(body: bytes) -> FwdBwdRequest:
    """A ``/api/v1/forward_backward`` body (already decompressed) as a `FwdBwdRequest`."""
    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # protobuf's DecodeError and friends
        raise WireError(f"the body is not a ForwardBackwardRequest protobuf: {e}") from None
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():  # v2 wins (the SDK writes both for numbers)
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = []
    for d in msg.data:
        tokens: list[int] = []
        images = 0
        for chunk in d.model_input:
            if chunk.WhichOneof("chunk") == "encoded_text":
                tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
            else:
                images += 1
        data.append(WireDatum(tokens, {k: tensor_array(v) for k, v in d.loss_fn_inputs.items()},
                              images))
    return FwdBwdRequest(msg.model_id, int(msg.seq_id), msg.loss_fn, config,
                         bool(msg.forward_only), data)


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]],
                                   metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput`` protobuf: one ``ArrayRecord`` batching every datum's
    outputs (float32, offsets in bytes), as the SDK's decoder reads it."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    if outputs:
        record = msg.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(outputs))
        for name in outputs[0]:
            arrays = [np.ascontiguousarray(o[name], dtype=np.float32) for o in outputs]
            offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
            bt = record.fields[name]
            bt.data = b"".join(a.tobytes() for a in arrays)
            bt.offsets = offsets.tobytes()
            bt.dtype = pb.DTYPE_FLOAT32
            bt.trailing_shape.extend(list(arrays[0].shape[1:]))
    return msg.SerializeToString()


@dataclass
class SampledSeq:
    """One sampled sequence as the wire carries it."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


def encode_sample_response(sequences: list[SampledSeq],
                           prompt_logprobs: list[float | None] | None) -> bytes:
    """A ``SampleResponse`` protobuf (tokens int32, logprobs float32, NaN where a prompt
    position has no logprob)."""
    pb = _pb()
    msg = pb.SampleResponse()
    for s in sequences:
        msg.sequences.add(
            stop_reason=pb.STOP_REASON_LENGTH if s.stop_reason == "length" else pb.STOP_REASON_STOP,
            tokens=np.asarray(s.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(s.logprobs, dtype=np.float32).tobytes())
    if prompt_logprobs is not None:
        arr = np.array([np.nan if x is None else x for x in prompt_logprobs], dtype=np.float32)
        msg.prompt_logprobs = arr.tobytes()
    return msg.SerializeToString()


def failed(message: str, category: str = "user") -> dict[str, str]:
    """A failed future's body: the SDK raises ``RequestFailedError`` with this category
    (``user``: the request was wrong; ``server``: the server failed it)."""
    return {"error": message, "category": category}


def try_again(request_id: str) -> dict[str, str]:
    """A still-pending future's body (answered with HTTP 408: the SDK polls again at once)."""
    return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
