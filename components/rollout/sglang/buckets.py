"""SGLang's description of a bucket (``names, dtypes, shapes``, as ``/update_weights_from_distributed`` takes them);
the buckets themselves are the server layer's (`server.buckets`)."""

from __future__ import annotations

from ..server.buckets import Weight


def metadata(bucket: list[Weight]) -> dict:
    """``names, dtypes, shapes`` of a bucket, as ``/update_weights_from_distributed`` takes them."""
    return {
        "names": [w.name for w in bucket],
        "dtypes": [str(w.dtype).removeprefix("torch.") for w in bucket],
        "shapes": [list(w.shape) for w in bucket],
    }
