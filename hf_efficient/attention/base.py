"""The attention contract shared by every mechanism.

A *core* computes attention from already-projected heads. Projections (query/key/value/output) live
outside it, in the encoder block, so that every variant uses the same parameter names and a checkpoint
trained with exact attention warm-starts any variant (only the variant's own parameters are new).

Shapes (the whole package uses these names):
    b = batch, h = heads, n = sequence length, d = head_dim, E = number of edges.

    query, key, value : (b, h, n, d)
    attention_mask    : (b, n) key padding mask, True (or 1) = real token, as HF's ``attention_mask``
    attention_bias    : additive scores bias broadcastable to (b, h, n, n)   [only if supported]
    edges             : :class:`GraphEdges` over the flattened (b * n) positions [only if supported]
    global_attention_mask : (b, n) bool, True = a global token (attends to / is attended by all)
                        [only if supported; Longformer's per-example global tokens]
    output            : (b, h, n, d); rows of padded query positions are exactly 0
    weights           : (b, h, n, n) attention probabilities, only when requested and supported

Each core declares what it can honour in :class:`AttentionCapabilities`. :meth:`AttentionCore.forward`
checks every input against those flags and raises a ``ValueError`` naming the problem and the fix;
nothing is silently ignored. Subclasses implement :meth:`AttentionCore._attend` only.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

MODALITIES = ("text", "vision", "graph")


@dataclass(frozen=True)
class AttentionCapabilities:
    """What a core can honour. Anything not declared raises when given."""

    padding_mask: bool = True  # boolean key padding mask (b, n)
    attention_bias: bool = False  # dense additive bias (b, h, n, n)
    edges: bool = False  # accepts GraphEdges
    global_attention_mask: bool = False  # per-example global tokens (b, n)
    requires_edges: bool = False  # cannot run without GraphEdges
    causal: bool = False  # is_causal=True
    output_attentions: bool = False  # can return (b, h, n, n) weights
    shared_query_key: bool = False  # keys are the queries (Reformer): the block must pass key=query
    fixed_max_length: bool = False  # needs spec.max_seq_len and refuses longer inputs (Linformer)
    permutation_equivariant: bool = False  # permuting tokens permutes outputs (no notion of position)
    patch_grid: bool = False  # attends by 2-D patch position: reads spec.grid_size, tokens in grid order
    modalities: frozenset[str] = frozenset(MODALITIES)


@dataclass(frozen=True)
class AttentionSpec:
    """Model-level facts a core needs, filled in by the encoder block (not by the user).

    Attributes:
        num_heads: number of heads h.
        head_dim: size d of each head.
        dropout: dropout probability on attention probabilities (``attention_probs_dropout_prob``).
        attn_implementation: HF kernel for exact softmax (``"eager"``, ``"sdpa"``, ``"flex_attention"``...),
            used by ``full`` and by dense sub-blocks inside other cores.
        max_seq_len: the model's maximum sequence length (``max_position_embeddings``), if it has one.
        layer_idx: index of the layer owning this core (seeds per-layer random state).
        grid_size: (height, width) of the patch grid of a vision model, set by the model (and updated when
            it sees another image size); only cores with ``capabilities.patch_grid`` read it. The sequence
            is then ``num_prefix_tokens`` tokens (e.g. [CLS]) followed by the patches in row-major order.
        num_prefix_tokens: tokens before the patch grid (ViT's [CLS]: 1).
    """

    num_heads: int
    head_dim: int
    dropout: float = 0.0
    attn_implementation: str = "sdpa"
    max_seq_len: int | None = None
    layer_idx: int = 0
    grid_size: tuple[int, int] | None = None
    num_prefix_tokens: int = 0

    def __post_init__(self):
        if self.num_heads < 1 or self.head_dim < 1:
            raise ValueError(
                f"num_heads and head_dim must be positive, got {self.num_heads}, {self.head_dim}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {self.dropout}")
        if self.grid_size is not None and (len(self.grid_size) != 2 or min(self.grid_size) < 1):
            raise ValueError(f"grid_size must be (height, width) of positive ints, got {self.grid_size}")
        if self.num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens must be >= 0, got {self.num_prefix_tokens}")


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


class AttentionOutput(NamedTuple):
    output: torch.Tensor  # (b, h, n, d)
    weights: torch.Tensor | None  # (b, h, n, n) or None


@dataclass
class AttentionConfig:
    """Base of every core's hyperparameters (its ``attention_config``). Subclasses add fields."""

    def validate(self) -> None:
        """Check value ranges; raise ValueError naming the field. Subclasses extend."""

    @classmethod
    def from_dict(cls, attention_type: str, values: dict[str, Any] | None) -> AttentionConfig:
        values = dict(values or {})
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            valid = ", ".join(names) if names else "(none: this attention has no hyperparameters)"
            raise ValueError(
                f"Unknown attention_config key(s) {unknown} for attention_type={attention_type!r}. "
                f"Valid keys: {valid}."
            )
        hints = typing.get_type_hints(cls)
        for name, value in values.items():
            _check_type(attention_type, name, value, hints[name])
        config = cls(**values)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_type(attention_type: str, name: str, value: Any, hint: Any) -> None:
    """Light runtime type check of a JSON-ish attention_config value against its annotation."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else (hint,)
    for option in allowed:
        origin = typing.get_origin(option) or option
        if option is type(None) and value is None:
            return
        if origin is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if origin is int and isinstance(value, int) and not isinstance(value, bool):
            return
        if origin in (list, tuple) and isinstance(value, (list, tuple)):
            return
        if origin is typing.Literal and value in typing.get_args(option):
            return
        if isinstance(origin, type) and origin not in (float, int) and isinstance(value, origin):
            return
    raise ValueError(
        f"attention_config[{name!r}] for attention_type={attention_type!r} must be {hint}, got {value!r}."
    )


_UnionType = type(int | None)


class AttentionCore(nn.Module):
    """Base class of every attention mechanism. Subclasses set the class attributes and ``_attend``.

    Class attributes:
        attention_type: registry key (set by ``register_attention``).
        config_class: the dataclass of this core's hyperparameters.
        capabilities: what the core can honour.
        paper: citation shown in errors and model cards.
        small_config: hyperparameters for tiny models (see below).
    """

    attention_type: ClassVar[str] = ""
    config_class: ClassVar[type[AttentionConfig]] = AttentionConfig
    capabilities: ClassVar[AttentionCapabilities] = AttentionCapabilities()
    paper: ClassVar[str] = ""
    # Hyperparameters that suit tiny models (hidden 32, sequences of tens of tokens): used by docs, the
    # registry-wide tests and the demo, so a new variant is exercised the moment it registers.
    small_config: ClassVar[dict[str, Any]] = {}
    # Names of this core's own parameters that weight decay must leave alone: a learned temperature or a
    # normalisation gain decayed toward 0 flattens attention whatever the data says (RFA's sigma fell from
    # 1 to e^(-wd * sum lr) = 0.64 in a Fashion-MNIST run). transformers' Trainer only spares biases and
    # LayerNorm modules; hf_efficient.training.EfficientTrainer also spares these.
    no_weight_decay: ClassVar[tuple[str, ...]] = ()

    def __init__(self, spec: AttentionSpec, config: AttentionConfig | None = None):
        super().__init__()
        self.spec = spec
        self.config = config if config is not None else self.config_class()
        self.num_heads = spec.num_heads
        self.head_dim = spec.head_dim
        self.scaling = spec.head_dim**-0.5

    # ---- hooks for subclasses -------------------------------------------------------------------
    def _attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *,
        attention_bias: torch.Tensor | None,
        edges: GraphEdges | None,
        global_attention_mask: torch.Tensor | None,
        is_causal: bool,
        output_attentions: bool,
    ) -> AttentionOutput:
        """Compute attention on validated inputs.

        ``attention_mask`` is bool (b, n) or None (nothing padded); ``global_attention_mask`` is bool (b, n)
        or None. Inputs the core does not declare in its capabilities are guaranteed None/False here.
        """
        raise NotImplementedError

    def init_weights(self) -> None:
        """(Re)initialise the core's own parameters and persistent random state.

        Called by the model's ``_init_weights``, also after ``from_pretrained`` built the model on the meta
        device; loaded checkpoint values then overwrite whatever is saved. Cores whose random state is a
        deterministic function of a seed rebuild it here.
        """

    def share_parameters_with(self, first: AttentionCore) -> None:
        """Cross-layer parameter sharing hook (e.g. Linformer's layerwise projections).

        The encoder calls it on every later core with the first core of the same type (layer 0's, or with
        per-layer attention types the first layer that uses this type).
        Default: nothing is shared.
        """

    def resample_random_state(self, seed: int) -> None:
        """Redraw training-time random state (random features, hash rotations). Default: none to redraw.

        Called explicitly, by :class:`hf_efficient.training.RandomStateCallback` or a custom loop; never
        from inside ``forward``.
        """

    def extra_repr(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.config.to_dict().items())
        return f"heads={self.num_heads}, head_dim={self.head_dim}" + (f", {fields}" if fields else "")

    # ---- the public entry point -----------------------------------------------------------------
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        attention_bias: torch.Tensor | None = None,
        edges: GraphEdges | None = None,
        global_attention_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        output_attentions: bool = False,
    ) -> AttentionOutput:
        """Validate the inputs against the capabilities, run the core, zero padded query rows.

        Returns:
            AttentionOutput(output (b, h, n, d), weights (b, h, n, n) or None).
        """
        mask = self._check_inputs(
            query, key, value, attention_mask, attention_bias, edges, is_causal, output_attentions
        )
        global_mask = self._check_global_mask(global_attention_mask, query.shape[0], query.shape[2], mask)
        out = self._attend(
            query,
            key,
            value,
            mask,
            attention_bias=attention_bias,
            edges=edges,
            global_attention_mask=global_mask,
            is_causal=is_causal,
            output_attentions=output_attentions,
        )
        output, weights = out
        if mask is not None:
            # Padded query rows carry no meaning; make them exactly 0 so garbage (even inf/NaN from
            # poisoned padding) can never flow into the next layer or a loss.
            output = output.masked_fill(~mask[:, None, :, None], 0.0)
        return AttentionOutput(output, weights)

    def _check_global_mask(self, global_mask, b, n, mask) -> torch.Tensor | None:
        name = self.attention_type or type(self).__name__
        if global_mask is None:
            return None
        if not self.capabilities.global_attention_mask:
            raise ValueError(
                f"{name} has no per-example global tokens; drop global_attention_mask or use "
                "attention_type='longformer'."
            )
        if global_mask.shape != (b, n):
            raise ValueError(
                f"{name}: global_attention_mask must have shape (batch, seq) = {(b, n)}, "
                f"got {tuple(global_mask.shape)}."
            )
        global_mask = global_mask.bool()
        if mask is not None:
            global_mask = global_mask & mask  # a padded token is never global
        return global_mask if bool(global_mask.any()) else None

    def _check_inputs(
        self, query, key, value, attention_mask, attention_bias, edges, is_causal, output_attentions
    ) -> torch.Tensor | None:
        name, caps = self.attention_type or type(self).__name__, self.capabilities
        for label, t in (("query", query), ("key", key), ("value", value)):
            if t.dim() != 4:
                raise ValueError(
                    f"{name}: {label} must have shape (batch, heads, seq, head_dim), got {tuple(t.shape)}. "
                    "Split hidden states into heads first: x.view(b, n, heads, head_dim).transpose(1, 2)."
                )
        b, h, n, d = query.shape
        if h != self.num_heads or d != self.head_dim:
            raise ValueError(
                f"{name}: expected {self.num_heads} heads of size {self.head_dim}, got query of shape "
                f"{tuple(query.shape)}. Build the core with the model's num_attention_heads and head size."
            )
        if key.shape != query.shape or value.shape[:3] != query.shape[:3]:
            raise ValueError(
                f"{name}: query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} "
                "must share (batch, heads, seq); this is self-attention over one sequence."
            )
        if n == 0:
            raise ValueError(f"{name}: the sequence is empty (seq = 0).")
        if caps.shared_query_key and key is not query:
            raise ValueError(
                f"{name} shares queries and keys (keys are the normalised queries): call it with key=query. "
                "The encoder blocks do this for you."
            )
        if caps.fixed_max_length and self.spec.max_seq_len is not None and n > self.spec.max_seq_len:
            raise ValueError(
                f"{name}: got {n} tokens but this core was built for at most max_seq_len="
                f"{self.spec.max_seq_len}. Rebuild with a larger maximum length."
            )
        if is_causal and not caps.causal:
            raise ValueError(f"{name} has no causal form; use one of the causal attention types.")
        if output_attentions and not caps.output_attentions:
            raise ValueError(
                f"{name} never forms the (seq x seq) attention matrix, so it cannot return attention "
                "weights. Call with output_attentions=False, or use attention_type='full' to inspect weights."
            )
        if attention_bias is not None:
            if not caps.attention_bias:
                raise ValueError(
                    f"{name} cannot add a dense attention_bias (that would need the n x n score matrix). "
                    "Use attention_type='full' for biased attention, or drop the bias."
                )
            if (
                attention_bias.dim() != 4
                or attention_bias.shape[-2:] != (n, n)
                or any(s not in (1, t) for s, t in zip(attention_bias.shape[:2], (b, h), strict=True))
            ):
                raise ValueError(
                    f"{name}: attention_bias must broadcast to (batch, heads, seq, seq) = {(b, h, n, n)}, "
                    f"got {tuple(attention_bias.shape)}."
                )
        if edges is not None and not caps.edges:
            raise ValueError(f"{name} does not take graph edges; use attention_type='graph_sparse'.")
        if edges is None and caps.requires_edges:
            raise ValueError(
                f"{name} attends along graph edges and needs `edges` (GraphEdges with edge_index of shape "
                "(2, E)); none were given. Pass the graph's edges, or choose a dense attention type."
            )
        mask = normalize_padding_mask(attention_mask, b, n, name)
        if mask is not None and not caps.padding_mask:
            raise ValueError(f"{name} cannot honour a padding mask; pass sequences of equal length.")
        if edges is not None:
            check_edges(edges, b, n, mask, name)
        return mask


def normalize_padding_mask(
    attention_mask: torch.Tensor | None, b: int, n: int, name: str = "attention"
) -> torch.Tensor | None:
    """Turn HF's (b, n) 0/1 or bool mask into bool (True = real), or None when nothing is padded."""
    if attention_mask is None:
        return None
    if attention_mask.shape != (b, n):
        raise ValueError(
            f"{name}: attention_mask must be a (batch, seq) = {(b, n)} key padding mask with 1/True for real "
            f"tokens, got shape {tuple(attention_mask.shape)}. Pass the tokenizer's attention_mask; encoders "
            "build their own 4-D masks."
        )
    if attention_mask.dtype != torch.bool:
        if attention_mask.is_floating_point() and bool(((attention_mask != 0) & (attention_mask != 1)).any()):
            raise ValueError(
                f"{name}: attention_mask must hold only 0/1 (or bool); got other values. An additive mask "
                "(0 / -inf) is not a padding mask: pass the tokenizer's 0/1 mask instead."
            )
        attention_mask = attention_mask != 0
    real_per_row = attention_mask.sum(-1)
    if bool((real_per_row == 0).any()):
        raise ValueError(f"{name}: some sequences in the batch have no real token (attention_mask all 0).")
    if bool((real_per_row == n).all()):
        return None
    return attention_mask


def check_edges(edges: GraphEdges, b: int, n: int, mask: torch.Tensor | None, name: str) -> None:
    """Validate GraphEdges against a padded (b, n) batch."""
    ei = edges.edge_index
    if ei.dim() != 2 or ei.shape[0] != 2 or ei.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"{name}: edge_index must be an integer tensor of shape (2, E), got {tuple(ei.shape)} {ei.dtype}."
        )
    if ei.shape[1] == 0:
        raise ValueError(f"{name}: the graph has no edges; add self-loops or edges before attention.")
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
    num_edges = ei.shape[1]
    if edges.edge_weight is not None:
        w = edges.edge_weight
        if w.shape != (num_edges,):
            raise ValueError(
                f"{name}: edge_weight must have shape (E,) = ({num_edges},), got {tuple(w.shape)}."
            )
        if bool((w <= 0).any()) or not bool(torch.isfinite(w).all()):
            raise ValueError(f"{name}: edge_weight must be finite and positive (p_ij ∝ w_ij exp(s_ij)).")
    if edges.edge_attr is not None and (edges.edge_attr.dim() != 2 or edges.edge_attr.shape[0] != num_edges):
        raise ValueError(
            f"{name}: edge_attr must have shape (E, F) with E = {num_edges}, got "
            f"{tuple(edges.edge_attr.shape)}."
        )


__all__ = [
    "AttentionCapabilities",
    "AttentionConfig",
    "AttentionCore",
    "AttentionOutput",
    "AttentionSpec",
    "GraphEdges",
    "check_edges",
    "normalize_padding_mask",
]
