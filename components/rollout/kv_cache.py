"""A KV cache that grows in place: the sampler's decoding steps write into room reserved at the prefill.

transformers' ``DynamicLayer`` concatenates each step's keys and values onto the cache, copying the whole cache once
per layer and step: O(R^2) bytes over a response, about a fifth of a CPU decoding step for a 30M-parameter policy
at 140 positions. `GrowingLayer` keeps them in a buffer with room for every position the call can reach and hands
attention views of the filled part, so a step copies only its own token's keys and values. The values attention
reads are the same, so are the tokens. A cache of another kind (sliding windows, linear attention, transformers 4's
lists) is left as it is.
"""

from __future__ import annotations

from torch import Tensor

try:  # transformers >= 5: a cache holds a list of layers
    from transformers.cache_utils import Cache, DynamicLayer
except ImportError:  # transformers 4: key_cache / value_cache lists, left as they are
    Cache = DynamicLayer = None


if DynamicLayer is not None:

    class GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values (batch, heads, positions, head_dim) live in buffers of
        ``capacity`` positions, grown (doubled) only if a call goes past it."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity, self.length = capacity, 0
            self._keys: Tensor | None = None
            self._values: Tensor | None = None

        def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
            b, h, _, d = key_states.shape
            self.device = key_states.device
            self._keys = key_states.new_empty(b, h, self.capacity, d)
            self._values = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
            self.length, self.is_initialized = 0, True
            self._expose()

        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self._keys.shape[-2]:
                room = max(end, 2 * self._keys.shape[-2])
                self._keys, self._values = (self._widened(x, room) for x in (self._keys, self._values))
            self._keys[:, :, self.length : end].copy_(key_states)
            self._values[:, :, self.length : end].copy_(value_states)
            self.length = end
            self._expose()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove > 0:
                raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
            self.length = max(0, self.length + tokens_to_remove)
            self._expose()

        def reset(self) -> None:
            self._keys = self._values = None
            self.length = 0
            super().reset()

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._rows(lambda x: x.repeat_interleave(repeats, dim=0))

        def batch_select_indices(self, indices: Tensor) -> None:
            self._rows(lambda x: x[indices])

        def reorder_cache(self, beam_idx: Tensor) -> None:
            self._rows(lambda x: x.index_select(0, beam_idx.to(x.device)))

        def _rows(self, pick) -> None:
            if self.is_initialized:
                # only the filled positions are copied: the room after them is written before it is read
                length = self.length
                self._keys = self._widened(pick(self._keys[:, :, :length]), self._keys.shape[-2])
                self._values = self._widened(pick(self._values[:, :, :length]), self._values.shape[-2])
                self._expose()

        def _expose(self) -> None:
            """``keys`` / ``values``: the filled positions, views of the buffers (what attention and transformers
            read)."""
            self.keys = self._keys[:, :, : self.length]
            self.values = self._values[:, :, : self.length]

        @staticmethod
        def _widened(x: Tensor, room: int) -> Tensor:
            out = x.new_empty(*x.shape[:2], room, x.shape[-1])
            out[:, :, : x.shape[-2]] = x
            return out

        @classmethod
        def of(cls, layer: DynamicLayer, capacity: int) -> "GrowingLayer":
            """A growing copy of a filled ``DynamicLayer`` with room for ``capacity`` positions."""
            grown = cls(max(capacity, layer.get_seq_length()))
            if layer.is_initialized and layer.get_seq_length() > 0:
                grown.update(layer.keys, layer.values)
            return grown


def grow_in_place(cache, capacity: int) -> None:
    """Swap each plain ``DynamicLayer`` of ``cache`` for a `GrowingLayer` with room for ``capacity`` positions."""
    if DynamicLayer is None or not isinstance(cache, Cache):
        return
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            cache.layers[i] = GrowingLayer.of(layer, capacity)
