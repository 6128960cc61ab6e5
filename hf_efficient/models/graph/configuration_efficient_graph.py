"""Configuration of EfficientGraph: a graph transformer whose attention is chosen by ``attention_type``."""

from huggingface_hub.dataclasses import strict

from ...attention.registry import get_attention_class, list_attention_types, validate_attention_config
from ...errors import InputError
from ...modeling.config import EfficientEncoderConfig

GRAPH_LAYER_TYPES = ("transformer", "gps")
GRAPH_BIASES = (None, "graphormer")
GRAPH_POOLINGS = ("mean", "virtual_token")
# Structural inputs: name -> (config field enabling it, transform in hf_efficient.data.graph_transforms).
STRUCTURAL_INPUTS = {
    "spatial_pos": ("graph_bias", "shortest_path_distances"),
    "in_degree": ("max_degree", "node_degrees"),
    "out_degree": ("max_degree", "node_degrees"),
    "lap_pe": ("lap_pe_dim", "laplacian_pe"),
    "rw_pe": ("rw_pe_dim", "random_walk_pe"),
    "wl_colors": ("wl_vocab_size", "wl_colors"),
    "rnf": ("rnf_dim", "random_node_features"),
    "de": ("de_dim", "distance_encoding"),
}


@strict(accept_kwargs=True)
class EfficientGraphConfig(EfficientEncoderConfig):
    """A graph encoder: node features (+ structural encodings) -> shared encoder blocks -> task head.

    The attention of every layer comes from the registry (``attention_type`` / ``attention_config``, types
    for the ``graph`` modality). Structure enters as inputs, never as branches on the attention type:

    * ``graph_layer_type="transformer"``: one attention per layer. Types that take edges (``graph_sparse``,
      ``gat``, ``gatv2``, ``multi_hop``) attend along them; dense types (``full``, ``performer``,
      ``linear``...) attend to every node of the graph and see the structure only through encodings/bias.
    * ``graph_layer_type="gps"`` (GraphGPS, Rampasek et al. 2022): a local attention over edges
      (``local_attention_type``, default ``graph_sparse``) plus the global ``attention_type``, summed, then
      the feed-forward network.
    * ``graph_bias="graphormer"`` (Ying et al. 2021): an additive bias computed once per forward and passed
      to every layer: spatial (shortest-path distance) bias, edge encoding along shortest paths (when
      ``edge_dim`` is set) and a learned bias of the virtual token. Needs an attention type that takes a dense
      bias (``full``) and the ``spatial_pos`` input
      (:func:`hf_efficient.data.graph_transforms.shortest_path_distances`).
      Graphormer's centrality encoding is ``max_degree`` (independent of the bias), its graph token
      ``add_virtual_token``.

    Permutation equivariance: relabelling the nodes of a graph relabels the node outputs and leaves the graph
    outputs unchanged when every attention type used declares ``permutation_equivariant`` in its capabilities
    and the inputs are equivariant (degrees, shortest paths, random-walk PE, WL colours are). Not
    equivariant: ``lap_pe`` (eigenvector signs and bases are arbitrary; signs are flipped at random in
    training), ``rnf`` (random by design: equivariant in distribution only) and position-based types
    (windows, blocks, landmarks, length projections), which follow the node order. ``de`` is equivariant when
    the target nodes are relabelled with the graph.

    Attributes:
        node_feature_dim: F, width of ``node_feat``.
        node_vocab_size: None for float node features (a linear projection); otherwise ``node_feat`` holds
            integer categories in [0, node_vocab_size) per column, embedded per column and summed (OGB atoms).
        edge_dim: width of ``edge_attr`` (floats) or None for no edge features. Edge-taking attention types
            must then be configured with the same ``attention_config["edge_dim"]``.
        graph_layer_type: ``"transformer"`` or ``"gps"``.
        local_attention_type / local_attention_config: the GPS layers' local attention (must take edges).
        graph_bias: None or ``"graphormer"``.
        max_spatial_distance: distances above it share its bucket (Graphormer's spatial encoding); unreachable
            pairs have a bucket of their own.
        max_edge_hops: Graphormer's ``multi_hop_max_dist``: edges beyond this many hops of a shortest path are
            not encoded.
        max_degree: None, or the centrality encoding's largest degree (larger degrees are clipped to it);
            needs the ``in_degree`` / ``out_degree`` inputs.
        add_virtual_token: prepend a learned graph token attending to / attended by every node (Graphormer's
            [VNode]); with edge-taking attention it is joined to every node by edges both ways.
        lap_pe_dim / rw_pe_dim: widths of the ``lap_pe`` / ``rw_pe`` inputs (None = not used).
        lap_pe_sign_flip: in training mode, multiply each Laplacian eigenvector of each graph by a random sign
            (eigenvector signs are arbitrary; the model must not learn them). Never in eval mode.
        wl_vocab_size: None, or the number of embedding rows for ``wl_colors`` (colours are taken modulo it).
        rnf_dim: width of the ``rnf`` input (random node features,
            :func:`~hf_efficient.data.graph_transforms.random_node_features`; None = not used).
        rnf_resample: in training mode, replace ``rnf`` by a fresh standard-normal draw at every forward (a
            graph gets new features every epoch, from torch's generator, which ``Trainer`` seeds); in
            evaluation the input's fixed per-graph draw is read. False: always the input's.
        de_dim: width of the ``de`` input (distance encoding to the target nodes,
            :func:`~hf_efficient.data.graph_transforms.distance_encoding`: ``max_distance + 2``; None = not
            used).
        graph_pooling: ``"mean"`` over real nodes or ``"virtual_token"``.
    """

    model_type = "efficient_graph"
    modality = "graph"
    weight_shape_fields = (
        "node_feature_dim",
        "node_vocab_size",
        "edge_dim",
        "hidden_size",
        "intermediate_size",
    )

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    intermediate_size: int = 256
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-5
    classifier_dropout: float | int | None = None

    node_feature_dim: int = 1
    node_vocab_size: int | None = None
    edge_dim: int | None = None
    graph_layer_type: str = "transformer"
    local_attention_type: str = "graph_sparse"
    local_attention_config: dict | None = None
    graph_bias: str | None = None
    max_spatial_distance: int = 20
    max_edge_hops: int = 5
    max_degree: int | None = None
    add_virtual_token: bool = False
    lap_pe_dim: int | None = None
    lap_pe_sign_flip: bool = True
    rw_pe_dim: int | None = None
    wl_vocab_size: int | None = None
    rnf_dim: int | None = None
    rnf_resample: bool = True
    de_dim: int | None = None
    graph_pooling: str = "mean"

    def local_attention_for_layer(self, layer_idx: int) -> tuple[str, dict]:
        """(type, config) of the GPS local attention (the same in every layer)."""
        return self.local_attention_type, dict(self.local_attention_config or {})

    def attention_types_used(self) -> list[tuple[str, dict]]:
        """Every (type, config) the model builds: per-layer global types, plus the local one for GPS."""
        used = [self.attention_for_layer(i) for i in range(self.num_hidden_layers)]
        if self.graph_layer_type == "gps":
            used.append(self.local_attention_for_layer(0))
        return used

    def structural_inputs(self) -> list[str]:
        """Names of the structural inputs this model reads (see ``STRUCTURAL_INPUTS``)."""
        return [name for name, (field, _) in STRUCTURAL_INPUTS.items() if getattr(self, field) is not None]

    def needs_edges(self) -> bool:
        """Whether some layer attends along edges (the collator then refuses graphs without edges)."""
        return any(get_attention_class(name).capabilities.edges for name, _ in self.attention_types_used())

    def padding_free_refusal(self) -> str | None:
        if self.graph_bias is None:
            return None
        return (
            f"graph_bias={self.graph_bias!r} is one (nodes x nodes) matrix per padded graph, which a packed "
            "stream of real nodes cannot carry (Graphormer runs padded)"
        )

    def validate_graph_fields(self):
        """Class validator: choices exist, sizes agree, and every structural input has a consumer."""
        if self.hidden_size % self.num_attention_heads:
            raise InputError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads="
                f"{self.num_attention_heads}."
            )
        for name, value, choices in (
            ("graph_layer_type", self.graph_layer_type, GRAPH_LAYER_TYPES),
            ("graph_bias", self.graph_bias, GRAPH_BIASES),
            ("graph_pooling", self.graph_pooling, GRAPH_POOLINGS),
        ):
            if value not in choices:
                raise InputError(f"{name}={value!r} is not one of {choices}.")
        if self.de_dim is not None and self.de_dim < 2:
            raise InputError(f"de_dim must be None or >= 2 (max_distance + 2), got {self.de_dim}.")
        if self.graph_pooling == "virtual_token" and not self.add_virtual_token:
            raise InputError("graph_pooling='virtual_token' needs add_virtual_token=True.")
        for name in ("node_feature_dim", "max_spatial_distance", "max_edge_hops"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}.")
        optional_sizes = (
            "node_vocab_size", "edge_dim", "max_degree", "lap_pe_dim", "rw_pe_dim", "wl_vocab_size", "rnf_dim"
        )  # fmt: skip
        for name in optional_sizes:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise InputError(f"{name} must be None or >= 1, got {getattr(self, name)}.")
        if self.graph_layer_type == "gps":
            local = self.local_attention_type
            if (
                local not in list_attention_types("graph")
                or not get_attention_class(local).capabilities.edges
            ):
                raise InputError(
                    f"local_attention_type={local!r} must be a graph attention type over edges: "
                    f"{_edge_attention_types()}."
                )
            validate_attention_config(local, self.local_attention_config)
        for index in range(self.num_hidden_layers):
            name, _ = self.attention_for_layer(index)
            if self.graph_bias is not None and not get_attention_class(name).capabilities.attention_bias:
                raise InputError(
                    f"graph_bias={self.graph_bias!r} adds a dense bias to the global attention of every "
                    f"layer, which attention_type={name!r} cannot take; use attention_type='full' (or drop "
                    "graph_bias)."
                )
        if self.padding_free and self.padding_free_refusal() is not None:
            raise InputError(f"padding_free=True: {self.padding_free_refusal()}; set padding_free=False.")
        if self.edge_dim is not None and not self.needs_edges() and self.graph_bias is None:
            edge_types = ", ".join(_edge_attention_types())
            raise InputError(
                f"edge_dim={self.edge_dim} but nothing reads edge features: use an attention type over edges "
                f"({edge_types}, or graph_layer_type='gps') or graph_bias='graphormer', or set edge_dim=None."
            )
        for name, attention_config in self.attention_types_used():
            if get_attention_class(name).capabilities.edges:
                core_edge_dim = getattr(validate_attention_config(name, attention_config), "edge_dim", None)
                if core_edge_dim != self.edge_dim:
                    raise InputError(
                        f"{name} is configured with attention_config['edge_dim']={core_edge_dim} but the "
                        "model's "
                        f"edge_dim={self.edge_dim}: set both to the width of edge_attr (or both to None)."
                    )


def _edge_attention_types() -> list[str]:
    """The registered graph attention types that attend along edges."""
    return [name for name in list_attention_types("graph") if get_attention_class(name).capabilities.edges]
