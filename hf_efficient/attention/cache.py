"""Generation state for incremental decoding: one transformers ``Cache`` whose layers the cores build.

A causal model decodes token by token: the prompt runs once through the parallel causal form (prefill) and
leaves a state in every layer, then each new token runs through the layers with that state. What the state
is depends on the mechanism, so each core builds its own layer (:meth:`AttentionCore.new_cache_layer`) and
:class:`EfficientCache` holds one per model layer (per-layer attention types mix freely):

=====================  ===========================================  ===============================
core                   layer                                        held per layer and sequence
=====================  ===========================================  ===============================
``full``               :class:`KeyValueCacheLayer` (transformers'   every key and value: O(n h d)
                       ``DynamicLayer`` plus the keys' padding)
``longformer``         :class:`SlidingWindowCacheLayer`             the last w r keys and values
``linear``,            :class:`RecurrentStateLayer`                 running sums: O(h m d), none in n
``performer``, ``rfa``
=====================  ===========================================  ===============================

The cache is a ``transformers.Cache``: ``generate()`` carries it from step to step, reads
``get_seq_length()`` (tokens seen, padding included) and reorders it for beam search
(``reorder_cache``); every layer implements ``reorder_cache``, ``batch_select_indices`` and
``batch_repeat_interleave`` on all it holds. Recurrent states and windows cannot be rolled back
(``crop``), so assisted generation, which needs that, is refused by ``generate()`` for models holding one
(``_is_stateful``).

Padding: every layer knows which of its keys are real (a key padding mask, or the state itself), so a
prompt padded on the left and a step whose token is padding (a batch decoded with right padding) change
nothing: recurrent cores leave the state as it is on a padded token, key/value layers mask those keys.

Shapes: b = batch, h = heads, n = tokens, d = head size, m = features of a kernelized core.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer


def _append_mask(
    old: torch.Tensor | None, old_length: int, new: torch.Tensor | None, new_length: int, batch: int, device
) -> torch.Tensor | None:
    """Key padding mask (b, old + new) bool after appending ``new_length`` tokens, or None if all are real."""
    if old is None and new is None:
        return None
    if old is None:
        old = torch.ones(batch, old_length, dtype=torch.bool, device=device)
    if new is None:
        new = torch.ones(batch, new_length, dtype=torch.bool, device=device)
    return torch.cat([old, new.to(device=old.device, dtype=torch.bool)], dim=1)


class KeyValueCacheLayer(DynamicLayer):
    """Every key and value so far, (b, h, n, d), as transformers' ``DynamicLayer``, and which keys are real.

    Attributes:
        key_mask: (b, n) bool, False for padded keys; None while every key is real.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.key_mask: torch.Tensor | None = None

    def update_with_mask(
        self, key_states: torch.Tensor, value_states: torch.Tensor, real: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Append n new keys and values with their (b, n) padding mask (None: all real).

        Returns:
            (keys (b, h, T, d), values (b, h, T, d), key mask (b, T) or None) of everything held.
        """
        held = DynamicLayer.get_seq_length(self)  # keys held now (a sliding window counts all seen)
        keys, values = self.update(key_states, value_states)
        self.key_mask = _append_mask(
            self.key_mask, held, real, key_states.shape[-2], key_states.shape[0], key_states.device
        )
        return keys, values, self.key_mask

    def reset(self) -> None:
        super().reset()
        self.key_mask = None

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self.key_mask is not None and tokens_to_remove < 0:
            self.key_mask = self.key_mask[:, :tokens_to_remove]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        if self.key_mask is not None:
            self.key_mask = self.key_mask.index_select(0, beam_idx.to(self.key_mask.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.key_mask is not None:
            self.key_mask = self.key_mask.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.key_mask is not None:
            self.key_mask = self.key_mask[indices]

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors held (keys, values, mask)."""
        return _nbytes(self.keys, self.values, self.key_mask)

    def describe(self) -> str:
        """What the layer keeps, for model cards and docs."""
        return "every key and value so far (grows linearly with the context)"


class SlidingWindowCacheLayer(KeyValueCacheLayer):
    """The last ``window`` keys and values (b, h, <= window, d) and their padding mask: all that a query of a
    causal sliding window, which sees itself and ``window`` earlier tokens, needs from the past.

    Args:
        window: tokens kept (the window's reach back, dilation included).
    """

    is_sliding = True
    is_croppable = False  # tokens that left the window are gone

    def __init__(self, window: int, **kwargs):
        super().__init__(**kwargs)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}.")
        self.window = window
        self.cumulative_length = 0

    def update_with_mask(self, key_states, value_states, real):
        """Append n tokens; returns the kept past and the new tokens, (b, h, <= window + n, d), then keeps the
        last ``window`` for the next call."""
        self.cumulative_length += key_states.shape[-2]
        keys, values, mask = super().update_with_mask(key_states, value_states, real)
        self.keys, self.values = keys[:, :, -self.window :], values[:, :, -self.window :]
        self.key_mask = None if mask is None else mask[:, -self.window :]
        return keys, values, mask

    def get_seq_length(self) -> int:
        """Tokens seen so far (not only those kept)."""
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.window

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        kept = min(self.cumulative_length, self.window)
        return kept + query_length, self.cumulative_length - kept

    def reset(self) -> None:
        super().reset()
        self.cumulative_length = 0

    def crop(self, tokens_to_remove: int) -> None:
        _refuse_crop(self, tokens_to_remove)

    def describe(self) -> str:
        return f"the last {self.window} keys and values (constant in the context)"


class RecurrentStateLayer(CacheLayerMixin):
    """The running state of a recurrent (kernelized or gated) core: a fixed number of batch-first tensors
    whose size does not depend on the number of tokens seen.

    The core that owns the layer decides what the tensors are (linear and performer: the sums
    [sum phi(k) v^T | sum phi(k)] and, for performer, their stabilising shift; rfa: the gated sums) and
    stores them with :meth:`store`; this class only keeps them and follows the batch through generation.

    Attributes:
        state: the tensors, each (b, ...), or None before the first token.
        cumulative_length: tokens seen so far, padding included.
    """

    supports_early_init = False  # the state's shape is the core's business, known at the first store
    is_croppable = False
    is_sliding = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.state: tuple[torch.Tensor, ...] | None = None
        self.cumulative_length = 0

    def store(self, state: Sequence[torch.Tensor], num_tokens: int) -> None:
        """Keep ``state`` (the core's tensors after ``num_tokens`` more tokens)."""
        self.state = tuple(state)
        self.cumulative_length += num_tokens
        self.is_initialized = True
        self.device = self.state[0].device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate ahead: the core stores its state after the prompt (:meth:`store`)."""

    def update(self, key_states, value_states, *args, **kwargs):
        raise TypeError(
            "A RecurrentStateLayer keeps a recurrent state, not keys and values: its core stores the state "
            "with store(); use a KeyValueCacheLayer for a key/value cache."
        )

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1  # no sequence dimension: any number of tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0

    def _map(self, fn) -> None:
        if self.state is not None:
            self.state = tuple(fn(t) for t in self.state)

    def offload(self):
        self._map(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self):
        if self.state is not None and self.state[0].device != self.device:
            self._map(lambda t: t.to(self.device, non_blocking=True))

    def reset(self) -> None:
        self.state, self.cumulative_length, self.is_initialized = None, 0, False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        _refuse_crop(self, tokens_to_remove)

    @property
    def nbytes(self) -> int:
        """Bytes of the state (the same after any number of tokens)."""
        return _nbytes(*(self.state or ()))

    def describe(self) -> str:
        return "a recurrent state of fixed size (constant in the context)"


def _refuse_crop(layer, tokens_to_remove: int) -> None:
    """``crop(0)`` is a no-op; removing tokens from a state that no longer holds them cannot be done."""
    if tokens_to_remove != 0:
        raise ValueError(
            f"{type(layer).__name__} cannot remove tokens (crop({tokens_to_remove})): it keeps a summary of "
            "the past (a recurrent state or a sliding window), not every token. Rerun the prompt instead."
        )


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class EfficientCache(Cache):
    """The generation state of an hf_efficient decoder: one layer per attention layer, each built by that
    layer's core (see the module docstring). ``generate()`` creates it through the model's forward; build one
    by hand with ``model.new_cache()`` or :meth:`for_cores`.

    Args:
        layers: one cache layer per model layer, in layer order.
    """

    def __init__(self, layers: Sequence[CacheLayerMixin]):
        super().__init__(layers=list(layers))

    @classmethod
    def for_cores(cls, cores) -> EfficientCache:
        """An empty cache for these cores, one layer each, in layer order (``core.spec.layer_idx``)."""
        cores = list(cores)
        for position, core in enumerate(cores):
            if core.spec.layer_idx != position:
                raise ValueError(
                    f"core {position} has layer_idx {core.spec.layer_idx}: pass one core per layer, in order."
                )
        return cls([core.new_cache_layer() for core in cores])

    def layer_for(self, layer_idx: int, name: str, expected: type) -> CacheLayerMixin:
        """The layer of ``layer_idx``, checked to be of the type that core builds."""
        if not 0 <= layer_idx < len(self.layers):
            raise ValueError(
                f"{name}: the cache has {len(self.layers)} layers, none for layer_idx={layer_idx}. Build the "
                "cache for this model (model.new_cache())."
            )
        layer = self.layers[layer_idx]
        if not isinstance(layer, expected):
            raise TypeError(
                f"{name}: layer {layer_idx} of the cache is a {type(layer).__name__}, but this core decodes "
                f"from a {expected.__name__}. The cache was built for another model; use model.new_cache()."
            )
        return layer

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer (what grows, or not, with the context)."""
        return sum(layer.nbytes for layer in self.layers)

    def __repr__(self):
        seen = self.get_seq_length() if self.layers else 0
        return f"{type(self).__name__}(layers={self.layers}, tokens_seen={seen}, nbytes={self.nbytes})"


__all__ = [
    "EfficientCache",
    "KeyValueCacheLayer",
    "RecurrentStateLayer",
    "SlidingWindowCacheLayer",
]
