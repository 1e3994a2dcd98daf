"""The Tinker API's binary bodies to and from tensors: a ``forward_backward`` request in, its per-datum log-probs and a
sample's sequences out (`proto` declares the messages). Decoding checks the structure and names the field at fault
(``data[3].loss_fn_inputs.advantages``); what a field must hold for a given loss is checked by the service."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from google.protobuf.message import DecodeError
from torch import Tensor

from lightning_rl.service import proto
from lightning_rl.service.errors import BadRequest

_NUMPY = {
    proto.DTYPE_FLOAT32: np.dtype("<f4"),
    proto.DTYPE_INT64: np.dtype("<i8"),
    proto.DTYPE_INT32: np.dtype("<i4"),
    proto.DTYPE_BFLOAT16: np.dtype("<u2"),
}


@dataclass(frozen=True)
class Span:
    """One run of a datum's provenance: ``length`` positions that are ``[offset, offset + length)`` of sequence
    ``sequence_id``'s sampled tokens (``sampled``) or of the prompt it was sampled from."""

    sampled: bool
    sequence_id: str
    offset: int
    length: int


@dataclass
class Datum:
    """One sequence of a ``forward_backward``: ``tokens`` (N,) in, ``inputs`` name -> (N, ...) per-position tensors."""

    tokens: Tensor  # (N,) long
    inputs: dict[str, Tensor]
    input_spans: list[Span] | None = None
    target_spans: list[Span] | None = None


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    config: dict[str, float | str] = field(default_factory=dict)
    forward_only: bool = False
    data: list[Datum] = field(default_factory=list)


def decode_forward_backward(body: bytes) -> ForwardBackward:
    """A ``forward_backward`` request (protobuf) as tensors; a malformed one raises `BadRequest` naming its field."""
    message = proto.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as err:
        raise BadRequest(f"the body is not a ForwardBackwardRequest protobuf ({err})") from None
    config: dict[str, float | str] = {key: float(value) for key, value in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():  # the SDK writes both; v2 also carries strings
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = [_datum(d, f"data[{i}]") for i, d in enumerate(message.data)]
    return ForwardBackward(message.model_id, message.seq_id, message.loss_fn, config, message.forward_only, data)


def _datum(message, where: str) -> Datum:
    tokens = []
    for j, chunk in enumerate(message.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise BadRequest(
                f"{where}.model_input.chunks[{j}] is an {kind} chunk; this service trains on token chunks "
                "(EncodedTextChunk) only",
                f"{where}.model_input",
            )
        tokens.append(_buffer(chunk.encoded_text.tokens, _NUMPY[proto.DTYPE_INT32], f"{where}.model_input"))
    ids = np.concatenate(tokens) if tokens else np.zeros(0, dtype=np.int32)
    if ids.size == 0:
        raise BadRequest(f"{where}.model_input holds no tokens", f"{where}.model_input")
    inputs = {name: tensor(value, f"{where}.loss_fn_inputs.{name}") for name, value in message.loss_fn_inputs.items()}
    spans = [_spans(message.model_input_spans), _spans(message.loss_fn_input_spans)]
    return Datum(torch.from_numpy(ids.astype(np.int64)), inputs, *spans)


def _spans(messages) -> list[Span] | None:
    out = []
    for span in messages:
        kind = span.WhichOneof("span")
        run = getattr(span, kind)
        out.append(Span(kind == "sampled_tokens", run.sequence_id, int(run.offset), int(run.length)))
    return out or None


def _buffer(raw: bytes, dtype: np.dtype, where: str) -> np.ndarray:
    if len(raw) % dtype.itemsize:
        raise BadRequest(f"{where}: {len(raw)} bytes is not a whole number of {dtype} values", where)
    return np.frombuffer(raw, dtype=dtype)


def tensor(message, where: str) -> Tensor:
    """A ``Tensor`` message as a torch tensor: float32 or int64 (int32 and bfloat16 widened), dense or CSR densified."""
    dtype = _NUMPY.get(message.dtype)
    if dtype is None:
        raise BadRequest(f"{where}: unknown dtype {message.dtype} (float32 or int64)", where)
    shape = list(message.shape)
    if any(s < 0 for s in shape):
        raise BadRequest(f"{where}: negative size in shape {shape}", where)
    if message.WhichOneof("encoding") == "sparse_csr":
        if len(shape) != 2:
            raise BadRequest(f"{where}: a sparse CSR tensor needs a 2-D shape, got {shape}", where)
        csr = message.sparse_csr
        values = _widen(_buffer(csr.values, dtype, where), message.dtype)
        crow = _buffer(csr.crow_indices, np.dtype("<i8"), where)
        col = _buffer(csr.col_indices, np.dtype("<i8"), where)
        try:
            with torch.sparse.check_sparse_tensor_invariants():
                dense = torch.sparse_csr_tensor(
                    torch.from_numpy(crow.copy()), torch.from_numpy(col.copy()), torch.from_numpy(values), shape
                ).to_dense()
        except RuntimeError as err:
            raise BadRequest(f"{where}: not a valid sparse CSR tensor ({str(err).splitlines()[0]})", where) from None
        return dense
    flat = _widen(_buffer(message.dense, dtype, where), message.dtype)
    if not shape:
        shape = [flat.size]
    if math.prod(shape) != flat.size:
        raise BadRequest(f"{where}: shape {shape} holds {math.prod(shape)} values but {flat.size} were sent", where)
    return torch.from_numpy(flat).reshape(shape)


def _widen(values: np.ndarray, dtype: int) -> np.ndarray:
    if dtype == proto.DTYPE_BFLOAT16:  # bfloat16 is the upper half of a float32
        return (values.astype(np.uint32) << 16).view(np.float32)
    if dtype == proto.DTYPE_INT32:
        return values.astype(np.int64)
    return values.copy()  # writable, and the protobuf buffer can go


def encode_forward_backward_output(logprobs: list[Tensor], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput``: one ``ArrayRecord`` whose ``logprobs`` field holds every datum's (N_i,) float32."""
    arrays = [lp.detach().float().cpu().numpy().astype("<f4") for lp in logprobs]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype("<i8")
    batched = proto.MESSAGES["BatchedTensor"](
        data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(), dtype=proto.DTYPE_FLOAT32
    )
    record = proto.MESSAGES["ArrayRecord"](type_tag="ArrayRecord", num_datums=len(arrays))
    record.fields["logprobs"].CopyFrom(batched)
    output = proto.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    output.loss_fn_outputs.append(record)
    return output.SerializeToString()


def forward_backward_output_json(logprobs: list[Tensor], metrics: dict[str, float]) -> dict:
    """The same as JSON (``TensorData`` dicts), for a client that does not ask for protobuf."""
    outputs = [
        {"logprobs": {"data": lp.detach().float().cpu().tolist(), "dtype": "float32", "shape": [lp.numel()]}}
        for lp in logprobs
    ]
    return {"loss_fn_output_type": "ArrayRecord", "loss_fn_outputs": outputs, "metrics": metrics}


@dataclass
class Sequence:
    """One sampled sequence: its tokens (ending with the stop token when it stopped), their log-probs, why it ended."""

    tokens: list[int]
    logprobs: list[float]
    stop: bool


def encode_sample_response(sequences: list[Sequence], prompt_logprobs: list[float | None] | None) -> bytes:
    """A ``SampleResponse``; prompt log-probs are float32 with NaN where none was computed (the first token)."""
    response = proto.SampleResponse()
    for seq in sequences:
        response.sequences.add(
            stop_reason=proto.STOP_REASON_STOP if seq.stop else proto.STOP_REASON_LENGTH,
            tokens=np.asarray(seq.tokens, dtype="<i4").tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype="<f4").tobytes(),
        )
    if prompt_logprobs is not None:
        values = [math.nan if v is None else v for v in prompt_logprobs]
        response.prompt_logprobs = np.asarray(values, dtype="<f4").tobytes()
    return response.SerializeToString()


def sample_response_json(sequences: list[Sequence], prompt_logprobs: list[float | None] | None) -> dict:
    answer: dict = {
        "type": "sample",
        "sequences": [
            {"stop_reason": "stop" if s.stop else "length", "tokens": s.tokens, "logprobs": s.logprobs}
            for s in sequences
        ],
    }
    if prompt_logprobs is not None:
        answer["prompt_logprobs"] = prompt_logprobs
    return answer
