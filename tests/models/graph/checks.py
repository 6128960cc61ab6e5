"""What every graph attention type must do inside EfficientGraph, as plain checks: forward and backward,
permutation equivariance (for the types that declare it), save/load through the Auto classes.

The first three take a config; :func:`check_graph_encoder` runs them all for an attention type name as the
global attention of each graph layer type (tests/models/graph/test_modeling.py parametrises it over
``list_attention_types("graph")``; a test that registers a mechanism of its own calls it directly).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoModelForSequenceClassification

from hf_efficient import (
    EfficientGraphConfig,
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    EfficientGraphModel,
    GraphCollator,
    get_attention_class,
)
from hf_efficient.models.graph.configuration_efficient_graph import GRAPH_LAYER_TYPES

from ..helpers import assert_grads_finite, check_export_matches
from .helpers import attention_type_config, base_records, permute_record, run_base


def check_forward_backward(config: EfficientGraphConfig) -> None:
    """Graph classification in training mode: logits (graphs, labels), a finite loss, finite gradients."""
    model = EfficientGraphForGraphClassification(config).train()
    batch = GraphCollator.for_config(config)(base_records())
    out = model(**batch)
    assert out.logits.shape == (3, config.num_labels) and torch.isfinite(out.loss)
    out.loss.backward()
    assert_grads_finite(model)


def check_permutation_equivariance(config: EfficientGraphConfig) -> None:
    """Relabelling the nodes (and reordering the edges) of every graph permutes the node outputs and leaves
    the graph outputs unchanged."""
    torch.manual_seed(0)
    model = EfficientGraphForGraphClassification(config).eval()
    collate = GraphCollator.for_config(config)
    records = base_records()
    rng = np.random.default_rng(3)
    perms = [rng.permutation(r["num_nodes"]) for r in records]
    permuted = [
        permute_record(r, p, rng.permutation(len(r["edge_index"][0])))
        for r, p in zip(records, perms, strict=True)
    ]
    batch, batch_perm = collate(records), collate(permuted)
    with torch.no_grad():
        nodes, nodes_perm = (
            run_base(model, batch).last_hidden_state,
            run_base(model, batch_perm).last_hidden_state,
        )
        logits, logits_perm = model(**batch).logits, model(**batch_perm).logits
    for g, perm in enumerate(perms):
        torch.testing.assert_close(nodes_perm[g, : len(perm)], nodes[g, perm], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits_perm, logits, atol=1e-5, rtol=1e-5)


def check_graph_without_real_nodes(config: EfficientGraphConfig) -> None:
    """A batch row with no real node (its node mask all 0, no edges): finite logits, losses and gradients in
    both heads, mean pooling of that row 0 (not 0 / 0), the other graphs as without it."""
    batch = GraphCollator.for_config(config)(base_records())
    graph_of_edge = batch["edge_index"][0] // batch["node_mask"].shape[1]
    batch["edge_index"] = batch["edge_index"][:, graph_of_edge != 2]
    if "edge_attr" in batch:
        batch["edge_attr"] = batch["edge_attr"][graph_of_edge != 2]
    batch["node_mask"][2] = False
    keep = [0, 1]
    model = EfficientGraphForGraphClassification(config).eval()
    out = model(**batch)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    out.loss.backward()
    assert_grads_finite(model)
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    with torch.no_grad():
        pooled = run_base(model, inputs).pooler_output
        if config.graph_pooling == "mean" and not config.add_virtual_token:
            assert (pooled[2] == 0).all()
        alone = {key: value[keep] if value.dim() and key not in ("edge_index", "edge_attr") else value
                 for key, value in inputs.items()}  # fmt: skip
        torch.testing.assert_close(model(**alone).logits, out.logits[keep], atol=1e-5, rtol=1e-5)
    nodes = EfficientGraphForNodeClassification(config).eval()
    labels = torch.zeros(batch["node_mask"].shape, dtype=torch.long).masked_fill(~batch["node_mask"], -100)
    loss = nodes(**inputs, labels=labels).loss
    assert torch.isfinite(loss)
    assert nodes(**inputs, labels=torch.full_like(labels, -100)).loss.item() == 0.0  # no labelled node


def check_save_load_identical_through_auto_classes(config: EfficientGraphConfig, folder: Path) -> None:
    """A graph classifier saved and loaded with AutoModelForSequenceClassification gives the same logits; the
    checkpoint also opens as the bare encoder (AutoModel)."""
    batch = GraphCollator.for_config(config)(base_records())
    model = EfficientGraphForGraphClassification(config).eval()
    model.save_pretrained(folder)
    loaded = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert (
        type(loaded) is EfficientGraphForGraphClassification
        and loaded.config.attention_type == config.attention_type
    )
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, model(**batch).logits, atol=0, rtol=0)
        base = AutoModel.from_pretrained(folder).eval()
        assert type(base) is EfficientGraphModel
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        torch.testing.assert_close(base(**inputs).last_hidden_state, model.graph(**inputs).last_hidden_state)


def check_exports(attention_type: str, folder: Path) -> None:
    """A graph classifier with ``attention_type`` in every layer exports (torch.export and ONNX) and matches
    the model on batches of other sizes (graphs, nodes, edges) than the export traced."""
    model = EfficientGraphForGraphClassification(attention_type_config(attention_type, "transformer"))
    check_export_matches(model, folder)


def check_graph_encoder(attention_type: str, folder: Path | None = None) -> None:
    """``attention_type`` as the global attention of every graph layer type (transformer, GPS): forward and
    backward, permutation equivariance where the type declares it, save/load. ``folder``: where checkpoints
    go (a temporary one if None)."""
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return check_graph_encoder(attention_type, Path(tmp))
    assert "graph" in get_attention_class(attention_type).capabilities.modalities, attention_type
    for graph_layer_type in GRAPH_LAYER_TYPES:
        config = attention_type_config(attention_type, graph_layer_type)
        check_forward_backward(config)
        check_graph_without_real_nodes(config)
        if get_attention_class(attention_type).capabilities.permutation_equivariant:
            check_permutation_equivariance(config)
        check_save_load_identical_through_auto_classes(config, Path(folder) / graph_layer_type)
