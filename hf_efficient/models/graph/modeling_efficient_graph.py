"""EfficientGraph: a graph transformer on the shared encoder blocks; only what is graph-specific lives here.

Inputs are a padded batch from :class:`~hf_efficient.models.graph.GraphCollator`: node features (b, n, F), a
node mask (b, n), edges over the flattened (b * n) positions, and the structural encodings computed by
:mod:`hf_efficient.data.graph_transforms`; or torch_geometric's flattened batch (``batch``, read as the padded
one: :mod:`.flattened`). With ``config.padding_free`` everything outside attention runs on the real nodes
only (:mod:`hf_efficient.modeling.unpadding`). Structure reaches attention only as inputs (``edges`` for cores
that attend along them, an additive ``attention_bias`` for Graphormer), never as a branch on the type.

Shapes: b = batch, n = nodes per graph (padded), n' = n (+1 with a virtual token), D = hidden_size,
h = heads, E = edges in the batch, C = num_labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn
from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils.generic import can_return_tuple

from ...attention.inputs import (
    AttentionInputs,
    GraphEdges,
    check_edge_features,
    check_edge_index,
    is_tracing,
    normalize_padding_mask,
)
from ...errors import InputError
from ...modeling.blocks import (
    CompactDropout,
    EfficientAttention,
    EfficientEncoder,
    EfficientIntermediate,
    EfficientLayer,
    EfficientOutput,
    EfficientSelfAttention,
    feed_forward,
)
from ...modeling.checks import (
    check_float_input,
    check_ids,
    check_not_empty,
    check_same_shape,
    checking_values,
)
from ...modeling.heads import classification_loss, classifier_dropout
from ...modeling.pretrained import EfficientPreTrainedModel
from ...modeling.unpadding import UnpaddedBatch, unpadded_batch
from .configuration_efficient_graph import STRUCTURAL_INPUTS, EfficientGraphConfig
from .flattened import FlattenedGraphs
from .graphormer import EDGE_ENCODING_NOT_TRACEABLE, GraphormerAttentionBias
from .inputs import GraphInputs, graph_forward

if TYPE_CHECKING:  # typing.Unpack is Python 3.11's; the annotations are never evaluated
    from typing_extensions import Unpack


class EfficientGraphEmbeddings(nn.Module):
    """Node features + centrality + positional encodings (+ a virtual token first), LayerNorm, dropout."""

    def __init__(self, config: EfficientGraphConfig):
        super().__init__()
        hidden = config.hidden_size
        self.node_vocab_size = config.node_vocab_size
        if config.node_vocab_size is None:
            self.node_encoder = nn.Linear(config.node_feature_dim, hidden)
        else:  # one table, column c's categories at rows [c * vocab, (c + 1) * vocab)
            self.node_encoder = nn.Embedding(config.node_feature_dim * config.node_vocab_size, hidden)
        degree = config.max_degree
        self.in_degree_embedding = nn.Embedding(degree + 1, hidden) if degree is not None else None
        self.out_degree_embedding = nn.Embedding(degree + 1, hidden) if degree is not None else None
        self.lap_pe_encoder = nn.Linear(config.lap_pe_dim, hidden) if config.lap_pe_dim else None
        self.lap_pe_sign_flip = config.lap_pe_sign_flip
        self.rw_pe_encoder = nn.Linear(config.rw_pe_dim, hidden) if config.rw_pe_dim else None
        self.wl_embedding = nn.Embedding(config.wl_vocab_size, hidden) if config.wl_vocab_size else None
        self.rnf_encoder = nn.Linear(config.rnf_dim, hidden) if config.rnf_dim else None
        self.rnf_resample = config.rnf_resample
        self.de_encoder = nn.Linear(config.de_dim, hidden) if config.de_dim else None
        self.virtual_token = nn.Embedding(1, hidden) if config.add_virtual_token else None
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.dropout = CompactDropout(config.hidden_dropout_prob)

    def _node_features(self, node_feat: torch.Tensor) -> torch.Tensor:
        """(b, n, F) node features (checked by ``EfficientGraphModel.check_inputs``) -> (b, n, D)."""
        if self.node_vocab_size is None:
            return self.node_encoder(node_feat.to(self.node_encoder.weight.dtype))  # (b, n, F) -> (b, n, D)
        offsets = torch.arange(node_feat.shape[-1], device=node_feat.device) * self.node_vocab_size  # (F,)
        return self.node_encoder(node_feat + offsets).sum(-2)  # (b, n, F, D) -> (b, n, D)

    def forward(self, node_feat: torch.Tensor, inputs: GraphInputs) -> torch.Tensor:
        """(b, n, F) node features and the encodings of ``inputs`` the config reads -> (b, n', D)."""
        x = self.encode_nodes(node_feat, inputs)  # (b, n, D)
        if self.virtual_token is not None:
            x = torch.cat([self.virtual_tokens(x.shape[0]), x], dim=1)  # (b, n + 1, D)
        return self.finish(x)

    def virtual_tokens(self, b: int) -> torch.Tensor:
        """(b, 1, D) the virtual token of each graph, before the norm."""
        return self.virtual_token.weight.expand(b, 1, -1)

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """LayerNorm and dropout, token by token: (..., D) -> (..., D)."""
        return self.dropout(self.LayerNorm(x))

    def encode_nodes(
        self, node_feat: torch.Tensor, inputs: GraphInputs, graph_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(b, n, F) node features + the encodings of ``inputs`` -> (b, n, D), before the norm. A
        padding-free call gives the real nodes as one (1, R, ...) row and ``graph_index`` (R,) each node's
        graph, so that what is drawn per graph (Laplacian sign flips) stays per graph."""
        x = self._node_features(node_feat)  # (b, n, D)
        in_degree, out_degree = inputs.get("in_degree"), inputs.get("out_degree")
        lap_pe, rw_pe, rnf = inputs.get("lap_pe"), inputs.get("rw_pe"), inputs.get("rnf")
        if self.in_degree_embedding is not None:  # Graphormer's centrality encoding, degrees clipped
            top = self.in_degree_embedding.num_embeddings - 1
            x = x + self.in_degree_embedding(in_degree.clamp(0, top))
            x = x + self.out_degree_embedding(out_degree.clamp(0, top))
        if self.lap_pe_encoder is not None:
            lap_pe = lap_pe.to(x.dtype)  # (b, n, k)
            if self.training and self.lap_pe_sign_flip:  # a random sign per graph and eigenvector
                graphs = lap_pe.shape[0] if graph_index is None else int(graph_index[-1]) + 1
                signs = torch.randint(0, 2, (graphs, 1, lap_pe.shape[2]), device=lap_pe.device)
                if graph_index is not None:
                    signs = signs[graph_index, 0][None]  # (1, R, k): each node its graph's signs
                lap_pe = lap_pe * (signs * 2 - 1).to(lap_pe.dtype)  # (b, 1, k) or (1, R, k) of +-1
            x = x + self.lap_pe_encoder(lap_pe)  # (b, n, k) -> (b, n, D)
        if self.rw_pe_encoder is not None:
            x = x + self.rw_pe_encoder(rw_pe.to(x.dtype))
        if self.wl_embedding is not None:
            x = x + self.wl_embedding(inputs["wl_colors"] % self.wl_embedding.num_embeddings)
        if self.rnf_encoder is not None:
            rnf = rnf.to(x.dtype)  # (b, n, k); padded rows are 0 and stay unread (masked downstream)
            if self.training and self.rnf_resample:  # fresh features each time a graph is seen
                rnf = torch.randn_like(rnf)
            x = x + self.rnf_encoder(rnf)
        if self.de_encoder is not None:  # counts per (target, distance) bucket: a sum of learned vectors
            x = x + self.de_encoder(inputs["de"].to(x.dtype))
        return x


def inputs_for(core, inputs: AttentionInputs) -> AttentionInputs:
    """The model's inputs as one core reads them: edges only for cores that attend along edges.

    The graph is an input of the whole model: a dense core (``full``, ``performer``...) in some layer simply
    does not read it (the structure reaches it through encodings or the bias).
    """
    return inputs if core.capabilities.edges else inputs.replace(edges=None)


class EfficientGraphLayer(EfficientLayer):
    """The shared post-LayerNorm layer; edges reach the core only if it attends along edges."""

    def forward(self, hidden_states, inputs: AttentionInputs):
        return super().forward(hidden_states, inputs_for(self.attention.self.core, inputs))


class EfficientGraphLocalSelfAttention(EfficientSelfAttention):
    """Projections + the GPS local core (``config.local_attention_type``, over edges)."""

    def attention_for_layer(self) -> tuple[str, dict]:
        return self.config.local_attention_for_layer(self.layer_idx)


class EfficientGraphHybridLayer(GradientCheckpointingLayer):
    """GraphGPS layer (Rampasek et al. 2022): h = LN(x + Local(x)) + LN(x + Global(x)), then LN(h + FFN(h)).

    Local is attention over edges (``local_attention_type``); Global is the registry's ``attention_type``
    for this layer (``performer``, ``linear``, ``full`` with Graphormer's bias...). GPS uses BatchNorm;
    here LayerNorm, as every block of this package.
    """

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.local_attention = EfficientAttention(config, layer_idx, EfficientGraphLocalSelfAttention)
        self.attention = EfficientAttention(config, layer_idx)
        self.intermediate = EfficientIntermediate(config)
        self.output = EfficientOutput(config)

    def forward(
        self, hidden_states: torch.Tensor, inputs: AttentionInputs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # The local core reads the padding mask and the edges only (the bias and weights are the global's).
        local_inputs = inputs.replace(
            attention_bias=None, global_attention_mask=None, output_attentions=False
        )
        local, _ = self.local_attention(hidden_states, local_inputs)
        global_, weights = self.attention(hidden_states, inputs_for(self.attention.self.core, inputs))
        summed = local + global_  # (b, n', D)
        return feed_forward(self, summed, summed), weights


class EfficientGraphPreTrainedModel(EfficientPreTrainedModel):
    config_class = EfficientGraphConfig
    base_model_prefix = "graph"
    main_input_name = "node_feat"
    _no_split_modules = ["EfficientGraphLayer", "EfficientGraphHybridLayer"]

    def tracing_blockers(self) -> list[str]:
        reasons = super().tracing_blockers()
        if self.config.graph_bias == "graphormer" and self.config.edge_dim is not None:
            reasons.append(EDGE_ENCODING_NOT_TRACEABLE)
        return reasons


def _with_virtual_token(edges: GraphEdges, node_mask: torch.Tensor) -> GraphEdges:
    """Shift edges to positions g * (n + 1) + i + 1 and join the virtual token (position g * (n + 1)) to every
    real node both ways, plus a self loop. Virtual edges carry zero features and weight 1.

    While tracing, every node slot gets its two edges (no count of real nodes): a padded slot's become two
    self loops of that slot, read only by its own output, which is zeroed, so every real node and the token
    see exactly the edges of eager mode."""
    b, n = node_mask.shape
    shifted = edges.edge_index + edges.edge_index // n + 1  # (2, E): g * n + i -> g * (n + 1) + i + 1
    if is_tracing():
        slots = torch.arange(b * n, device=node_mask.device)
        graph = slots // n  # every slot; its node is slots - graph * n (ONNX has no remainder by a size)
        node = slots - graph * n
        real_slot = node_mask.reshape(-1)
    else:
        graph, node = node_mask.nonzero(as_tuple=True)  # real nodes
        real_slot = None
    token = graph * (n + 1)  # (R,)
    real = token + node + 1
    if real_slot is not None:
        token = torch.where(real_slot, token, real)  # padded slot: a self loop instead of the token
    tokens = torch.arange(b, device=node_mask.device) * (n + 1)
    virtual = torch.stack([torch.cat([token, real, tokens]), torch.cat([real, token, tokens])])  # (2, 2R + b)
    edge_index = torch.cat([shifted, virtual], dim=1)  # (2, E + 2R + b)
    extra = virtual.shape[1]
    attr = edges.edge_attr
    if attr is not None:
        attr = torch.cat([attr, attr.new_zeros(extra, attr.shape[1])])
    weight = edges.edge_weight
    if weight is not None:
        weight = torch.cat([weight, weight.new_ones(extra)])
    return GraphEdges(edge_index, edge_weight=weight, edge_attr=attr)


class EfficientGraphModel(EfficientGraphPreTrainedModel):
    """The bare encoder: node states (b, n, D) and a graph embedding (b, D) (mean or virtual token)."""

    auto_class = AutoModel

    def __init__(self, config: EfficientGraphConfig):
        super().__init__(config)
        self.embeddings = EfficientGraphEmbeddings(config)
        self.graph_bias = GraphormerAttentionBias(config) if config.graph_bias == "graphormer" else None
        layer_class = EfficientGraphHybridLayer if config.graph_layer_type == "gps" else EfficientGraphLayer
        self.encoder = EfficientEncoder(config, layer_class=layer_class)
        self.post_init()

    def check_inputs(self, node_feat, node_mask, edge_index, edge_attr, edge_weight, structural) -> None:
        """Every input the config reads is there, none is given that nothing would read, and each has the
        shape, dtype and (in eager mode) values the model needs: edges inside their own graph (a negative
        position would wrap around in indexing), one feature row per edge, finite features."""
        config, owner = self.config, type(self).__name__
        if node_feat.dim() != 3 or node_feat.shape[-1] != config.node_feature_dim:
            raise ValueError(
                f"{owner}: node_feat must have shape (batch, nodes, node_feature_dim="
                f"{config.node_feature_dim}), got {tuple(node_feat.shape)}."
            )
        check_not_empty(owner, "node_feat", node_feat.shape, "batch, nodes, node_feature_dim")
        b, n, _ = node_feat.shape
        if config.node_vocab_size is None:  # floats, or 0/1 ints (one-hot), through a linear map
            if node_feat.is_floating_point():
                check_float_input(owner, "node_feat", node_feat, "Node features must be finite.")
        else:
            vocab = config.node_vocab_size
            fix = (
                f"With node_vocab_size={vocab}, node_feat holds integer categories in [0, {vocab}) per column"
            )
            table = f"node_vocab_size={vocab} category embeddings"
            check_ids(owner, "node_feat", node_feat, vocab, table, fix)
        if node_mask is not None:
            check_same_shape(owner, "node_mask", node_mask, (b, n), "(batch, nodes) of node_feat")
            values = checking_values()  # 0/1 or bool values, in eager mode
            normalize_padding_mask(node_mask, b, n, f"{owner}: node_mask", read_values=values)
        for name, value in structural.items():
            field, transform = STRUCTURAL_INPUTS[name]
            wanted = getattr(config, field) is not None
            if wanted and value is None:
                raise ValueError(
                    f"{owner}: {field}={getattr(config, field)!r} needs the {name} input: compute it with "
                    f"hf_efficient.data.graph_transforms.{transform} (dataset.map) and collate it."
                )
            if value is not None and not wanted:
                raise ValueError(
                    f"{owner}: {name} was given but {field} is None, so it would be ignored; drop it."
                )
            if value is not None:
                self._check_structural_input(name, value, b, n)
        if config.needs_edges() and edge_index is None:
            used = sorted({name for name, _ in config.attention_types_used()})
            raise ValueError(
                f"{owner}: this model's attention ({', '.join(used)}) attends along edges: pass edge_index."
            )
        if edge_weight is not None and not config.needs_edges():
            raise ValueError(
                f"{owner}: edge_weight was given but no attention here runs over edges, so it would be "
                "ignored."
            )
        if (edge_attr is not None) != (config.edge_dim is not None):
            raise ValueError(
                f"{owner}: edge_attr {'was given' if edge_attr is not None else 'is missing'} but edge_dim="
                f"{config.edge_dim}: pass edge_attr of width edge_dim exactly when edge_dim is set."
            )
        if edge_attr is not None and edge_attr.shape[-1] != config.edge_dim:
            raise ValueError(
                f"{owner}: edge_attr has width {edge_attr.shape[-1]} but edge_dim={config.edge_dim}."
            )
        if edge_index is not None:  # validated here, before any path (edges, Graphormer's bias) indexes by it
            mask = node_mask.bool() if node_mask is not None else None
            values = checking_values()  # traced: shapes only, the values are trusted
            check_edge_index(edge_index, b, n, mask, owner, read_values=values)
            check_edge_features(edge_index.shape[-1], edge_weight, edge_attr, owner, read_values=values)
            if edge_attr is not None:
                check_float_input(owner, "edge_attr", edge_attr, "Edge features must be finite floats.")

    def _check_structural_input(self, name: str, value: torch.Tensor, b: int, n: int) -> None:
        """A structural input of the collated batch: shape (b, n[, n | k]) and dtype (ids or floats)."""
        owner, config = type(self).__name__, self.config
        widths = {  # the float encodings, (b, n, width)
            "lap_pe": config.lap_pe_dim,
            "rw_pe": config.rw_pe_dim,
            "rnf": config.rnf_dim,
            "de": config.de_dim,
        }
        shape = (b, n, n) if name == "spatial_pos" else (b, n, widths[name]) if name in widths else (b, n)
        check_same_shape(owner, name, value, shape, "(batch, nodes[, nodes or width])")
        if name in widths:
            check_float_input(owner, name, value, "Positional encodings must be finite floats.")
        elif value.is_floating_point() or value.dtype == torch.bool:
            raise ValueError(
                f"{owner}: {name} must hold integers (hop counts, degrees or colours), got dtype "
                f"{value.dtype}."
            )

    @can_return_tuple
    @graph_forward
    def forward(
        self,
        node_feat: torch.Tensor,
        *,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **inputs: Unpack[GraphInputs],
    ) -> BaseModelOutputWithPooling:
        """Encode a padded batch of graphs, or a flattened one (``batch``: torch_geometric's layout), on the
        real nodes only with ``config.padding_free``.

        Args:
            node_feat: (b, n, F) floats, or ints with ``node_vocab_size``; (N, F) with ``batch``.
            inputs: the batch's structure and encodings, :class:`~.inputs.GraphInputs` (what
                :class:`GraphCollator` gives beside ``node_feat``, or a flattened batch's).

        Returns:
            ``last_hidden_state`` (b, n, D) node states (the virtual token removed; (N, D) in the nodes'
            order for a flattened batch), ``pooler_output`` (b, D) the graph embedding; ``hidden_states`` /
            ``attentions`` per layer, in the padded layout, include the virtual token at position 0 when
            there is one.
        """
        flat = None
        if inputs.get("batch") is not None:  # torch_geometric's layout: read as the padded batch
            owner = type(self).__name__
            if node_feat.dim() != 2:
                raise InputError(
                    f"{owner}: with batch (a flattened batch), node_feat must be (N nodes, "
                    f"node_feature_dim={self.config.node_feature_dim}), got {tuple(node_feat.shape)}."
                )
            flat = FlattenedGraphs.from_batch(inputs["batch"], node_feat.shape[0], owner)
            node_feat, inputs = flat.padded_inputs(node_feat, inputs, owner)
        node_mask, edge_index = inputs.get("node_mask"), inputs.get("edge_index")
        edge_attr, edge_weight = inputs.get("edge_attr"), inputs.get("edge_weight")
        structural = {name: inputs.get(name) for name in STRUCTURAL_INPUTS}
        self.check_inputs(node_feat, node_mask, edge_index, edge_attr, edge_weight, structural)
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        b, n, _ = node_feat.shape
        if node_mask is None:
            node_mask = torch.ones(b, n, dtype=torch.bool, device=node_feat.device)
        node_mask = node_mask.bool()

        bias = None
        if self.graph_bias is not None:
            bias = self.graph_bias(inputs.get("spatial_pos"), edge_index, edge_attr)  # (b, h, n', n')
        edges = None
        if edge_index is not None and self.config.needs_edges():
            edges = GraphEdges(edge_index, edge_weight=edge_weight, edge_attr=edge_attr)
        attention_mask = node_mask
        virtual = self.config.add_virtual_token
        if virtual:
            attention_mask = torch.cat([node_mask.new_ones(b, 1), node_mask], dim=1)  # (b, n + 1)
            if edges is not None:
                edges = _with_virtual_token(edges, node_mask)

        refusal = self.config.padding_free_refusal() if self.config.padding_free else None
        if refusal is not None:  # padding_free set on a built model, past the config's validation
            raise InputError(f"{type(self).__name__}: padding_free=True: {refusal}; set padding_free=False.")
        # weights are one (n' x n') matrix per padded graph: a run that returns them runs padded
        stream = unpadded_batch(attention_mask, enabled=self.config.padding_free and not output_attentions)
        if stream is not None:
            last, all_hidden = self._encode_unpadded(
                stream, node_feat, node_mask, inputs, edges, output_hidden_states
            )
            all_attentions = None
        else:
            hidden = self.embeddings(node_feat, inputs)  # (b, n', D)
            attention_inputs = self.attention_inputs(
                *hidden.shape[:2],
                attention_mask=attention_mask,
                attention_bias=bias,
                edges=edges,
                output_attentions=output_attentions,
            )
            last, all_hidden, all_attentions = self.encoder(hidden, attention_inputs, output_hidden_states)
        nodes = last[:, 1:] if virtual else last  # (b, n, D)
        if self.config.graph_pooling == "virtual_token":
            pooled = last[:, 0]  # (b, D)
        else:
            weights = node_mask.to(nodes.dtype)[..., None]  # (b, n, 1)
            # mean over real nodes; a graph with none (a fully padded row) pools to 0, not 0 / 0
            pooled = (nodes * weights).sum(1) / weights.sum(1).clamp(min=1)
        if flat is not None:
            nodes = flat.from_padded(nodes)  # (N, D), the flattened batch's order
        return BaseModelOutputWithPooling(
            last_hidden_state=nodes, pooler_output=pooled, hidden_states=all_hidden, attentions=all_attentions
        )

    def _encode_unpadded(
        self,
        stream: UnpaddedBatch,
        node_feat: torch.Tensor,
        node_mask: torch.Tensor,
        inputs: GraphInputs,
        edges: GraphEdges | None,
        output_hidden_states: bool,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The batch's T real nodes (and each graph's virtual token first) as one (1, T) stream through the
        embeddings and every layer, scattered back to (b, n', D) with zeros at padding: every per-node
        computation runs on the real nodes only, and each graph attends within itself (edges never join two
        graphs; a dense core computes each graph alone: ``PackedSequences``)."""
        b, n = node_mask.shape
        real = node_mask.reshape(-1).nonzero().reshape(-1)  # (R,) the real nodes' flat positions g * n + i

        def gather(x: torch.Tensor) -> torch.Tensor:  # (b, n, ...) -> (1, R, ...)
            return x.reshape(b * n, *x.shape[2:])[real][None]

        per_node = {
            name: gather(inputs[name])
            for name in STRUCTURAL_INPUTS
            if name != "spatial_pos" and inputs.get(name) is not None
        }
        hidden = self.embeddings.encode_nodes(gather(node_feat), per_node, graph_index=real // n)  # (1, R, D)
        total = stream.num_tokens
        slot = stream.indices.new_full((stream.shape[0] * stream.shape[1],), -1)  # (b * n',) -> stream
        slot[stream.indices] = torch.arange(total, device=slot.device)
        if self.config.add_virtual_token:  # graph g's token at padded position g * (n + 1), its nodes after
            tokens = self.embeddings.virtual_tokens(b)[:, 0]  # (b, D)
            token_slots = slot[torch.arange(b, device=slot.device) * (n + 1)]
            node_slots = slot[real + real // n + 1]
            rows = hidden.new_zeros(total, hidden.shape[-1]).index_copy(0, token_slots, tokens)
            hidden = rows.index_copy(0, node_slots, hidden[0])[None]  # (1, T, D)
        hidden = self.embeddings.finish(hidden)
        if edges is not None:  # padded positions -> stream positions (every edge joins real nodes)
            weight, attr = edges.edge_weight, edges.edge_attr
            edges = GraphEdges(slot[edges.edge_index], edge_weight=weight, edge_attr=attr)
        attention_inputs = self.attention_inputs(1, total, packed=stream.packed, edges=edges)
        last, all_hidden, _ = self.encoder(hidden, attention_inputs, output_hidden_states)
        scattered = None if all_hidden is None else tuple(stream.scatter(h) for h in all_hidden)
        return stream.scatter(last), scattered


class EfficientGraphClassifier(EfficientGraphPreTrainedModel):
    """What both task heads share: the encoder, then dropout and a linear map of the states the head reads
    (:meth:`states`) to C outputs, and the head's loss (:meth:`loss`) when ``labels`` are given."""

    output_class: ClassVar[type[ModelOutput]]

    def __init__(self, config: EfficientGraphConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.graph = EfficientGraphModel(config)
        self.dropout = classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def states(self, outputs: BaseModelOutputWithPooling) -> torch.Tensor:
        raise NotImplementedError

    def loss(
        self, logits: torch.Tensor, labels: torch.Tensor, node_mask: torch.Tensor | None
    ) -> torch.Tensor:
        raise NotImplementedError

    @can_return_tuple
    @graph_forward
    def forward(
        self,
        node_feat: torch.Tensor,
        *,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        **inputs: Unpack[GraphInputs],
    ) -> ModelOutput:
        """Logits (b, C) per graph or (b, n, C) per node, and the loss of ``labels`` (the head's docstring
        gives their shapes)."""
        flags = {"output_attentions": output_attentions, "output_hidden_states": output_hidden_states}
        outputs = self.graph(node_feat, **flags, **inputs)
        logits = self.classifier(self.dropout(self.states(outputs)))
        loss = None if labels is None else self.loss(logits, labels, inputs.get("node_mask"))
        return self.output_class(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class EfficientGraphForGraphClassification(EfficientGraphClassifier):
    """Graph embedding (mean of nodes or the virtual token) -> dropout -> linear; regression, single-label or
    multi-label as transformers' sequence classification (``problem_type``), except that NaN regression /
    multi-label targets count as missing (OGB multi-task sets): the loss averages over the others.

    ``labels``: (b,) class ids, (b,) / (b, C) regression targets, or (b, C) 0/1 multi-label targets (NaN:
    missing, left out of the loss)."""

    # One label per input, as sequence classification.
    auto_class = AutoModelForSequenceClassification

    output_class = SequenceClassifierOutput

    def states(self, outputs):
        return outputs.pooler_output  # (b, D)

    def loss(self, logits, labels, node_mask):
        return classification_loss(self.config, logits, labels, ignore_nan=True, owner=type(self).__name__)


class EfficientGraphForNodeClassification(EfficientGraphClassifier):
    """Node states -> dropout -> linear, one prediction per node; the loss covers real nodes only.

    ``labels``: (b, n) class ids (-100 = no label), or (b, n, C) floats for multi-label / regression
    (``problem_type`` as for graph classification); padded nodes and NaN targets never count."""

    # One label per element, as token classification.
    auto_class = AutoModelForTokenClassification

    output_class = TokenClassifierOutput

    def states(self, outputs):
        return outputs.last_hidden_state  # (b, n, D)

    def loss(self, logits, labels, node_mask):
        owner = type(self).__name__
        if labels.shape not in (logits.shape[:-1], logits.shape):  # (b, n[, C]), or (N[, C]) flattened
            raise ValueError(
                f"{owner}: labels must have shape (batch, nodes) = {tuple(logits.shape[:-1])} (a class id "
                f"or target per node) or (batch, nodes, num_labels) = {tuple(logits.shape)}, got "
                f"{tuple(labels.shape)}. GraphCollator(label_level='node') pads them so."
            )
        keep = torch.ones_like(logits[..., 0], dtype=torch.bool) if node_mask is None else node_mask.bool()
        if not labels.is_floating_point():
            keep = keep & (labels != -100)  # (b, n)
        # over the (M, C) labelled nodes (0 if there is none); NaN targets (missing) are left out too
        return classification_loss(self.config, logits[keep], labels[keep], ignore_nan=True, owner=owner)
