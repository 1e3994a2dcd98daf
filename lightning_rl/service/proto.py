"""The protobuf messages of the Tinker API's binary bodies, declared here field by field and built at import.

The official SDK (``tinker`` 0.38) sends ``forward_backward`` bodies as protobuf (``application/x-protobuf``, the request
of ``tinker/proto/tinker_public_pb2``) and asks for `SampleResponse` and `ForwardBackwardOutput` results in protobuf
(``Accept: application/x-protobuf``). Only field numbers and types travel on the wire, so the messages below, declared
from the SDK's schema, parse and write the same bytes; they live in a descriptor pool of their own (the SDK's module can
be imported beside them). Tensors are raw little-endian bytes: tokens int32, log-probs float32, a dense tensor in its
``dtype`` with its ``shape``, or sparse CSR (values, int64 row pointers and column indices).
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "lightning_rl.tinker_wire"

DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 1, 2, 3, 4
STOP_REASON_STOP, STOP_REASON_LENGTH = 0, 1

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "double": _F.TYPE_DOUBLE,
    "float": _F.TYPE_FLOAT,
    "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64,
    "int32": _F.TYPE_INT32,
    "uint32": _F.TYPE_UINT32,
    "bool": _F.TYPE_BOOL,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
}
_ENUMS = {"DType": ["DTYPE_UNSPECIFIED", "DTYPE_FLOAT32", "DTYPE_INT64", "DTYPE_INT32", "DTYPE_BFLOAT16"]}
_ENUMS["StopReason"] = ["STOP_REASON_STOP", "STOP_REASON_LENGTH"]

# message -> [(number, name, type, flags)]: type is a scalar, an enum or a message name; flags "repeated", "optional"
# (proto3 optional: presence is tracked) or "oneof:<name>"; a "map<string, X>" field is a repeated entry message
_MESSAGES: dict[str, list[tuple]] = {
    "SparseCsr": [(1, "values", "bytes"), (2, "crow_indices", "bytes"), (3, "col_indices", "bytes")],
    "Tensor": [
        (1, "dense", "bytes", "oneof:encoding"),
        (2, "sparse_csr", "SparseCsr", "oneof:encoding"),
        (3, "dtype", "DType"),
        (4, "shape", "int64", "repeated"),
    ],
    "EncodedTextChunk": [(1, "tokens", "bytes")],
    "ImageDimensions": [(1, "width", "uint32"), (2, "height", "uint32")],
    "ImageChunk": [
        (1, "data", "bytes"),
        (2, "format", "string"),
        (3, "expected_tokens", "int32", "optional"),
        (4, "override_dimensions", "ImageDimensions", "optional"),
    ],
    "DmelChunk": [(1, "dmel", "bytes")],
    "Chunk": [
        (1, "encoded_text", "EncodedTextChunk", "oneof:chunk"),
        (2, "image", "ImageChunk", "oneof:chunk"),
        (3, "dmel", "DmelChunk", "oneof:chunk"),
    ],
    "PromptProvenanceSpan": [(1, "sequence_id", "string"), (2, "offset", "int64"), (3, "length", "int64")],
    "SampledProvenanceSpan": [(1, "sequence_id", "string"), (2, "offset", "int64"), (3, "length", "int64")],
    "ProvenanceSpan": [
        (1, "prompt_tokens", "PromptProvenanceSpan", "oneof:span"),
        (2, "sampled_tokens", "SampledProvenanceSpan", "oneof:span"),
    ],
    "Datum": [
        (1, "model_input", "Chunk", "repeated"),
        (2, "loss_fn_inputs", "map<string, Tensor>"),
        (3, "model_input_spans", "ProvenanceSpan", "repeated"),
        (4, "loss_fn_input_spans", "ProvenanceSpan", "repeated"),
    ],
    "LossConfigValue": [(1, "number", "double", "oneof:value"), (2, "text", "string", "oneof:value")],
    "ForwardBackwardRequest": [
        (1, "model_id", "string"),
        (2, "seq_id", "int32"),
        (3, "data", "Datum", "repeated"),
        (4, "loss_fn", "string"),
        (5, "loss_fn_config", "map<string, double>"),
        (6, "forward_only", "bool"),
        (7, "loss_fn_config_v2", "map<string, LossConfigValue>"),
    ],
    "BatchedTensor": [
        (1, "data", "bytes"),
        (2, "offsets", "bytes"),
        (3, "dtype", "DType"),
        (4, "trailing_shape", "int64", "repeated"),
    ],
    "ArrayRecord": [(1, "type_tag", "string"), (2, "fields", "map<string, BatchedTensor>"), (3, "num_datums", "int64")],
    "ForwardBackwardOutput": [
        (1, "loss_fn_output_type", "string"),
        (2, "loss_fn_outputs", "ArrayRecord", "repeated"),
        (3, "metrics", "map<string, double>"),
    ],
    "TopkLogprobs": [(1, "token_ids", "bytes"), (2, "logprobs", "bytes"), (3, "k", "uint32"), (4, "length", "uint32")],
    "SampledSequence": [
        (1, "stop_reason", "StopReason"),
        (2, "tokens", "bytes"),
        (3, "logprobs", "bytes", "optional"),
        (4, "topk_sampled_logprobs", "TopkLogprobs", "optional"),
    ],
    "SampleResponse": [
        (1, "sequences", "SampledSequence", "repeated"),
        (2, "prompt_logprobs", "bytes", "optional"),
        (3, "topk_prompt_logprobs", "TopkLogprobs", "optional"),
        (4, "prompt_cache_hit_tokens", "int32"),
    ],
}


def _field(number: int, name: str, kind: str) -> descriptor_pb2.FieldDescriptorProto:
    field = _F(name=name, number=number, label=_F.LABEL_OPTIONAL)
    if kind in _SCALARS:
        field.type = _SCALARS[kind]
    else:
        field.type = _F.TYPE_ENUM if kind in _ENUMS else _F.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{kind}"
    return field


def _message(name: str, fields: list[tuple]) -> descriptor_pb2.DescriptorProto:
    message = descriptor_pb2.DescriptorProto(name=name)
    oneofs: list[str] = []
    for number, field_name, kind, *flags in fields:
        flag = flags[0] if flags else ""
        if kind.startswith("map<"):  # a map is a repeated nested entry message with key = 1, value = 2
            key, value = (part.strip() for part in kind[4:-1].split(","))
            entry = "".join(part.capitalize() for part in field_name.split("_")) + "Entry"
            nested = message.nested_type.add(name=entry)
            nested.options.map_entry = True
            nested.field.extend([_field(1, "key", key), _field(2, "value", value)])
            field = _field(number, field_name, "bytes")
            field.type, field.type_name, field.label = _F.TYPE_MESSAGE, f".{PACKAGE}.{name}.{entry}", _F.LABEL_REPEATED
        else:
            field = _field(number, field_name, kind)
        if flag == "repeated":
            field.label = _F.LABEL_REPEATED
        elif flag.startswith("oneof:"):
            group = flag.split(":", 1)[1]
            if group not in oneofs:
                oneofs.append(group)
                message.oneof_decl.add(name=group)
            field.oneof_index = oneofs.index(group)
        elif flag == "optional":  # proto3 optional: a synthetic one-field oneof named _<field>, after the real ones
            field.proto3_optional = True
        message.field.append(field)
    for field in message.field:
        if field.proto3_optional:
            field.oneof_index = len(message.oneof_decl)
            message.oneof_decl.add(name=f"_{field.name}")
    return message


def _build() -> dict[str, type]:
    file = descriptor_pb2.FileDescriptorProto(name="lightning_rl_tinker_wire.proto", package=PACKAGE, syntax="proto3")
    for name, values in _ENUMS.items():
        enum = file.enum_type.add(name=name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    file.message_type.extend(_message(name, fields) for name, fields in _MESSAGES.items())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in _MESSAGES
    }


MESSAGES = _build()
ForwardBackwardRequest = MESSAGES["ForwardBackwardRequest"]
ForwardBackwardOutput = MESSAGES["ForwardBackwardOutput"]
SampleResponse = MESSAGES["SampleResponse"]
