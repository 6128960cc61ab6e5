"""Padding-free graph encoders (config.padding_free: everything outside attention on the real nodes only) and
PyG-style flattened batches (``batch``: each node's graph) give every real node, every graph and every loss
the padded computation's outputs, for every graph attention type in both layer types and both heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_efficient import (
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    GraphCollator,
    list_attention_types,
)
from hf_efficient.models.graph.configuration_efficient_graph import GRAPH_LAYER_TYPES

from ...attention.helpers import small_config
from ..helpers import CONFIG_ERRORS
from ..text.helpers import assert_close_real
from .helpers import attention_type_config, base_records, tiny_config

CLOSE = dict(atol=1e-5, rtol=1e-5)
GRAPH_TYPES = list_attention_types("graph")
HEADS = (EfficientGraphForGraphClassification, EfficientGraphForNodeClassification)


def node_labelled(records: list[dict]) -> list[dict]:
    """The records with a class id per node (one node unlabelled) for the node head."""
    labelled = [{**r, "y": [(i + k) % 2 for i in range(r["num_nodes"])]} for k, r in enumerate(records)]
    labelled[0]["y"][1] = -100
    return labelled


def padded_batch(model_class, config, records) -> dict:
    level = "node" if model_class is EfficientGraphForNodeClassification else "graph"
    records = node_labelled(records) if level == "node" else records
    return GraphCollator.for_config(config, label_level=level)(records)


def flattened_batch(model_class, config, records) -> dict:
    """torch_geometric's Batch.from_data_list of the records, written out: node rows one graph after another,
    edges shifted by the nodes before their graph, ``batch`` the graph of each node."""
    records = node_labelled(records) if model_class is EfficientGraphForNodeClassification else records
    offsets = np.cumsum([0] + [r["num_nodes"] for r in records])
    cat = lambda key, dtype: torch.from_numpy(  # noqa: E731
        np.concatenate([np.asarray(r[key], dtype=dtype) for r in records])
    )
    batch = {
        "node_feat": cat("node_feat", np.float32),  # (N, F)
        "edge_index": torch.from_numpy(
            np.concatenate(
                [np.asarray(r["edge_index"]) + o for r, o in zip(records, offsets, strict=False)], 1
            )
        ),  # (2, E)
        "batch": torch.repeat_interleave(
            torch.arange(len(records)), torch.tensor([r["num_nodes"] for r in records])
        ),
    }
    if config.edge_dim is not None:
        batch["edge_attr"] = cat("edge_attr", np.float32)
    for name in config.structural_inputs():
        floats = name in ("lap_pe", "rw_pe", "rnf", "de")
        batch[name] = cat(name, np.float32 if floats else np.int64)
    labels = cat("y", np.int64)
    batch["labels"] = labels  # (b,) per graph, (N,) per node
    return batch


def run_both(model_class, config, inputs: dict) -> tuple:
    """The padded model's and the padding-free one's outputs and gradients on the same weights."""
    torch.manual_seed(0)
    padded = model_class(config).eval()
    free = model_class(type(config).from_dict({**config.to_dict(), "padding_free": True})).eval()
    free.load_state_dict(padded.state_dict())
    outputs = []
    for model in (padded, free):
        out = model(**inputs, output_hidden_states=True)
        out.loss.backward()
        grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
        outputs.append((out, grads))
    return outputs


def assert_same(got, expected, node_mask) -> None:
    (out, grads), (ref, ref_grads) = got, expected
    if out.logits.dim() == 3:  # per node: padded positions are not compared
        assert_close_real(out.logits, ref.logits, node_mask, **CLOSE)
    else:
        torch.testing.assert_close(out.logits, ref.logits, **CLOSE)
    torch.testing.assert_close(out.loss, ref.loss, **CLOSE)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("graph_layer_type", GRAPH_LAYER_TYPES)
@pytest.mark.parametrize("attention_type", GRAPH_TYPES)
def test_padding_free_equals_padded(attention_type, graph_layer_type):
    """Both heads: logits at every real node and graph, the loss, the gradient of every parameter (1e-5),
    and every layer's hidden states at the real nodes."""
    config = attention_type_config(attention_type, graph_layer_type)
    for model_class in HEADS:
        batch = padded_batch(model_class, config, base_records())
        padded, free = run_both(model_class, config, batch)
        assert_same(free, padded, batch["node_mask"])
        for got, ref in zip(free[0].hidden_states, padded[0].hidden_states, strict=True):
            assert_close_real(got, ref, batch["node_mask"], **CLOSE)


@pytest.mark.parametrize("attention_type", ["graph_sparse", "full", "performer"])
def test_padding_free_with_every_encoding_and_the_virtual_token(attention_type):
    """Edge features, degrees, Laplacian and random-walk encodings, WL colours and the virtual token (its
    edges to every node, virtual-token pooling): the same outputs as padded."""
    extra = dict(edge_dim=2, attention_config={**small_config(attention_type), "edge_dim": 2})
    if attention_type != "graph_sparse":  # edges reach a dense type through GPS's local attention
        extra = dict(
            graph_layer_type="gps",
            local_attention_type="graph_sparse",
            local_attention_config={"edge_dim": 2},
            edge_dim=2,
        )
    config = tiny_config(
        attention_type=attention_type,
        **({"attention_config": small_config(attention_type)} if attention_type != "graph_sparse" else {}),
        **extra,
        max_degree=8,
        lap_pe_dim=3,
        rw_pe_dim=4,
        wl_vocab_size=16,
        add_virtual_token=True,
        graph_pooling="virtual_token",
    )
    for model_class in HEADS:
        batch = padded_batch(model_class, config, base_records())
        padded, free = run_both(model_class, config, batch)
        assert_same(free, padded, batch["node_mask"])


def test_padding_free_runs_the_real_nodes_only(monkeypatch):
    """The node encoder and the feed-forward layers see the R real nodes (+ one
    virtual token per graph), never the padded b * n positions."""
    config = tiny_config(
        attention_type="gatv2",
        attention_config=small_config("gatv2"),
        padding_free=True,
        add_virtual_token=True,
    )
    model = EfficientGraphForGraphClassification(config).eval()
    batch = padded_batch(EfficientGraphForGraphClassification, config, base_records())
    rows = []
    model.graph.embeddings.node_encoder.register_forward_hook(lambda m, args, out: rows.append(args[0].shape))
    model.graph.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda m, args, out: rows.append(args[0].shape)
    )
    model(**batch)
    real = int(batch["node_mask"].sum())
    assert rows == [(1, real, 3), (1, real + 3, 32)]


@pytest.mark.parametrize("padding_free", [False, True])
@pytest.mark.parametrize("attention_type", ["graph_sparse", "full", "longformer"])
def test_flattened_batch_equals_padded(attention_type, padding_free):
    """A PyG-style batch (node rows one graph after another, ``batch`` naming each node's graph, edges over
    the N nodes) gives the padded batch's graph logits, its node logits in the nodes' order, its loss."""
    config = attention_type_config(attention_type, "gps", padding_free=padding_free, rw_pe_dim=4)
    records = base_records()
    for model_class in HEADS:
        torch.manual_seed(0)
        model = model_class(config).eval()
        padded = padded_batch(model_class, config, records)
        flat = flattened_batch(model_class, config, records)
        expected, got = model(**padded), model(**flat)
        mask = padded["node_mask"]
        logits = expected.logits[mask] if got.logits.shape[0] == mask.sum() else expected.logits
        torch.testing.assert_close(got.logits, logits, **CLOSE)
        torch.testing.assert_close(got.loss, expected.loss, **CLOSE)
    states = model.graph(**{k: v for k, v in flat.items() if k != "labels"}).last_hidden_state
    assert states.shape == (mask.sum(), config.hidden_size)


def test_flattened_batch_errors():
    config = attention_type_config("graph_sparse", "transformer")
    model = EfficientGraphForGraphClassification(config).eval()
    flat = flattened_batch(EfficientGraphForGraphClassification, config, base_records())
    flat.pop("labels")
    cases = [
        ({"batch": flat["batch"].flip(0)}, "batch must count graphs from 0 in order"),
        ({"batch": flat["batch"][:-1]}, r"batch must be an integer tensor \(N,\)"),
        ({"node_mask": torch.ones(3, 7, dtype=torch.bool)}, "node_mask was given with batch"),
        ({"node_feat": flat["node_feat"][None]}, "with batch .* node_feat must be"),
        ({"edge_index": flat["edge_index"] + 100}, "edge_index holds node positions"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            model(**{**flat, **change})


def test_padding_free_refuses_graphormer_bias():
    """In the config, and in the forward of a model whose config was switched after it was built."""
    with pytest.raises(CONFIG_ERRORS, match="padding_free=True: graph_bias='graphormer' is one"):
        tiny_config(padding_free=True, graph_bias="graphormer")
    config = tiny_config(graph_bias="graphormer", max_degree=8)
    model = EfficientGraphForGraphClassification(config).eval()
    batch = padded_batch(EfficientGraphForGraphClassification, config, base_records())
    model.config.padding_free = True
    with pytest.raises(ValueError, match="EfficientGraphModel: padding_free=True: graph_bias='graphormer'"):
        model(**batch)
