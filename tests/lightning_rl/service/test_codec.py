"""The protobuf bodies: what the official SDK writes, our messages read, and what ours write, the SDK reads (the SDK's
own converters on both sides; skipped where it is not installed, below Python 3.11)."""

import math

import numpy as np
import pytest
import torch

from lightning_rl.service import proto
from lightning_rl.service.codec import (
    Sequence,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)
from lightning_rl.service.errors import BadRequest

tinker = pytest.importorskip("tinker", reason="the official tinker SDK (a dev dependency on Python >= 3.11)")


def _sdk_request(forward_only=False):
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints([3, 4, 5]),
            loss_fn_inputs={"target_tokens": [4, 5, 1], "weights": [0.0, 1.0, 1.0]},
        ),
        types.Datum(
            model_input=types.ModelInput(
                chunks=[types.EncodedTextChunk(tokens=[7]), types.EncodedTextChunk(tokens=[8, 9, 10])]
            ),
            loss_fn_inputs={
                "target_tokens": torch.tensor([[8, 0], [9, 0], [10, 0], [1, 1]]),  # 2-D: the SDK sends it sparse CSR
                "advantages": np.array([0.5, -1.5, 2.0, 0.25], dtype=np.float32),
            },
        ),
    ]
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="ppo", loss_fn_config={"beta": 0.3}),
        model_id="s:train:0",
        seq_id=7,
    )
    message = forward_backward_request_to_proto(request)
    message.forward_only = forward_only
    return message.SerializeToString()


def test_the_sdks_forward_backward_request_decodes_to_its_tensors():
    request = decode_forward_backward(_sdk_request(forward_only=True))
    assert (request.model_id, request.seq_id, request.loss_fn, request.forward_only) == ("s:train:0", 7, "ppo", True)
    assert request.config == {"beta": pytest.approx(0.3)}
    first, second = request.data
    assert first.tokens.tolist() == [3, 4, 5] and second.tokens.tolist() == [7, 8, 9, 10]  # chunks joined
    assert first.inputs["target_tokens"].tolist() == [4, 5, 1] and first.inputs["target_tokens"].dtype == torch.int64
    torch.testing.assert_close(first.inputs["weights"], torch.tensor([0.0, 1.0, 1.0]))
    torch.testing.assert_close(second.inputs["advantages"], torch.tensor([0.5, -1.5, 2.0, 0.25]))
    assert second.inputs["target_tokens"].tolist() == [[8, 0], [9, 0], [10, 0], [1, 1]]  # CSR densified


def test_our_forward_backward_output_is_what_the_sdk_reads():
    from tinker.proto.response_conv import deserialize_forward_backward_output

    logprobs = [torch.tensor([-0.5, -1.25, -3.0]), torch.tensor([-0.125])]
    out = deserialize_forward_backward_output(encode_forward_backward_output(logprobs, {"loss:sum": 2.5}))
    assert out.metrics == {"loss:sum": 2.5} and out.loss_fn_output_type == "ArrayRecord"
    assert [o["logprobs"].tolist() for o in out.loss_fn_outputs] == [[-0.5, -1.25, -3.0], [-0.125]]
    assert out.loss_fn_outputs[0]["logprobs"].dtype == "float32"


def test_our_sample_response_is_what_the_sdk_reads():
    from tinker.proto.response_conv import deserialize_sample_response

    sequences = [Sequence([5, 6, 1], [-0.5, -0.25, -0.125], True), Sequence([9, 9], [-1.0, -2.0], False)]
    out = deserialize_sample_response(encode_sample_response(sequences, [None, -1.5, -0.75]))
    assert [s.tokens for s in out.sequences] == [[5, 6, 1], [9, 9]]
    assert [s.logprobs for s in out.sequences] == [[-0.5, -0.25, -0.125], [-1.0, -2.0]]
    assert [s.stop_reason for s in out.sequences] == ["stop", "length"]
    assert out.prompt_logprobs == [None, -1.5, -0.75]
    assert deserialize_sample_response(encode_sample_response(sequences, None)).prompt_logprobs is None


def test_a_malformed_body_names_the_field_at_fault():
    message = proto.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn="cross_entropy")
    datum = message.data.add()
    datum.model_input.add().encoded_text.tokens = np.array([1, 2], dtype="<i4").tobytes()
    tensor = datum.loss_fn_inputs["weights"]
    tensor.dtype, tensor.dense = proto.DTYPE_FLOAT32, np.zeros(3, dtype="<f4").tobytes()
    tensor.shape.extend([2])
    with pytest.raises(
        BadRequest, match=r"data\[0\]\.loss_fn_inputs\.weights: shape \[2\] holds 2 values but 3"
    ) as err:
        decode_forward_backward(message.SerializeToString())
    assert err.value.field == "data[0].loss_fn_inputs.weights"
    datum.loss_fn_inputs["weights"].shape[0] = 3
    datum.model_input.add().image.data = b"png"
    with pytest.raises(BadRequest, match=r"data\[0\]\.model_input\.chunks\[1\] is an image chunk"):
        decode_forward_backward(message.SerializeToString())
    with pytest.raises(BadRequest, match="not a ForwardBackwardRequest protobuf"):
        decode_forward_backward(b"\xff\xff\xff")


def test_bfloat16_and_int32_widen_as_the_sdk_reads_them():
    from lightning_rl.service.codec import tensor

    values = torch.tensor([1.5, -2.25, math.pi], dtype=torch.bfloat16)
    message = proto.MESSAGES["Tensor"](dtype=proto.DTYPE_BFLOAT16, dense=values.view(torch.int16).numpy().tobytes())
    torch.testing.assert_close(tensor(message, "x"), values.float())
    ints = proto.MESSAGES["Tensor"](dtype=proto.DTYPE_INT32, dense=np.array([3, -4], dtype="<i4").tobytes())
    assert tensor(ints, "x").dtype == torch.int64 and tensor(ints, "x").tolist() == [3, -4]
