"""Tiny EfficientGraph models (hidden 32, 2 layers, 4 heads, dropout 0) and small graphs with every
structural column, as records for the GraphCollator."""

from __future__ import annotations

import numpy as np
import torch

from hf_efficient import EfficientGraphConfig, get_attention_class
from hf_efficient.data.graph_transforms import graphormer_features, laplacian_pe, random_walk_pe, wl_colors

from ...attention.helpers import small_config
from ...data.helpers import graph_record

TINY_GRAPH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def tiny_config(**overrides) -> EfficientGraphConfig:
    """A tiny graph config: no dropout (deterministic outputs), 3 node features, 2 labels."""
    values = dict(
        **TINY_GRAPH,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        node_feature_dim=3,
        num_labels=2,
    )
    return EfficientGraphConfig(**{**values, **overrides})


def attention_type_config(attention_type: str, graph_layer_type: str, **overrides) -> EfficientGraphConfig:
    """A tiny config using ``attention_type`` (its small_config) as the global attention of every layer of
    ``graph_layer_type``, with node degrees as inputs so that dense types also see the structure.

    A type sized by a maximum length (linformer) gets ``max_position_embeddings=16`` (the encoder reads it
    for the cores' ``max_seq_len``; EfficientGraphConfig declares no such field, so it rides along as an
    extra attribute, saved in config.json)."""
    if get_attention_class(attention_type).capabilities.fixed_max_length:
        overrides = {"max_position_embeddings": 16, **overrides}
    values = dict(
        attention_config=small_config(attention_type), graph_layer_type=graph_layer_type, max_degree=8
    )
    return tiny_config(attention_type=attention_type, **{**values, **overrides})


def with_features(record: dict) -> dict:
    """Every structural column the models may read."""
    return {
        **record,
        **graphormer_features(record),
        **random_walk_pe(record, k=4),
        **wl_colors(record),
        **laplacian_pe(record, k=3),
    }


def make_record(num_nodes: int, undirected_edges, seed: int, label=0) -> dict:
    """A graph with random node (3) and edge (2) features, label ``label`` and every structural column."""
    g = torch.Generator().manual_seed(seed)
    record = graph_record(num_nodes, undirected_edges)
    record["node_feat"] = torch.randn(num_nodes, 3, generator=g).tolist()
    record["edge_attr"] = torch.randn(len(record["edge_index"][0]), 2, generator=g).tolist()
    record["y"] = [label]
    return with_features(record)


def base_records() -> list[dict]:
    """Two triangles with a bridge and a tail (7 nodes); a 6-cycle (ties between shortest paths) with a chord
    and an isolated node (7 nodes); a 4-node path (padding)."""
    return [
        make_record(7, [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5), (2, 3), (5, 6)], seed=0, label=0),
        make_record(7, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0), (0, 2)], seed=1, label=1),
        make_record(4, [(0, 1), (1, 2), (2, 3)], seed=2, label=1),
    ]


def permute_record(record: dict, perm: np.ndarray, edge_perm: np.ndarray) -> dict:
    """Node i of the result is node perm[i] of ``record``; edges are also reordered. Features recomputed."""
    inverse = np.argsort(perm)
    return with_features(
        {
            "edge_index": inverse[np.asarray(record["edge_index"])][:, edge_perm].tolist(),
            "num_nodes": record["num_nodes"],
            "node_feat": np.asarray(record["node_feat"])[perm].tolist(),
            "edge_attr": np.asarray(record["edge_attr"])[edge_perm].tolist(),
            "y": record["y"],
        }
    )


def run_base(model, batch: dict):
    """The encoder of a graph classifier on a collated batch (labels left out)."""
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    return model.graph(**inputs)
