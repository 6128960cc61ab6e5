"""What a core is told about one call besides query, key and value: :class:`AttentionInputs`, and its checks.

A model builds one :class:`AttentionInputs` per forward (padding mask, bias, edges, flags, the patch grid,
the kernel) and passes the same object to every layer; each core reads the fields it declared in its
:class:`~hf_efficient.attention.base.AttentionCapabilities`. Checks come in two kinds:

* :meth:`AttentionInputs.prepare`: the checks that read tensor values (a padding mask of 0/1, edges inside
  the batch, positive edge weights) and the normalisation every core relies on (the padding mask becomes
  bool, or None when nothing is padded). It runs once: the model calls it at its entry point, and a core
  called directly on unprepared inputs calls it itself.
* :func:`check_supported`: for every core on every call, shape-only checks of the inputs against that
  core's capabilities (no tensor is read, so it costs nothing and traces cleanly); an input the core cannot
  honour raises a ``ValueError`` naming the problem and the fix, nothing is silently ignored.

Under ``torch.export`` and ``torch.compile`` (:func:`is_tracing`) a graph cannot branch on tensor values, so
:meth:`AttentionInputs.prepare` keeps the shape checks and the normalisation that needs no value (the mask
becomes bool) and skips the rest: the value checks are not run (an exported program trusts its inputs: a
0/1 padding mask, edges inside their own graph and away from padding, positive edge weights), the padding
mask is kept even when nothing is padded, and ``empty_rows`` / ``global_attention_mask`` stay tensors even
when no row is empty / no token global. Every core gives the same outputs either way (a mask of all ones
changes nothing), so an exported or compiled model equals the eager one on valid inputs.

Shapes: b = batch, h = heads, n = sequence length, E = number of edges.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ._catalog import causal_attention_types
from .packing import PackedSequences

if TYPE_CHECKING:
    from .base import AttentionCapabilities
    from .rotary import RotaryPositions


def is_tracing() -> bool:
    """True while ``torch.export`` or ``torch.compile`` traces the code (no branching on tensor values)."""
    return torch.compiler.is_compiling()


@dataclass
class GraphEdges:
    """Directed edges over the flattened (b * n) node positions of a padded batch.

    Node ``i`` of graph ``g`` sits at flat position ``g * n + i``. Messages flow source -> target, as in
    PyG: target ``edge_index[1, e]`` (a query) attends to source ``edge_index[0, e]`` (a key).

    Attributes:
        edge_index: (2, E) int64, row 0 = source (key) position, row 1 = target (query) position.
        edge_weight: optional (E,) positive weights; attention becomes p_ij ∝ w_ij exp(s_ij).
        edge_attr: optional (E, F) edge features, for cores that project them into the scores.
    """

    edge_index: torch.Tensor
    edge_weight: torch.Tensor | None = None
    edge_attr: torch.Tensor | None = None

    @property
    def num_edges(self) -> int:
        return self.edge_index.shape[1]


_TENSOR_FIELDS = {"attention_mask", "attention_bias", "edges", "global_attention_mask"}


@dataclass(frozen=True)
class AttentionInputs:
    """Everything besides query/key/value that one attention call may take; every field is optional.

    Attributes:
        attention_mask: (b, n) key padding mask, True / 1 = real token (HF's ``attention_mask``). After
            :meth:`prepare`: bool, or None when nothing is padded.
        attention_bias: additive score bias broadcastable to (b, h, n, n) (Graphormer's encodings).
        edges: :class:`GraphEdges` for cores that attend along a graph's edges.
        global_attention_mask: (b, n), True = a global token (attends to / is attended by all; Longformer's
            per-example global tokens). After :meth:`prepare`: bool, never True at padding, None if no token
            is global.
        is_causal: query i sees keys j <= i only.
        output_attentions: also return the (b, h, n, n) attention probabilities.
        attn_implementation: HF kernel for exact softmax in this call (``"eager"``, ``"sdpa"``,
            ``"flex_attention"``...); None = the core's ``spec.attn_implementation``. Models pass their
            config's current ``_attn_implementation``, so ``set_attn_implementation`` takes effect at once.
        grid_size: (height, width) of the patch grid when the sequence is ``num_prefix_tokens`` tokens
            followed by every patch in row-major order (ViT); None otherwise (MAE's visible subset). Read
            by cores that attend by 2-D position (``capabilities.patch_grid``).
        num_prefix_tokens: tokens before the patch grid (ViT's [CLS]: 1).
        cache: generation state for incremental decoding, shared by all layers (each core finds its own
            part by ``spec.layer_idx``); None when not generating.
        block_mask: a precomputed FlexAttention ``BlockMask`` for cores that run on FlexAttention.
        relative_positions: learned relative position scores to add to every (query, key) score
            (:class:`~hf_efficient.attention.relative.RelativePositions`: BERT's ``relative_key`` /
            ``relative_key_query``), for cores with ``capabilities.relative_positions``; the block owning the
            layer's distance table sets it for its own call. Positions are the sequence's indices (0..n-1;
            with a cache, the new tokens follow the cached ones).
        rotary: the :class:`~hf_efficient.attention.rotary.RotaryPositions` of the tokens (RoPE), for
            models whose positions are rotary; carried by the cores that declare ``capabilities.rotary``
            (refused by the others, naming why). Shapes are checked by each core; a model replaces it per
            layer kind (ModernBERT's theta of its global and of its window layers) with :meth:`replace`.
        empty_rows: (b,) bool, True for sequences with no real token at all (a batch of real data padded
            to a common length can hold one); set by :meth:`prepare`, None when there is none. Their
            output rows are 0, like every padded query row.
        packed: the sequences of a packed stream (:class:`~hf_efficient.attention.packing.PackedSequences`):
            query, key and value are (1, h, T, d), the B sequences one after another with no padding, and
            attention stays within each sequence; None: a padded batch.
        prepared_for: (b, n) once :meth:`prepare` has checked and normalised the inputs for that shape;
            set by :meth:`prepare` only.
    """

    attention_mask: torch.Tensor | None = None
    attention_bias: torch.Tensor | None = None
    edges: GraphEdges | None = None
    global_attention_mask: torch.Tensor | None = None
    is_causal: bool = False
    output_attentions: bool = False
    attn_implementation: str | None = None
    grid_size: tuple[int, int] | None = None
    num_prefix_tokens: int = 0
    cache: Any = None
    block_mask: Any = None
    relative_positions: Any = None
    rotary: RotaryPositions | None = None
    packed: PackedSequences | None = None
    empty_rows: torch.Tensor | None = dataclasses.field(default=None, repr=False)
    prepared_for: tuple[int, int] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        grid = self.grid_size
        if grid is not None and (len(grid) != 2 or min(grid) < 1):
            raise ValueError(f"grid_size must be (height, width) of positive ints, got {grid}.")
        if self.num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens must be >= 0, got {self.num_prefix_tokens}.")

    def replace(self, **changes) -> AttentionInputs:
        """A copy with some fields changed; changed tensors are checked again by the next :meth:`prepare`."""
        # Dropping a tensor (None) needs no new check; a new tensor does.
        if "prepared_for" not in changes and any(
            changes[f] is not None for f in _TENSOR_FIELDS & set(changes)
        ):
            changes["prepared_for"] = None
        return dataclasses.replace(self, **changes)

    def prepare(self, batch: int, seq: int, name: str = "attention") -> AttentionInputs:
        """Check the inputs' tensor values for a (batch, seq) call and normalise them (see the module
        docstring); returns ``self`` when already prepared for that shape. ``name`` opens every message."""
        if self.prepared_for == (batch, seq):
            return self
        traced = is_tracing()  # no value checks, and tensors kept where eager mode drops them by value
        if self.packed is not None:
            check_packed(self, batch, seq, name)
        mask = normalize_padding_mask(self.attention_mask, batch, seq, name, read_values=not traced)
        empty = None
        if mask is not None:
            empty = ~mask.any(-1)  # (b,)
            empty = empty if traced or bool(empty.any()) else None
        if self.edges is not None:
            check_edges(self.edges, batch, seq, mask, name, read_values=not traced)
        global_mask = normalize_global_mask(
            self.global_attention_mask, batch, seq, mask, name, read_values=not traced
        )
        return dataclasses.replace(
            self,
            attention_mask=mask,
            global_attention_mask=global_mask,
            empty_rows=empty,
            prepared_for=(batch, seq),
        )

    def with_empty_rows_filled(self) -> AttentionInputs:
        """The inputs a core computes with when some sequences are all padding: their keys count as real (so
        every core has something to attend to; the caller zeroes their query/key/value and their output)."""
        if self.empty_rows is None:
            return self
        mask = self.attention_mask | self.empty_rows[:, None]  # (b, n)
        return dataclasses.replace(self, attention_mask=mask, empty_rows=None)


def check_supported(
    inputs: AttentionInputs, capabilities: AttentionCapabilities, shape: tuple[int, ...], name: str
) -> None:
    """Raise a ``ValueError`` for any input a core with ``capabilities`` cannot honour on (b, h, n, d)
    queries; shapes only, no tensor values are read."""
    b, h, n, _ = shape
    if inputs.is_causal and not capabilities.causal:
        raise ValueError(
            f"{name} has no causal form (is_causal=True, a decoder). Causal attention types: "
            f"{', '.join(causal_attention_types())}."
        )
    if inputs.output_attentions and not capabilities.output_attentions:
        raise ValueError(
            f"{name} never forms the (seq x seq) attention matrix, so it cannot return attention "
            "weights. Call with output_attentions=False, or use attention_type='full' to inspect weights."
        )
    bias = inputs.attention_bias
    if bias is not None:
        if not capabilities.attention_bias:
            raise ValueError(
                f"{name} cannot add a dense attention_bias (that would need the n x n score matrix). "
                "Use attention_type='full' for biased attention, or drop the bias."
            )
        if (
            bias.dim() != 4
            or bias.shape[-2:] != (n, n)
            # (t, 1): a traced size equal to t is settled without asking whether it is 1 (a guard)
            or any(s not in (t, 1) for s, t in zip(bias.shape[:2], (b, h), strict=True))
        ):
            raise ValueError(
                f"{name}: attention_bias must broadcast to (batch, heads, seq, seq) = {(b, h, n, n)}, "
                f"got {tuple(bias.shape)}."
            )
    if inputs.edges is not None and not capabilities.edges:
        raise ValueError(f"{name} does not take graph edges; use attention_type='graph_sparse'.")
    if inputs.edges is None and capabilities.requires_edges:
        raise ValueError(
            f"{name} attends along graph edges and needs `edges` (GraphEdges with edge_index of shape "
            "(2, E)); none were given. Pass the graph's edges, or choose a dense attention type."
        )
    if inputs.attention_mask is not None and not capabilities.padding_mask:
        raise ValueError(f"{name} cannot honour a padding mask; pass sequences of equal length.")
    if inputs.global_attention_mask is not None and not capabilities.global_attention_mask:
        raise ValueError(
            f"{name} has no per-example global tokens; drop global_attention_mask or use "
            "attention_type='longformer'."
        )


def check_packed(inputs: AttentionInputs, b: int, n: int, name: str) -> None:
    """A packed stream is one row of the packed sequences' tokens, with nothing padded and no cache."""
    packed = inputs.packed
    if b != 1 or n != packed.total:
        raise ValueError(
            f"{name}: packed sequences are one row of all their tokens, (1, heads, T = {packed.total}, "
            f"head_dim), got a batch of {b} x {n}."
        )
    if inputs.attention_mask is not None:
        raise ValueError(
            f"{name}: a packed stream has no padding; drop attention_mask (the sequences' boundaries are in "
            "packed)."
        )
    if inputs.cache is not None:
        raise ValueError(f"{name}: generation decodes padded batches; drop packed to decode with a cache.")
    if inputs.output_attentions:
        raise ValueError(
            f"{name}: attention weights of packed sequences are one matrix per sequence, not one tensor; "
            "call with output_attentions=False, or run a padded batch to inspect weights."
        )
    if inputs.attention_bias is not None:
        raise ValueError(
            f"{name}: an (n x n) attention_bias belongs to a padded batch; run padded to add one."
        )


def normalize_padding_mask(
    attention_mask: torch.Tensor | None, b: int, n: int, name: str = "attention", read_values: bool = True
) -> torch.Tensor | None:
    """Turn HF's (b, n) 0/1 or bool mask into bool (True = real), or None when nothing is padded.

    With ``read_values=False`` (tracing) the values are not checked and the bool mask is kept even when
    every token is real."""
    if attention_mask is None:
        return None
    if attention_mask.shape != (b, n):
        raise ValueError(
            f"{name}: attention_mask must be a (batch, seq) = {(b, n)} key padding mask with 1/True for real "
            f"tokens, got shape {tuple(attention_mask.shape)}. Pass the tokenizer's attention_mask; encoders "
            "build their own 4-D masks."
        )
    if attention_mask.dtype != torch.bool:
        if (
            read_values
            and attention_mask.is_floating_point()
            and bool(((attention_mask != 0) & (attention_mask != 1)).any())
        ):
            raise ValueError(
                f"{name}: attention_mask must hold only 0/1 (or bool); got other values. An additive mask "
                "(0 / -inf) is not a padding mask: pass the tokenizer's 0/1 mask instead."
            )
        attention_mask = attention_mask != 0
    if read_values and bool(attention_mask.all()):
        return None
    return attention_mask


def normalize_global_mask(
    global_mask: torch.Tensor | None,
    b: int,
    n: int,
    mask: torch.Tensor | None,
    name: str = "attention",
    read_values: bool = True,
) -> torch.Tensor | None:
    """(b, n) bool of global tokens (never a padded one), or None when no token is global (kept as a tensor
    with ``read_values=False``)."""
    if global_mask is None:
        return None
    if global_mask.shape != (b, n):
        raise ValueError(
            f"{name}: global_attention_mask must have shape (batch, seq) = {(b, n)}, "
            f"got {tuple(global_mask.shape)}."
        )
    global_mask = global_mask.bool()
    if mask is not None:
        global_mask = global_mask & mask  # a padded token is never global
    return global_mask if not read_values or bool(global_mask.any()) else None


def check_edges(
    edges: GraphEdges, b: int, n: int, mask: torch.Tensor | None, name: str, read_values: bool = True
) -> None:
    """Validate GraphEdges against a padded (b, n) batch: :func:`check_edge_index`, at least one edge (a
    core attending along edges has nothing to attend to otherwise), :func:`check_edge_features` (shapes
    only with ``read_values=False``, while traced)."""
    check_edge_index(edges.edge_index, b, n, mask, name, read_values)
    if edges.num_edges == 0:
        raise ValueError(f"{name}: the graph has no edges; add self-loops or edges before attention.")
    check_edge_features(edges.num_edges, edges.edge_weight, edges.edge_attr, name, read_values)


def check_edge_index(
    edge_index: torch.Tensor, b: int, n: int, mask: torch.Tensor | None, name: str, read_values: bool = True
) -> None:
    """(2, E) integer edges over the flattened positions of a padded (b, n) batch: inside the batch (a
    negative position would silently wrap around in indexing), within one graph, never at padding. With
    ``read_values=False`` (traced) only the shape and dtype are checked: the values are trusted."""
    ei = edge_index
    if ei.dim() != 2 or ei.shape[0] != 2 or ei.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"{name}: edge_index must be an integer tensor of shape (2, E), got {tuple(ei.shape)} {ei.dtype}."
        )
    if ei.shape[1] == 0 or not read_values:
        return
    lo, hi = int(ei.min()), int(ei.max())
    if lo < 0 or hi >= b * n:
        raise ValueError(
            f"{name}: edge_index holds node positions in [{lo}, {hi}] but the padded batch has only "
            f"batch * seq = {b * n} positions (graph g's node i is g * seq + i)."
        )
    if bool((ei[0] // n != ei[1] // n).any()):
        raise ValueError(f"{name}: some edges join nodes of different graphs in the batch.")
    if mask is not None and not bool(mask.reshape(-1)[ei].all()):
        raise ValueError(f"{name}: some edges touch padded node positions; drop them or fix the node mask.")


def check_edge_features(
    num_edges: int,
    edge_weight: torch.Tensor | None,
    edge_attr: torch.Tensor | None,
    name: str,
    read_values: bool = True,
) -> None:
    """One finite positive weight (E,) and one feature row (E, F) per edge, when given (the weights' values
    only with ``read_values``)."""
    if edge_weight is not None:
        w = edge_weight
        if w.shape != (num_edges,):
            raise ValueError(
                f"{name}: edge_weight must have shape (E,) = ({num_edges},), got {tuple(w.shape)}."
            )
        if read_values and (bool((w <= 0).any()) or not bool(torch.isfinite(w).all())):
            raise ValueError(f"{name}: edge_weight must be finite and positive (p_ij ∝ w_ij exp(s_ij)).")
    if edge_attr is not None and (edge_attr.dim() != 2 or edge_attr.shape[0] != num_edges):
        raise ValueError(
            f"{name}: edge_attr must have shape (E, F) with one row per edge, E = {num_edges}, got "
            f"{tuple(edge_attr.shape)}."
        )


__all__ = [
    "AttentionInputs",
    "GraphEdges",
    "check_edge_features",
    "check_edge_index",
    "check_edges",
    "check_supported",
    "is_tracing",
    "normalize_global_mask",
    "normalize_padding_mask",
]
