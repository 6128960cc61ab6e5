"""The attention contract shared by every mechanism.

A *core* computes attention from already-projected heads. Projections (query/key/value/output) live
outside it, in the encoder block, so that every variant uses the same parameter names and a checkpoint
trained with exact attention warm-starts any variant (only the variant's own parameters are new).

Shapes (the whole package uses these names):
    b = batch, h = heads, n = sequence length, d = head_dim, E = number of edges.

    query, key, value : (b, h, n, d)
    inputs            : :class:`~hf_efficient.attention.inputs.AttentionInputs`, everything else about the
                        call (padding mask, bias, edges, global tokens, causal, weights wanted, kernel,
                        patch grid, cache, rotary positions), built once per model forward and passed to
                        every layer unchanged (a model with rotary positions replaces them per layer kind)
    output            : (b, h, n, d); rows of padded query positions are exactly 0
    weights           : (b, h, n, n) attention probabilities, only when requested and supported (cores over
                        edges return a sparse COO tensor holding one entry per edge and head)

Each core declares what it can honour in :class:`AttentionCapabilities`; :meth:`AttentionCore.forward`
checks the inputs against them (:mod:`~hf_efficient.attention.inputs`) and raises a ``ValueError`` naming
the problem and the fix, so nothing is silently ignored.

Reference and kernels: a mechanism's file (``attention/<name>.py``) holds its maths in one piece,
:meth:`AttentionCore.reference` (the paper's equations, plain differentiable torch ops, the path that
traces and exports). Faster ways to compute the same thing (chunked CPU forms, custom autograd functions,
FlexAttention block masks, GPU kernels) live in ``attention/kernels/`` and are listed on the core as
:class:`Kernel` s. The hyperparameter ``implementation`` (every type's ``attention_config`` has it) picks
one: ``"auto"`` (default) the first kernel that suits the call (device, dropout, sizes), else the
reference; ``"reference"`` always the reference; a kernel's name that kernel. Every kernel equals its
reference (tests/attention/test_kernels.py). Subclasses state their facts (paper, cost, FLOP model,
settings for tiny models) as class attributes, which the registry and the docs table read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn
from transformers.cache_utils import CacheLayerMixin

from ._catalog import causal_attention_types, relative_position_types, rotary_attention_types
from .config import AttentionConfig
from .inputs import AttentionInputs, check_supported, is_tracing
from .rotary import ROTARY_MODES, ROTATE_FEATURE_MAPS, ROTATE_QUERIES_AND_KEYS

MODALITIES = ("text", "vision", "graph")


@dataclass(frozen=True)
class AttentionCapabilities:
    """What a core can honour. Anything not declared raises when given."""

    padding_mask: bool = True  # boolean key padding mask (b, n)
    attention_bias: bool = False  # dense additive bias (b, h, n, n)
    edges: bool = False  # accepts GraphEdges
    global_attention_mask: bool = False  # per-example global tokens (b, n)
    requires_edges: bool = False  # cannot run without GraphEdges
    # is_causal=True: a parallel causal form, and incremental decoding from a cache (new_cache_layer and
    # _attend_cached), equal to it
    causal: bool = False
    output_attentions: bool = False  # can return (b, h, n, n) weights (dense, or sparse COO over edges)
    shared_query_key: bool = False  # keys are the queries (Reformer): the block must pass key=query
    fixed_max_length: bool = False  # needs spec.max_seq_len and refuses longer inputs (Linformer)
    permutation_equivariant: bool = False  # permuting tokens permutes outputs (no notion of position)
    patch_grid: bool = False  # attends by 2-D patch position: reads inputs.grid_size, tokens in grid order
    # cross-attention: queries of one sequence attend (non-causally) to the keys and values of another, of any
    # length (a decoder's tokens to its encoder's states); built with AttentionSpec(cross_attention=True)
    cross_attention: bool = False
    # adds learned relative position scores (BERT's relative_key / relative_key_query) to the scores of the
    # pairs it forms: reads inputs.relative_positions (hf_efficient/attention/relative.py)
    relative_positions: bool = False
    # rotary positions (inputs.rotary, RoPE): how the core carries them, ROTATE_QUERIES_AND_KEYS (rotated
    # once, before the pattern, by forward) or ROTATE_FEATURE_MAPS (the core rotates its feature maps,
    # RoFormer's linear attention); None: refused with the core's rotary_refusal (see attention/rotary.py)
    rotary: str | None = None
    modalities: frozenset[str] = frozenset(MODALITIES)
    # reads a packed stream (AttentionInputs.packed) as it is; the others compute each packed sequence
    # alone (AttentionCore.forward). Cores along a graph's edges: edges never join two graphs.
    packed_sequences: bool = False

    def __post_init__(self):
        if self.rotary is not None and self.rotary not in ROTARY_MODES:
            raise ValueError(
                f"AttentionCapabilities.rotary must be None or one of {ROTARY_MODES}, got {self.rotary!r}."
            )


@dataclass(frozen=True)
class AttentionSpec:
    """Model-level facts a core needs, fixed when the core is built (filled in by the encoder block).

    Facts that may change from call to call (the kernel after ``set_attn_implementation``, the patch grid
    of the current images) travel in :class:`~hf_efficient.attention.inputs.AttentionInputs` instead.

    Attributes:
        num_heads: number of heads h.
        head_dim: size d of each head.
        dropout: dropout probability on attention probabilities (``attention_probs_dropout_prob``).
        attn_implementation: default HF kernel for exact softmax (``"eager"``, ``"sdpa"``,
            ``"flex_attention"``...), used by ``full`` and by dense sub-blocks inside other cores when the
            call's ``inputs.attn_implementation`` is None.
        max_seq_len: the model's maximum sequence length (``max_position_embeddings``), if it has one.
        layer_idx: index of the layer owning this core (seeds per-layer random state; finds the core's layer
            of a generation cache).
        causal: the core serves a causal model (a decoder: every call is ``is_causal=True``). A core builds
            the parameters only its causal form uses (RFA's recency gate) when this is True, and only then.
        cross_attention: the core serves cross-attention: queries (b, h, n, d) of one sequence against keys
            and values (b, h, m, d) of another, the keys' padding as ``attention_mask`` (b, m); non-causal,
            never given a cache. Only types with ``capabilities.cross_attention`` can be built so.
    """

    num_heads: int
    head_dim: int
    dropout: float = 0.0
    attn_implementation: str = "sdpa"
    max_seq_len: int | None = None
    layer_idx: int = 0
    causal: bool = False
    cross_attention: bool = False

    def __post_init__(self):
        if self.causal and self.cross_attention:
            raise ValueError(
                "AttentionSpec: cross_attention=True is non-causal (every query sees the whole other "
                "sequence); build it with causal=False."
            )
        for name in ("num_heads", "head_dim", "layer_idx", "max_seq_len"):
            value = getattr(self, name)
            if (value is not None or name != "max_seq_len") and (
                isinstance(value, bool) or not isinstance(value, int)
            ):
                raise TypeError(f"AttentionSpec.{name} must be an int, got {type(value).__name__} {value!r}.")
        if self.num_heads < 1 or self.head_dim < 1:
            raise ValueError(
                f"num_heads and head_dim must be positive, got {self.num_heads}, {self.head_dim}"
            )
        if self.max_seq_len is not None and self.max_seq_len < 1:
            raise ValueError(f"max_seq_len must be None or positive, got {self.max_seq_len}.")
        if self.layer_idx < 0:
            raise ValueError(f"layer_idx must be >= 0, got {self.layer_idx}.")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise TypeError(f"AttentionSpec.dropout must be a number, got {type(self.dropout).__name__}.")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {self.dropout}")


class AttentionOutput(NamedTuple):
    output: torch.Tensor  # (b, h, n, d)
    weights: torch.Tensor | None  # (b, h, n, n) or None


def _runs_every_call(core: AttentionCore, query: torch.Tensor, inputs: AttentionInputs) -> str | None:
    return None


def _always(core: AttentionCore, query: torch.Tensor, inputs: AttentionInputs) -> bool:
    return True


class Kernel(NamedTuple):
    """A fast path of one mechanism: its reference's maths computed another way (a module of
    ``attention/kernels/``). A core lists its kernels in ``AttentionCore.kernels``, in the order ``"auto"``
    tries them.

    Attributes:
        name: the ``implementation`` value that forces this kernel (``"chunked"``, ``"flex"``, ...).
        attend: ``(core, query, key, value, inputs) -> AttentionOutput``, equal to ``core.reference`` on
            the same call (outputs, weights, gradients; checked for every kernel by the contract tests).
            The one signature of the reference and every kernel of a core that carries a recurrent state
            (``carries_state``) adds ``state=None, return_state=False``: the causal form starts after the
            tokens ``state`` sums up (None: from the start) and, with ``return_state``, returns
            ``(AttentionOutput, the state after the last token)``, in the core's own state type; a cached
            prefill and chunked training run that way, through the kernel chosen for the call.
        unsupported: ``(core, query, inputs) -> str | None``: why this kernel cannot serve the call (a
            CPU without a backward, dropout it does not draw, a head size it does not take), or None. A
            forced kernel raises with this reason; ``"auto"`` passes over it.
        chosen: ``(core, query, inputs) -> bool``: whether ``"auto"`` takes it for a call it can serve (the
            device and sizes where it is the faster path).
        traces: whether it runs inside ``torch.export`` / ``torch.compile`` graphs. While tracing, ``"auto"``
            only considers kernels that do, and a forced kernel that does not raises.
        carries_state: whether ``attend`` takes ``state`` / ``return_state`` (above). A call that carries a
            state only goes to kernels that do; a forced kernel that does not raises.
        devices: the device types (``"cuda"``, ``"cpu"``) on which ``"auto"`` considers this kernel, None:
            every device. Resolved once per device (:meth:`AttentionCore.resolve_kernels`), not per call; a
            forced kernel runs on any device its ``unsupported`` accepts.
        rotary: whether it rotates the core's feature maps itself for rotary positions (a core whose
            ``capabilities.rotary`` is ``ROTATE_FEATURE_MAPS``; rotated queries and keys need nothing of a
            kernel). A call with rotary positions only goes to kernels that do; a forced kernel that does not
            raises.
    """

    name: str
    attend: Callable[..., AttentionOutput]
    unsupported: Callable[[Any, torch.Tensor, AttentionInputs], str | None] = _runs_every_call
    chosen: Callable[[Any, torch.Tensor, AttentionInputs], bool] = _always
    traces: bool = False
    carries_state: bool = False
    devices: frozenset[str] | None = None
    rotary: bool = False


IMPLEMENTATION_CHOICES = ("auto", "reference")


class AttentionCore(nn.Module):
    """Base class of every attention mechanism. Subclasses set the class attributes and ``reference`` (and
    list their ``kernels``); a core that needs neither split may override ``_attend`` itself.

    Class attributes (the core's facts; the registry, docs table and benchmarks read them):
        attention_type: registry key (set by ``register_attention``).
        config_class: the dataclass of this core's hyperparameters.
        kernels: its fast paths (:class:`Kernel`), in the order ``implementation="auto"`` tries them.
        capabilities: what the core can honour (inputs, modalities).
        paper: citation shown in errors, model cards and the docs table.
        cost: time complexity in n, as the docs table shows it (``"O(n·w)"``).
        summary: one line on how it works, for the docs table.
        small_config: hyperparameters for tiny models (see below); causal_small_config: those of tiny causal
            models where they differ (Longformer's without global tokens).
        no_weight_decay: parameters weight decay must leave alone (see below).
        float32_for: half-precision input dtypes this core computes in float32 (see
            :meth:`_attend_in_precision`).
        script_configs: what the training scripts set for this type per config family, over its defaults
            (see below); benchmark_config: the settings the benchmarks measure it with; export_note: what an
            exported graph of it bakes in (the export table of docs/serving.md); lra_listops: the ListOps
            accuracy the Long Range Arena paper reports for it.
    """

    attention_type: ClassVar[str] = ""
    config_class: ClassVar[type[AttentionConfig]] = AttentionConfig
    kernels: ClassVar[tuple[Kernel, ...]] = ()
    capabilities: ClassVar[AttentionCapabilities] = AttentionCapabilities()
    paper: ClassVar[str] = ""
    cost: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    # Hyperparameters that suit tiny models (hidden 32, sequences of tens of tokens): used by docs, the
    # registry-wide tests and the demo, so a new variant is exercised the moment it registers.
    small_config: ClassVar[dict[str, Any]] = {}
    # Tiny causal models (decoders), where small_config does not suit the causal form; None: small_config.
    causal_small_config: ClassVar[dict[str, Any] | None] = None
    # Names of this core's own parameters that weight decay must leave alone: a learned temperature or a
    # normalisation gain decayed toward 0 flattens attention whatever the data says (RFA's sigma fell from
    # 1 to e^(-wd * sum lr) = 0.64 in a Fashion-MNIST run). transformers' Trainer only spares biases and
    # LayerNorm modules; hf_efficient.training.EfficientTrainer also spares these.
    no_weight_decay: ClassVar[tuple[str, ...]] = ()
    float32_for: ClassVar[tuple[torch.dtype, ...]] = ()
    # Why the maths cannot attend from one sequence's queries to another sequence's keys, read when
    # capabilities.cross_attention is False: the error refusing such a core for cross-attention shows it.
    cross_attention_refusal: ClassVar[str] = "it declares no form that attends to another sequence"
    # Why the maths cannot add relative position scores, read when capabilities.relative_positions is False.
    relative_positions_refusal: ClassVar[str] = (
        "it never forms the score of each (query, key) pair that they are added to (it approximates softmax "
        "attention without them)"
    )
    # Why the maths cannot carry rotary positions, read when capabilities.rotary is None: the error refusing
    # rotary positions (inputs.rotary) shows it.
    rotary_refusal: ClassVar[str] = (
        "it declares no way to carry them (the exact, window and block types rotate queries and keys, the "
        "kernelized types their feature maps)"
    )
    # What the training scripts set for this type, per config family (the folder of the base configs,
    # ``configs/<family>/``: "text", "vision", "graph", "clm", and the lab's "listops", "mqar"), over its
    # defaults: each entry holds the sections of a config file, ``{"attention_config": {...}, "model":
    # {...}, "training": {...}}`` (``hf_efficient.training.config_files`` merges it after the base file).
    script_configs: ClassVar[dict[str, dict[str, dict[str, Any]]]] = {}
    # The settings the benchmarks measure this type with, over its defaults (the sizes its paper runs long
    # inputs with: BigBird's 64-token blocks, Longformer's 512-token window).
    benchmark_config: ClassVar[dict[str, Any]] = {}
    # What an exported (traced) graph of this type bakes in or assumes: the export table's last column.
    export_note: ClassVar[str] = ""
    # ListOps test accuracy (%) the Long Range Arena paper reports (Tay et al. 2020, table 1): (LRA's model
    # name, accuracy), or None for a type LRA did not run. Quoted by the lab's ListOps runs and table.
    lra_listops: ClassVar[tuple[str, float] | None] = None

    def __init__(self, spec: AttentionSpec, config: AttentionConfig | None = None):
        super().__init__()
        self.spec = spec
        self.config = config if config is not None else self.config_class()
        self.check_implementation(self.config.implementation)
        self._resolved: tuple[tuple, tuple[Kernel, ...]] | None = None  # see resolve_kernels
        self.num_heads = spec.num_heads
        self.head_dim = spec.head_dim
        self.scaling = spec.head_dim**-0.5

    # ---- facts ----------------------------------------------------------------------------------
    @classmethod
    def forward_flops(
        cls, n: int, head_dim: int, config: AttentionConfig, num_edges: int | None = None
    ) -> float | None:
        """FLOPs of one forward call for ONE head of ONE sequence of n tokens, or None without a model.

        Convention (the same for every type, so the numbers compare): matrix products only, 2 FLOPs per
        multiply-add, the (query, key) pairs of the mechanism's pattern (no padding or masked-block waste);
        softmax, exp, masking, sorts and gathers are left out. ``num_edges`` is E for graph attention
        (default 16 n). The override's docstring's first line is the formula the benchmarks show.
        """
        return None

    @classmethod
    def sliding_window_config(cls, window: int) -> dict[str, Any] | None:
        """This type's ``attention_config`` entries for a sliding window of ``window`` tokens (``window // 2``
        keys on each side of every query, nothing global), or None where the type has no such window: what a
        checkpoint with windowed layers (ModernBERT's ``local_attention``) sets for it."""
        return None

    @classmethod
    def check_implementation(cls, implementation: str) -> None:
        """Raise for an ``implementation`` that is neither "auto", "reference" nor one of this core's
        kernels, listing the valid ones."""
        valid = (*IMPLEMENTATION_CHOICES, *(kernel.name for kernel in cls.kernels))
        if implementation not in valid:
            name = cls.attention_type or cls.__name__
            raise ValueError(
                f"{name}: attention_config implementation must be one of {', '.join(map(repr, valid))} "
                f"('auto': the fastest path for the call, 'reference': the mechanism's maths in one piece), "
                f"got {implementation!r}."
            )

    # ---- hooks for subclasses -------------------------------------------------------------------
    def reference(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, inputs: AttentionInputs
    ) -> AttentionOutput:
        """The mechanism's maths in one piece: plain differentiable torch ops, what tracing and export see.

        ``inputs.attention_mask`` is bool (b, n) or None (nothing padded); ``inputs.global_attention_mask``
        bool (b, n) or None. Inputs the core does not declare in its capabilities are None/False here.
        """
        raise NotImplementedError

    def attend_across(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, inputs: AttentionInputs
    ) -> AttentionOutput:
        """Cross-attention (cores with ``capabilities.cross_attention``): queries (b, h, n, d) against keys
        and values (b, h, m, d) of another sequence, ``inputs.attention_mask`` the keys' padding (b, m)
        bool or None; non-causal. Default: the reference, whose non-causal form must then take m != n."""
        return self.reference(query, key, value, inputs)

    def resolve_kernels(self, device: torch.device | str) -> tuple[Kernel, ...]:
        """The kernels the configured ``implementation`` lets this core take on ``device``, in the order
        ``"auto"`` tries them: none for ``"reference"``, the named one when forced, for ``"auto"`` those whose
        ``devices`` hold the device's type. Resolved once per device, implementation and kernel list (the
        models resolve every core at load, after ``.to()`` and when their config changes; a core on a new
        device resolves on its first call there) and checked against the kernels the core declares; each
        call then leaves to the kernels only what the call decides (dropout, gradients, tracing, sizes)."""
        device_type = device.type if isinstance(device, torch.device) else torch.device(device).type
        key = (device_type, self.config.implementation, self.kernels)
        resolved = getattr(self, "_resolved", None)  # None: a core unpickled from an older version
        if resolved is not None and resolved[0] == key:
            return resolved[1]
        choice = self.config.implementation
        self.check_implementation(choice)
        if choice == "auto":
            kernels = tuple(k for k in self.kernels if k.devices is None or device_type in k.devices)
        else:
            kernels = tuple(k for k in self.kernels if k.name == choice)  # "reference": none
        if not is_tracing():  # a trace keeps no module state
            self._resolved = (key, kernels)
        return kernels

    def kernel_for(
        self, query: torch.Tensor, inputs: AttentionInputs, carried: bool = False
    ) -> Kernel | None:
        """The kernel that computes this call under the configured ``implementation``; None: the reference.
        ``carried``: the call starts from (or returns) a recurrent state (a cached prefill)."""
        choice = self.config.implementation
        if choice == "reference":
            return None
        kernels = self.resolve_kernels(query.device)
        tracing, rotated = is_tracing(), getattr(inputs, "rotary", None) is not None
        if choice == "auto":
            for kernel in kernels:
                fits = (kernel.traces or not tracing) and (kernel.carries_state or not carried)
                if fits and (kernel.rotary or not rotated):
                    if kernel.unsupported(self, query, inputs) is None and kernel.chosen(self, query, inputs):
                        return kernel
            return None
        (kernel,) = kernels
        reason = kernel.unsupported(self, query, inputs)
        if reason is None and tracing and not kernel.traces:
            reason = "it does not run inside torch.export / torch.compile graphs"
        if reason is None and carried and not kernel.carries_state:
            reason = "it does not start from a carried state (a cached prefill)"
        if reason is None and rotated and not kernel.rotary:
            reason = "it does not rotate the feature maps for rotary positions (the reference does)"
        if reason is not None:
            name = self.attention_type or type(self).__name__
            raise ValueError(
                f"{name}: implementation={choice!r} cannot compute this call: {reason}. Use "
                "implementation='auto' (it picks a path that can) or 'reference'."
            )
        return kernel

    def _attend(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, inputs: AttentionInputs, **carried
    ) -> AttentionOutput:
        """Compute attention on prepared inputs: the chosen kernel, else the reference. ``carried``
        (``state=``, ``return_state=``; cores whose kernels carry a state) passes on to it (see
        :class:`Kernel`)."""
        kernel = self.kernel_for(query, inputs, carried=bool(carried))
        if kernel is None:
            return self.reference(query, key, value, inputs, **carried)
        return kernel.attend(self, query, key, value, inputs, **carried)

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

    def covered_length(self) -> int | None:
        """The longest input this core, as configured, covers whole: up to this many tokens every query sees
        every key, so the result is exact softmax attention, computed at the extra cost of the pattern (a
        Longformer window wider than the text). The scripts say so once when every input of a run is that
        short; the model accepts such inputs (a long-context checkpoint reads short texts too). None (the
        default): no such length, the core is exact at every length or approximates at every length."""
        return None

    def tracing_blocker(self) -> str | None:
        """Why this core, as configured, cannot be traced by ``torch.export`` / ``torch.compile``, with the
        fix; None when it can (the default). Cores compute in one piece while tracing (no Python branch on
        tensor values, no loop over a number of chunks), so only a setting whose shapes follow the data
        blocks it. Read by ``forward`` while tracing and by :func:`hf_efficient.export.check_exportable`."""
        return None

    def unbuilt_parameter_names(self) -> tuple[str, ...]:
        """Names of this core's parameters that a checkpoint saved in another setting may hold but this core,
        as built, has no use for (RFA's recency gate outside a causal model). Loading ignores them instead of
        reporting them as unexpected. Default: none."""
        return ()

    # ---- incremental decoding (causal cores) ------------------------------------------------------
    def new_cache_layer(self) -> CacheLayerMixin:
        """An empty generation state for this core: one layer of an
        :class:`~hf_efficient.attention.cache.EfficientCache`. Causal cores (``capabilities.causal``) build
        the layer their :meth:`_attend_cached` decodes from."""
        raise ValueError(
            f"{self.attention_type or type(self).__name__} has no causal form, so there is nothing to cache "
            f"for decoding. Causal attention types: {', '.join(causal_attention_types())}."
        )

    def _attend_cached(
        self, query, key, value, inputs: AttentionInputs, layer: CacheLayerMixin
    ) -> AttentionOutput:
        """Causal attention of n new tokens (query, key, value (b, h, n, d)) after the tokens ``layer`` holds,
        updating ``layer`` with them. ``inputs.attention_mask`` is the new tokens' padding mask, (b, n) bool
        or None; a padded token must leave the state as it was. The outputs equal those of the parallel
        causal form over the whole sequence (checked for every causal type by the contract tests)."""
        raise NotImplementedError

    def attn_implementation(self, inputs: AttentionInputs) -> str:
        """The exact-softmax kernel of this call: the inputs' choice, else the spec's."""
        return inputs.attn_implementation or self.spec.attn_implementation

    def extra_repr(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.config.to_dict().items())
        return f"heads={self.num_heads}, head_dim={self.head_dim}" + (f", {fields}" if fields else "")

    # ---- the public entry point -----------------------------------------------------------------
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        inputs: AttentionInputs | None = None,
        **fields: Any,
    ) -> AttentionOutput:
        """Check the inputs against the capabilities, run the core, zero padded query rows.

        Args:
            query, key, value: (b, h, n, d).
            inputs: the call's :class:`AttentionInputs`; or give its fields as keywords instead
                (``core(q, k, v, attention_mask=mask, is_causal=True)``).

        Returns:
            AttentionOutput(output (b, h, n, d), weights (b, h, n, n) or None).
        """
        name = self.attention_type or type(self).__name__
        inputs = _as_inputs(inputs, fields, name)
        self._check_qkv(query, key, value, name, inputs.packed)
        if self.spec.cross_attention:
            return self._forward_across(query, key, value, inputs, name)
        b, _, n, _ = query.shape
        inputs = inputs.prepare(b, n, name)
        if inputs.packed is not None and not self.capabilities.packed_sequences:
            return self._forward_each_sequence(query, key, value, inputs)
        check_supported(inputs, self.capabilities, tuple(query.shape), name)
        if inputs.relative_positions is not None:
            self._check_relative_positions(inputs.relative_positions, name)
        if inputs.rotary is not None:
            query, key, inputs = self._apply_rotary(query, key, inputs, name)
        if is_tracing():
            blocker = self.tracing_blocker()
            if blocker is not None:
                raise ValueError(f"{name} cannot be traced by torch.export / torch.compile: {blocker}")
            # Dense heads: the encoders hand over (b, n, h, d) -> (b, h, n, d) views, whose strides make
            # torch.export specialise matmuls to batch != 1; one copy per layer of a traced graph.
            shared = key is query
            query, value = query.contiguous(), value.contiguous()
            key = query if shared else key.contiguous()
        if inputs.cache is not None:
            return self._forward_cached(query, key, value, inputs, name)
        if inputs.empty_rows is not None:
            # A sequence with no real token: computed on zeros with every key "real" (so no core divides by an
            # empty softmax or normaliser), then zeroed below; masked_fill passes no gradient to its inputs.
            blank = inputs.empty_rows[:, None, None, None]  # (b, 1, 1, 1)
            shared = key is query
            query, value = query.masked_fill(blank, 0.0), value.masked_fill(blank, 0.0)
            key = query if shared else key.masked_fill(blank, 0.0)
        output, weights = self._attend_in_precision(query, key, value, inputs.with_empty_rows_filled())
        mask = inputs.attention_mask
        if mask is not None:
            # Padded query rows carry no meaning; make them exactly 0 so garbage (even inf/NaN from
            # poisoned padding) can never flow into the next layer or a loss.
            output = output.masked_fill(~mask[:, None, :, None], 0.0)
        if weights is not None and inputs.empty_rows is not None and not weights.is_sparse:
            # no real key: no attention at all (sparse per-edge weights hold no entry there anyway)
            weights = weights.masked_fill(inputs.empty_rows[:, None, None, None], 0.0)
        return AttentionOutput(output, weights)

    def _forward_each_sequence(self, query, key, value, inputs: AttentionInputs) -> AttentionOutput:
        """A packed stream (1, h, T, d), each sequence computed as if it ran alone: one call per sequence on
        its own tokens, or one call on the sequences padded to the longest
        (:meth:`~hf_efficient.attention.packing.PackedSequences.runs_per_sequence`). The per-token inputs
        (global tokens (1, T), rotary positions (1, T, d)) are cut the same way."""
        packed, shared = inputs.packed, key is query
        per_token = {"global_attention_mask": inputs.global_attention_mask}  # (1, T) or None
        rotary = inputs.rotary
        alone = inputs.replace(packed=None, global_attention_mask=None, rotary=None)
        if packed.runs_per_sequence():
            cut = {name: packed.split(t, 1) for name, t in per_token.items() if t is not None}
            if rotary is not None:
                cut["rotary"] = [
                    type(rotary)(cos, sin)
                    for cos, sin in zip(packed.split(rotary.cos, 1), packed.split(rotary.sin, 1), strict=True)
                ]
            pieces = zip(packed.split(query, 2), packed.split(key, 2), packed.split(value, 2), strict=True)
            outputs = [
                self.forward(
                    q, q if shared else k, v, alone.replace(**{n: c[i] for n, c in cut.items()})
                ).output
                for i, (q, k, v) in enumerate(pieces)
            ]
            return AttentionOutput(torch.cat(outputs, dim=2), None)  # (1, h, T, d)
        padded_query = packed.to_padded(query)  # (B, h, L, d)
        padded_key = padded_query if shared else packed.to_padded(key)
        fields = {"attention_mask": packed.padding_mask()}
        if per_token["global_attention_mask"] is not None:
            fields["global_attention_mask"] = packed.mask_to_padded(per_token["global_attention_mask"])
        if rotary is not None:  # (1, T, d) -> (B, L, d), no rotation at padding (cos 1, sin 0)
            cos, sin = packed.row_to_padded(rotary.cos - 1) + 1, packed.row_to_padded(rotary.sin)
            fields["rotary"] = type(rotary)(cos, sin)
        output = self.forward(
            padded_query, padded_key, packed.to_padded(value), alone.replace(**fields)
        ).output
        return AttentionOutput(packed.from_padded(output), None)

    def _forward_across(self, query, key, value, inputs: AttentionInputs, name: str) -> AttentionOutput:
        """Cross-attention (``spec.cross_attention``): n queries over the m keys of another sequence, whose
        padding is ``inputs.attention_mask`` (b, m). A batch row whose keys are all padding attends to
        nothing: its output is 0 (computed on zeroed keys counted real, as the parallel path does)."""
        for field in (
            "attention_bias",
            "edges",
            "global_attention_mask",
            "cache",
            "grid_size",
            "relative_positions",
            "rotary",
        ):
            if getattr(inputs, field) is not None:
                raise ValueError(
                    f"{name} cross-attention takes the other sequence's padding mask only, not {field}; "
                    f"drop {field}."
                )
        if inputs.is_causal:
            raise ValueError(
                f"{name} cross-attention is not causal: every query sees the whole other sequence. Call it "
                "with is_causal=False."
            )
        b, _, m, _ = key.shape
        inputs = inputs.prepare(b, m, name)  # the keys' padding mask
        check_supported(inputs, self.capabilities, tuple(key.shape), name)
        blank = None if inputs.empty_rows is None else inputs.empty_rows[:, None, None, None]  # (b, 1, 1, 1)
        if blank is not None:
            key, value = key.masked_fill(blank, 0.0), value.masked_fill(blank, 0.0)
        output, weights = self._attend_in_precision(
            query, key, value, inputs.with_empty_rows_filled(), self.attend_across
        )
        if blank is not None:
            output = output.masked_fill(blank, 0.0)
            weights = None if weights is None else weights.masked_fill(blank, 0.0)
        return AttentionOutput(output, weights)

    def _check_relative_positions(self, relative, name: str) -> None:
        """Relative position scores (:class:`~hf_efficient.attention.relative.RelativePositions`) only for a
        core that declares them, with a (2 L - 1, d) table."""
        if not self.capabilities.relative_positions:
            raise ValueError(
                f"{name} cannot add relative position scores ({relative.kind}): "
                f"{self.relative_positions_refusal}. Types that can: {', '.join(relative_position_types())}."
            )
        relative.check(self.head_dim, name)

    def _apply_rotary(self, query, key, inputs: AttentionInputs, name: str):
        """Check the call's rotary positions against this core and rotate what the core does not:
        ``ROTATE_QUERIES_AND_KEYS`` cores get rotated queries and keys and inputs without rotary positions,
        ``ROTATE_FEATURE_MAPS`` ones the inputs unchanged (their reference rotates its feature maps); a core
        that cannot carry them raises with its ``rotary_refusal``. Returns (query, key, inputs)."""
        mode = self.capabilities.rotary
        if mode is None:
            raise ValueError(
                f"{name} cannot carry rotary positions: {self.rotary_refusal}. Types that can: "
                f"{', '.join(rotary_attention_types())}."
            )
        inputs.rotary.check(tuple(query.shape), name)
        if mode == ROTATE_FEATURE_MAPS:
            if inputs.is_causal:
                raise ValueError(
                    f"{name}: rotary positions are carried by its non-causal form only (RoFormer's rotated "
                    "feature maps; a causal state would keep rotated and plain sums apart). Drop is_causal, "
                    "or use a type that rotates queries and keys (full, longformer)."
                )
            return query, key, inputs
        rotated = inputs.rotary.rotate(query)
        key = rotated if key is query else inputs.rotary.rotate(key)
        return rotated, key, inputs.replace(rotary=None)

    def _forward_cached(self, query, key, value, inputs: AttentionInputs, name: str) -> AttentionOutput:
        """The n new tokens of incremental decoding, against the state this core keeps in ``inputs.cache``.

        Unlike the parallel path, a row whose new tokens are all padding is not given stand-in keys: the
        state must not change on padding, and the row's outputs are zeroed below as every padded row."""
        if not inputs.is_causal:
            raise ValueError(
                f"{name}: a generation cache holds causal decoding state; call with is_causal=True (a "
                "decoder) or without a cache."
            )
        layer = inputs.cache.layer_for(self.spec.layer_idx, name, type(self.new_cache_layer()))
        output, weights = self._attend_in_precision(
            query, key, value, inputs.replace(empty_rows=None), partial(self._attend_cached, layer=layer)
        )
        if inputs.attention_mask is not None:
            output = output.masked_fill(~inputs.attention_mask[:, None, :, None], 0.0)
        return AttentionOutput(output, weights)

    def _attend_in_precision(
        self, query, key, value, inputs: AttentionInputs, attend=None
    ) -> AttentionOutput:
        """``_attend`` with one floating dtype throughout.

        Under autocast, query/key/value are cast to the autocast dtype and the core runs with autocast off,
        exactly as in a model cast to that dtype: autocast would otherwise mix dtypes inside a core (float32
        parameters and elementwise results with half-precision matmuls), which custom autograd functions
        and sparse kernels do not accept. A core whose maths cannot run in a half dtype lists it in
        ``float32_for`` and computes in float32, its output cast back; the others keep float32 where
        their maths needs it (normalisers, prefix sums, exp of large scores) inside ``_attend``."""
        attend = attend or self._attend
        device = query.device.type
        autocast = torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device) if autocast else query.dtype
        compute = torch.float32 if dtype in self.float32_for else dtype
        if not autocast and compute == query.dtype:
            return attend(query, key, value, inputs)
        with torch.autocast(device, enabled=False):
            if key is query:  # shared query/key cores need the identity kept
                query = key = query.to(compute)
            else:
                query, key = query.to(compute), key.to(compute)
            output, weights = attend(query, key, value.to(compute), inputs)
        return AttentionOutput(output.to(dtype), None if weights is None else weights.to(dtype))

    def _check_qkv(self, query, key, value, name: str, packed=None) -> None:
        """Shapes of query/key/value against the spec and the capabilities (shapes only, no values);
        ``packed``: the sequences of a packed stream (a core built for a fixed length takes each alone)."""
        caps = self.capabilities
        for label, t in (("query", query), ("key", key), ("value", value)):
            if t.dim() != 4:
                raise ValueError(
                    f"{name}: {label} must have shape (batch, heads, seq, head_dim), got {tuple(t.shape)}. "
                    "Split hidden states into heads first: x.view(b, n, heads, head_dim).transpose(1, 2)."
                )
        if not query.is_floating_point() or {t.dtype for t in (query, key, value)} != {query.dtype}:
            raise ValueError(
                f"{name}: query, key and value must share one floating dtype, got {query.dtype}, "
                f"{key.dtype}, {value.dtype}. Cast them (x.float()), or run the model under torch.autocast."
            )
        if {t.device for t in (query, key, value)} != {query.device}:
            raise ValueError(
                f"{name}: query, key and value are on different devices ({query.device}, {key.device}, "
                f"{value.device}); move them to one device."
            )
        b, h, n, d = query.shape
        across = self.spec.cross_attention  # keys and values of another sequence: any length m
        if h != self.num_heads or d != self.head_dim:
            raise ValueError(
                f"{name}: expected {self.num_heads} heads of size {self.head_dim}, got query of shape "
                f"{tuple(query.shape)}. Build the core with the model's num_attention_heads and head size."
            )
        if across and (
            key.shape[:2] != query.shape[:2] or key.shape[3] != d or value.shape[:3] != key.shape[:3]
        ):
            raise ValueError(
                f"{name}: query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} "
                "must share (batch, heads), keys and values (batch, heads, seq) of the other sequence."
            )
        if not across and (key.shape != query.shape or value.shape[:3] != query.shape[:3]):
            raise ValueError(
                f"{name}: query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} "
                "must share (batch, heads, seq); this is self-attention over one sequence."
            )
        if across and key.shape[2] == 0:
            raise ValueError(
                f"{name}: the other sequence is empty (key {tuple(key.shape)}); give it a token."
            )
        if n == 0 or b == 0:
            raise ValueError(
                f"{name}: query has shape {tuple(query.shape)}, an empty "
                f"{'batch' if b == 0 else 'sequence'}. Pass at least one sequence of at least one token."
            )
        if caps.shared_query_key and key is not query:
            raise ValueError(
                f"{name} shares queries and keys (keys are the normalised queries): call it with key=query. "
                "The encoder blocks do this for you."
            )
        longest = n if packed is None else packed.max_length
        if caps.fixed_max_length and self.spec.max_seq_len is not None and longest > self.spec.max_seq_len:
            n = longest
            raise ValueError(
                f"{name}: got {n} tokens but this core was built for at most max_seq_len="
                f"{self.spec.max_seq_len}. Rebuild with a larger maximum length."
            )


def _as_inputs(inputs: AttentionInputs | None, fields: dict[str, Any], name: str) -> AttentionInputs:
    """The call's AttentionInputs, from the object or from its fields given as keywords (not both)."""
    if inputs is not None and not isinstance(inputs, AttentionInputs):
        raise TypeError(
            f"{name}: the fourth argument is an AttentionInputs, got {type(inputs).__name__}. Pass a padding "
            "mask as attention_mask=mask."
        )
    if not fields:
        return inputs if inputs is not None else AttentionInputs()
    if inputs is not None:
        raise TypeError(f"{name}: pass either an AttentionInputs or its fields as keywords, not both.")
    try:
        return AttentionInputs(**fields)
    except TypeError:
        valid = [f for f in AttentionInputs.__dataclass_fields__ if f != "prepared_for"]
        unknown = sorted(set(fields) - set(valid))
        raise TypeError(f"{name}: unknown attention input(s) {unknown}; valid: {', '.join(valid)}.") from None


__all__ = [
    "MODALITIES",
    "AttentionCapabilities",
    "AttentionCore",
    "AttentionOutput",
    "AttentionSpec",
    "IMPLEMENTATION_CHOICES",
    "Kernel",
    "ROTATE_FEATURE_MAPS",
    "ROTATE_QUERIES_AND_KEYS",
]
