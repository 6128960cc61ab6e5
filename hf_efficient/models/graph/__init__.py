"""EfficientGraph: the graph encoder (graph and node classification), its collator and Graphormer's bias.

Structure is computed once per record by :mod:`hf_efficient.data.graph_transforms` (cached by
``datasets.map``), batched by :class:`GraphCollator`, and read by the model as inputs::

    from hf_efficient import EfficientGraphConfig, EfficientGraphForGraphClassification, GraphCollator
    from hf_efficient.data.graph_transforms import graphormer_features

    config = EfficientGraphConfig(  # Graphormer: exact attention + spatial/edge bias, degrees, graph token
        attention_type="full", graph_bias="graphormer", max_degree=64, add_virtual_token=True,
        graph_pooling="virtual_token", node_feature_dim=9, edge_dim=3, num_labels=2,
    )
    # or GraphGPS: EfficientGraphConfig(graph_layer_type="gps", attention_type="performer",
    #     local_attention_config={"edge_dim": 3}, edge_dim=3, rw_pe_dim=16, ...)
    # or GAT: EfficientGraphConfig(attention_type="gat", ...) (GATv2: "gatv2"; PyG's GATConv / GATv2Conv)
    # or MAGNA: EfficientGraphConfig(attention_type="multi_hop", attention_config={"score": "gat"}, ...)
    dataset = dataset.map(graphormer_features)  # OGB-style records: edge_index, node_feat, edge_attr, y
    collate = GraphCollator.for_config(config)  # the columns and edge checks this config needs
    model = EfficientGraphForGraphClassification(config)
    loss = model(**collate([dataset[0], dataset[1]])).loss
"""

from .collator import GraphCollator
from .configuration_efficient_graph import EfficientGraphConfig
from .graphormer import GraphormerAttentionBias
from .modeling_efficient_graph import (
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    EfficientGraphModel,
    EfficientGraphPreTrainedModel,
)

__all__ = [
    "EfficientGraphConfig",
    "EfficientGraphForGraphClassification",
    "EfficientGraphForNodeClassification",
    "EfficientGraphModel",
    "EfficientGraphPreTrainedModel",
    "GraphCollator",
    "GraphormerAttentionBias",
]
