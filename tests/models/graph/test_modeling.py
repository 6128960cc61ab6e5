"""EfficientGraph (the graph encoder): every graph attention type in both layer types (checks.py), permutation
equivariance of every equivariant configuration, heads and losses, Graphormer's bias against hand-computed
values, the collator, save/load, Auto classes, clear errors.

Tiny models only (hidden 32, 2 layers, 4 heads: helpers.py), dropout 0 so outputs are deterministic.

Not permutation-equivariant (and so not in EQUIVARIANT): ``lap_pe`` inputs (an eigenvector's sign and the
basis of a repeated eigenvalue are arbitrary, so the transform's output on a relabelled graph is not the
relabelled output; see test_laplacian_pe_is_the_only_non_equivariant_input) and attention types with a
notion of position (longformer, bigbird, linformer, long_short, nystromformer: windows, blocks, landmarks
and length projections depend on the node order).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from hf_efficient import (
    EfficientBertConfig,
    EfficientGraphConfig,
    EfficientGraphForGraphClassification,
    EfficientGraphForNodeClassification,
    EfficientGraphModel,
    GraphCollator,
    list_attention_types,
)
from hf_efficient.attention import GraphEdges
from hf_efficient.data.graph_transforms import (
    distance_encoding,
    random_node_features,
    shortest_path_distances,
)
from hf_efficient.errors import InputError
from hf_efficient.models.graph.graphormer import GraphormerAttentionBias
from hf_efficient.models.graph.inputs import GRAPH_INPUTS
from hf_efficient.models.graph.modeling_efficient_graph import _with_virtual_token

from ...attention.helpers import small_config as small
from ...data.helpers import graph_record
from ...processes import BLOCK_HF_EFFICIENT, run_python
from ..helpers import CONFIG_ERRORS
from . import checks
from .helpers import base_records, make_record, permute_record, tiny_config

# Configurations with structure (edge features, positional encodings, virtual token, Graphormer's bias, GPS
# local attention) that must stay permutation-equivariant. Every equivariant attention type alone, in both
# layer types, is checked by test_every_graph_attention_type_in_both_layer_types.
EQUIVARIANT = {
    "graph_sparse+rw+wl": dict(
        attention_type="graph_sparse",
        attention_config={"edge_dim": 2},
        edge_dim=2,
        rw_pe_dim=4,
        wl_vocab_size=64,
    ),
    "multi_hop+virtual": dict(
        attention_type="multi_hop",
        attention_config=small("multi_hop", edge_dim=2),
        edge_dim=2,
        add_virtual_token=True,
        graph_pooling="virtual_token",
    ),
    "gat+edge+virtual": dict(
        attention_type="gat",
        attention_config={"edge_dim": 2},
        edge_dim=2,
        add_virtual_token=True,
        graph_pooling="virtual_token",
    ),
    "gatv2+edge": dict(attention_type="gatv2", attention_config={"edge_dim": 2}, edge_dim=2),
    "magna+edge": dict(
        attention_type="multi_hop",
        attention_config=small("multi_hop", edge_dim=2, score="gat"),
        edge_dim=2,
    ),
    "graphormer": dict(
        attention_type="full",
        graph_bias="graphormer",
        edge_dim=2,
        max_degree=8,
        add_virtual_token=True,
        graph_pooling="virtual_token",
    ),
    "gps_performer": dict(
        attention_type="performer",
        attention_config=small("performer"),
        graph_layer_type="gps",
        local_attention_config={"edge_dim": 2},
        edge_dim=2,
        max_degree=8,
    ),
    "gps_linear_multi_hop": dict(
        attention_type="linear",
        attention_config=small("linear"),
        graph_layer_type="gps",
        local_attention_type="multi_hop",
        add_virtual_token=True,
    ),
    "gps_graphormer": dict(
        attention_type="full", graph_layer_type="gps", graph_bias="graphormer", max_degree=8
    ),
}


@pytest.mark.parametrize("name", list(EQUIVARIANT))
def test_permuting_nodes_permutes_node_outputs_and_keeps_graph_outputs(name):
    checks.check_permutation_equivariance(tiny_config(**EQUIVARIANT[name]))


@pytest.mark.parametrize("attention_type", list_attention_types("graph"))
def test_every_graph_attention_type_in_both_layer_types(attention_type, tmp_path):
    checks.check_graph_encoder(attention_type, tmp_path)


def test_laplacian_pe_is_the_only_non_equivariant_input():
    """The model is equivariant given the PE; recomputing it on a relabelled 6-cycle (repeated eigenvalues)
    gives another basis, so outputs move; in training the model flips eigenvector signs at random."""
    torch.manual_seed(0)
    config = tiny_config(attention_type="graph_sparse", lap_pe_dim=3)
    model = EfficientGraphForGraphClassification(config).eval()
    collate = GraphCollator.for_config(config)
    record = make_record(6, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)], seed=4)
    perm = np.array([3, 0, 4, 1, 5, 2])
    recomputed = permute_record(record, perm, np.arange(12))
    moved = {
        **recomputed,
        "lap_pe": np.asarray(record["lap_pe"])[perm].tolist(),
    }  # PE relabelled, not recomputed
    with torch.no_grad():
        base = model(**collate([record])).logits
        torch.testing.assert_close(model(**collate([moved])).logits, base, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(model(**collate([recomputed])).logits, base, atol=1e-4)
    seen = []  # what the PE projection reads
    model.graph.embeddings.lap_pe_encoder.register_forward_hook(
        lambda module, args, out: seen.append(args[0])
    )
    batch = collate([record] * 16)
    lap_pe = batch["lap_pe"]  # (16, 6, 3)
    model.train()  # each eigenvector of each graph gets a random sign (config.lap_pe_sign_flip)
    model(**batch)
    signs = (seen[-1] * lap_pe).sum(1) / lap_pe.square().sum(1)  # (16, 3): projection on each vector
    torch.testing.assert_close(seen[-1], lap_pe * signs[:, None])
    assert set(signs.round().unique().tolist()) == {-1.0, 1.0} and len(set(map(tuple, signs.tolist()))) > 2
    model.eval()
    model(**batch)
    assert torch.equal(seen[-1], lap_pe)
    assert not EfficientGraphConfig(lap_pe_sign_flip=False).lap_pe_sign_flip


def test_random_node_features_fresh_in_training_fixed_in_evaluation():
    """rnf_resample (default): every training forward reads a new standard-normal draw, evaluation reads the
    column's fixed per-graph draw; rnf_resample=False reads the column in training too."""
    records = [{**r, **random_node_features(r, k=4, seed=0)} for r in base_records()]
    for resample in (True, False):
        config = tiny_config(attention_type="gat", rnf_dim=4, rnf_resample=resample)
        model = EfficientGraphForGraphClassification(config)
        batch = GraphCollator.for_config(config)(records)
        seen = []  # what the projection reads
        model.graph.embeddings.rnf_encoder.register_forward_hook(
            lambda m, args, out, seen=seen: seen.append(args[0])
        )
        model.train()
        model(**batch)
        model(**batch)
        model.eval()
        model(**batch)
        assert torch.equal(seen[2], batch["rnf"])
        if resample:
            assert not torch.equal(seen[0], batch["rnf"]) and not torch.equal(seen[0], seen[1])
            assert abs(seen[0].std().item() - 1) < 0.25
        else:
            assert torch.equal(seen[0], batch["rnf"]) and torch.equal(seen[1], batch["rnf"])
    with pytest.raises(ValueError, match="random_node_features"):
        model(**{k: v for k, v in batch.items() if k != "rnf"})


def test_distance_encoding_reaches_the_model():
    """de_dim: the distance-encoding counts are projected into the node states; other targets move them."""
    config = tiny_config(attention_type="gatv2", de_dim=4)
    model = EfficientGraphForGraphClassification(config).eval()
    collate = GraphCollator.for_config(config)
    to_first = [{**r, **distance_encoding(r, max_distance=2, target_nodes=[0])} for r in base_records()]
    to_last = [
        {**r, **distance_encoding(r, max_distance=2, target_nodes=[r["num_nodes"] - 1])}
        for r in base_records()
    ]
    assert collate(to_first)["de"].shape == (3, 7, 4)
    with torch.no_grad():
        assert not torch.allclose(model(**collate(to_first)).logits, model(**collate(to_last)).logits)


# ---- heads and losses ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "num_labels, labels, problem_type",
    [
        (1, [0.5, -1.0, 2.0], "regression"),
        (3, [2, 0, 1], "single_label_classification"),
        (3, [[1, 0, 1], [0, 0, 0], [1, 1, 0]], "multi_label_classification"),
    ],
)
def test_graph_classification_problem_types(num_labels, labels, problem_type):
    config = tiny_config(attention_type="graph_sparse", num_labels=num_labels)
    model = EfficientGraphForGraphClassification(config)
    records = [
        {**r, "y": y if isinstance(y, list) else [y]} for r, y in zip(base_records(), labels, strict=True)
    ]
    batch = GraphCollator.for_config(config)(records)
    out = model(**batch)
    assert out.logits.shape == (3, num_labels) and model.config.problem_type == problem_type
    target = batch["labels"]
    expected = {
        "regression": lambda: F.mse_loss(out.logits.squeeze(-1), target),
        "single_label_classification": lambda: F.cross_entropy(out.logits, target),
        "multi_label_classification": lambda: F.binary_cross_entropy_with_logits(out.logits, target),
    }[problem_type]()
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert all(p.grad is not None for p in model.classifier.parameters())


def test_node_classification_loss_covers_labelled_real_nodes():
    config = tiny_config(attention_type="multi_hop", attention_config=small("multi_hop"), num_labels=3)
    model = EfficientGraphForNodeClassification(config)
    records = base_records()
    node_labels = [[i % 3 for i in range(r["num_nodes"])] for r in records]
    node_labels[0][2] = -100  # an unlabelled node
    batch = GraphCollator.for_config(config, label_level="node")(
        [{**r, "y": y} for r, y in zip(records, node_labels, strict=True)]
    )
    assert batch["labels"].shape == (3, 7) and (batch["labels"][2, 4:] == -100).all()
    out = model(**batch)
    assert out.logits.shape == (3, 7, 3)
    keep = batch["node_mask"] & (batch["labels"] != -100)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[keep], batch["labels"][keep]))
    out.loss.backward()

    multi = [[[1.0, 0.0, 1.0]] * r["num_nodes"] for r in records]  # multi-label per node, float
    model.config.problem_type = None
    batch = GraphCollator.for_config(config, label_level="node")(
        [{**r, "y": y} for r, y in zip(records, multi, strict=True)]
    )
    out = model(**batch)
    mask = batch["node_mask"]
    expected = F.binary_cross_entropy_with_logits(out.logits[mask], batch["labels"][mask])
    assert model.config.problem_type == "multi_label_classification"
    torch.testing.assert_close(out.loss, expected)


def test_categorical_node_features_and_attention_outputs():
    config = tiny_config(
        attention_type="full",
        node_vocab_size=5,
        graph_bias="graphormer",
        add_virtual_token=True,
        node_feature_dim=2,
    )
    model = EfficientGraphModel(config).eval()
    records = [
        {**r, "node_feat": [[i % 5, (i + 1) % 5] for i in range(r["num_nodes"])]} for r in base_records()
    ]
    batch = GraphCollator.for_config(config)(records)
    assert batch.pop("labels").shape == (3,) and batch["node_feat"].dtype == torch.long
    out = model(**batch, output_attentions=True, output_hidden_states=True)
    assert out.last_hidden_state.shape == (3, 7, 32) and out.pooler_output.shape == (3, 32)
    assert out.attentions[0].shape == (3, 4, 8, 8) and out.hidden_states[0].shape == (3, 8, 32)
    with pytest.raises(ValueError, match="integer categories"):
        model(**{**batch, "node_feat": batch["node_feat"] + 5})


@pytest.mark.parametrize("attention_type", ["graph_sparse", "gat", "gatv2"])
def test_edge_attention_outputs_are_sparse_per_edge_probabilities(attention_type):
    """output_attentions with attention over edges: per layer a sparse (b, h, n', n') tensor with one entry
    per edge and head (self loops included for gat), each real node's row a distribution over its in-edges."""
    config = tiny_config(attention_type=attention_type, add_virtual_token=True)
    model = EfficientGraphModel(config).eval()
    collate = GraphCollator.for_config(config, add_self_loops=True)
    batch = collate(base_records())
    batch.pop("labels")
    out = model(**batch, output_attentions=True)
    b, n = batch["node_mask"].shape
    assert len(out.attentions) == config.num_hidden_layers
    for weights in out.attentions:
        assert weights.is_sparse and weights.shape == (b, 4, n + 1, n + 1)
        dense = weights.to_dense()
        real = torch.cat([torch.ones(b, 1, dtype=torch.bool), batch["node_mask"]], dim=1)  # token first
        row_sums = dense.sum(-1)  # (b, h, n + 1)
        torch.testing.assert_close(
            row_sums[real[:, None].expand_as(row_sums)], torch.ones(int(real.sum()) * 4)
        )
        assert (dense.transpose(-1, -2)[~real[:, None, :, None].expand_as(dense)] == 0).all()  # no padded key


def test_edge_weights_reach_edge_attention_with_virtual_token():
    config = tiny_config(attention_type="graph_sparse", add_virtual_token=True)
    model = EfficientGraphModel(config).eval()
    batch = GraphCollator.for_config(config)(base_records())
    batch.pop("labels")
    num_edges = batch["edge_index"].shape[1]
    with torch.no_grad():
        plain = model(**batch).last_hidden_state
        ones = model(**batch, edge_weight=torch.ones(num_edges)).last_hidden_state
        weighted = model(**batch, edge_weight=torch.rand(num_edges) + 0.1).last_hidden_state
    torch.testing.assert_close(ones, plain)
    assert not torch.allclose(weighted, plain, atol=1e-4)


def test_gradient_checkpointing_same_gradients():
    config = tiny_config(**EQUIVARIANT["gps_performer"])
    batch = GraphCollator.for_config(config)(base_records())
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = EfficientGraphForGraphClassification(config).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(**batch).loss.backward()
        grads.append(model.graph.encoder.layer[0].local_attention.self.query.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])


# ---- Graphormer bias ----------------------------------------------------------------------------------
def test_graphormer_bias_matches_hand_computation():
    """C4 (0-1-2-3-0) plus an isolated node 4: spatial buckets, edge encoding averaged over both shortest
    paths between opposite nodes, virtual-token row and column."""
    config = tiny_config(
        graph_bias="graphormer",
        edge_dim=1,
        max_edge_hops=3,
        max_spatial_distance=1,
        add_virtual_token=True,
        num_attention_heads=2,
    )
    bias_module = GraphormerAttentionBias(config)
    with torch.no_grad():
        bias_module.spatial_embedding.weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 10.0], [5.0, 50.0]]))
        weight = torch.tensor(
            [[(hop + 1) * (head + 1)] for hop in range(3) for head in range(2)], dtype=torch.float
        )
        bias_module.edge_encoder.weight.copy_(weight)  # W_hop[head] = (hop + 1) * (head + 1)
        bias_module.edge_encoder.bias.zero_()
        bias_module.virtual_distance.weight.copy_(torch.tensor([[7.0, -7.0]]))
    record = graph_record(5, [(0, 1), (1, 2), (2, 3), (3, 0)])
    source, target = record["edge_index"]
    x = {
        (s, t): float(e + 1) for e, (s, t) in enumerate(zip(source, target, strict=True))
    }  # feature of s -> t
    spatial_pos = torch.tensor(shortest_path_distances(record)["spatial_pos"])[None]  # (1, 5, 5)
    bias = bias_module(spatial_pos, torch.tensor([source, target]), torch.tensor(list(x.values()))[:, None])
    assert bias.shape == (1, 2, 6, 6)
    assert (bias[0, 0, 0] == 7).all() and (bias[0, 1, :, 0] == -7).all()
    inner = bias[0, :, 1:, 1:]  # (h, 5, 5)
    for head in range(2):
        scale = head + 1
        assert inner[head, 0, 0] == 0 and inner[head, 0, 4] == inner[head, 4, 4 - 4] == [5.0, 50.0][head]
        torch.testing.assert_close(inner[head, 0, 1], torch.tensor([1.0, 10.0][head] + scale * x[(0, 1)]))
        # 0 -> 2: paths 0-1-2 and 0-3-2; hop 0 mean(x01, x03) * W_0, hop 1 mean(x12, x32) * W_1, / 2 hops
        hops = (x[(0, 1)] + x[(0, 3)]) / 2 * scale + (x[(1, 2)] + x[(3, 2)]) / 2 * 2 * scale
        torch.testing.assert_close(inner[head, 0, 2], torch.tensor([1.0, 10.0][head] + hops / 2))
        hops_back = (x[(2, 1)] + x[(2, 3)]) / 2 * scale + (x[(1, 0)] + x[(3, 0)]) / 2 * 2 * scale
        torch.testing.assert_close(inner[head, 2, 0], torch.tensor([1.0, 10.0][head] + hops_back / 2))


def test_graphormer_edge_encoding_same_in_chunks():
    config = tiny_config(**EQUIVARIANT["graphormer"])
    batch = GraphCollator.for_config(config)(base_records())
    bias_module = GraphormerAttentionBias(config)
    inputs = (batch["spatial_pos"], batch["edge_index"], batch["edge_attr"])
    whole = bias_module(*inputs)
    bias_module.chunk_elements = 100  # two edges per chunk at n = 7
    torch.testing.assert_close(bias_module(*inputs), whole)
    assert whole.shape == (3, 4, 8, 8)


def test_virtual_token_edges():
    edges = GraphEdges(torch.tensor([[0, 3], [1, 4]]), edge_attr=torch.ones(2, 1))  # b=2, n=3: 0->1 and 0->1
    node_mask = torch.tensor([[True, True, False], [True, True, True]])
    out = _with_virtual_token(edges, node_mask)
    pairs = set(map(tuple, out.edge_index.T.tolist()))
    assert {(1, 2), (5, 6)} <= pairs  # original edges shifted past each graph's token
    token_edges = {
        (0, 1),
        (1, 0),
        (0, 2),
        (2, 0),
        (0, 0),
        (4, 5),
        (5, 4),
        (4, 6),
        (6, 4),
        (4, 7),
        (7, 4),
        (4, 4),
    }
    assert pairs == token_edges | {(1, 2), (5, 6)}
    assert out.edge_attr.shape == (14, 1) and out.edge_attr[2:].abs().sum() == 0


# ---- save/load, Auto classes -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["graphormer", "gps_performer", "multi_hop+virtual"])
def test_save_load_identical_through_auto_classes(name, tmp_path):
    checks.check_save_load_identical_through_auto_classes(tiny_config(**EQUIVARIANT[name]), tmp_path)


@pytest.mark.slow  # a fresh interpreter
def test_remote_code_loads_without_hf_efficient(tmp_path):
    """register_for_auto_class + save_pretrained ships flat remote code (hf_efficient.hub) that a fresh
    process in which hf_efficient cannot be imported loads with trust_remote_code=True: same logits."""
    config = tiny_config(**EQUIVARIANT["gps_performer"])
    model = EfficientGraphForGraphClassification(config).eval()
    model.register_for_auto_class("AutoModelForSequenceClassification")
    model.save_pretrained(tmp_path / "model")
    batch = GraphCollator.for_config(config)(base_records())
    torch.save(batch, tmp_path / "batch.pt")
    script = BLOCK_HF_EFFICIENT + (
        "import torch\n"
        "from transformers import AutoModelForSequenceClassification\n"
        "folder, batch, out = sys.argv[1:]\n"
        "model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()\n"
        "with torch.no_grad():\n"
        "    torch.save(model(**torch.load(batch)).logits, out)\n"
    )
    run_python(script, tmp_path / "model", tmp_path / "batch.pt", tmp_path / "logits.pt", cwd=tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), model(**batch).logits, atol=0, rtol=0)


def test_auto_classes_map_to_graph_models():
    config = AutoConfig.for_model(
        "efficient_graph", hidden_size=32, num_hidden_layers=1, num_attention_heads=4
    )
    assert isinstance(config, EfficientGraphConfig) and config.modality == "graph"
    assert type(AutoModel.from_config(config)) is EfficientGraphModel
    assert (
        type(AutoModelForSequenceClassification.from_config(config)) is EfficientGraphForGraphClassification
    )
    assert type(AutoModelForTokenClassification.from_config(config)) is EfficientGraphForNodeClassification


# ---- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(attention_type="performer", graph_bias="graphormer"), "cannot take"),
        (dict(graph_layer_type="gps", local_attention_type="full"), "local_attention_type"),
        (dict(attention_type="graph_sparse", edge_dim=2), "edge_dim"),
        (dict(graph_pooling="virtual_token"), "add_virtual_token"),
        (dict(graph_bias="spd"), "graph_bias"),
        (dict(attention_type="reformer_lsh"), "not available for graph"),
        (dict(max_degree=0), "max_degree"),
        (dict(attention_type="performer", edge_dim=2), "nothing reads edge features"),
        (dict(de_dim=1), "de_dim"),
        (dict(rnf_dim=0), "rnf_dim"),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(CONFIG_ERRORS, match=message):
        tiny_config(**overrides)


def test_graph_attention_types_refused_by_text_models():
    with pytest.raises(CONFIG_ERRORS, match="not available for text"):
        EfficientBertConfig(attention_type="multi_hop")


def test_model_input_errors():
    config = tiny_config(attention_type="full", graph_bias="graphormer")
    model = EfficientGraphModel(config).eval()
    batch = GraphCollator.for_config(config)(base_records())
    batch.pop("labels")
    with pytest.raises(ValueError, match="needs the spatial_pos input"):
        model(**{k: v for k, v in batch.items() if k != "spatial_pos"})
    with pytest.raises(ValueError, match="rw_pe was given .* ignored"):
        model(**batch, rw_pe=torch.zeros(3, 7, 4))
    with pytest.raises(ValueError, match="node_feature_dim=3"):
        model(**{**batch, "node_feat": batch["node_feat"][..., :2]})
    with pytest.raises(ValueError, match="edge_attr was given"):
        model(**batch, edge_attr=torch.zeros(batch["edge_index"].shape[1], 2))
    with pytest.raises(ValueError, match="edge_weight was given"):
        model(**batch, edge_weight=torch.ones(batch["edge_index"].shape[1]))
    edge_model = EfficientGraphModel(tiny_config(attention_type="graph_sparse")).eval()
    with pytest.raises(ValueError, match="attends along edges: pass edge_index"):
        edge_model(node_feat=batch["node_feat"], node_mask=batch["node_mask"])


@pytest.mark.parametrize(
    "model_class",
    [EfficientGraphModel, EfficientGraphForGraphClassification, EfficientGraphForNodeClassification],
    ids=lambda c: c.__name__,
)
def test_forward_names_every_graph_input_and_refuses_others(model_class):
    """The graph inputs are declared once (models/graph/inputs.py), yet each forward's signature names them
    (Trainer keeps only the dataset columns a forward names), a misspelled one raises as for a plain
    function, and after node_feat nothing is positional (a mask there is no label)."""
    parameters = inspect.signature(model_class.forward).parameters
    assert set(GRAPH_INPUTS) | {"node_feat", "output_attentions"} <= set(parameters)
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in GRAPH_INPUTS)
    config = tiny_config(attention_type="graph_sparse", num_labels=2)
    model = model_class(config).eval()
    batch = GraphCollator.for_config(config)(base_records())
    batch.pop("labels")
    with pytest.raises(TypeError, match="unexpected keyword argument 'edge_indx'"):
        model(**batch, edge_indx=batch["edge_index"])
    with pytest.raises(TypeError, match="positional argument"):
        model(batch["node_feat"], batch["node_mask"])
    assert model(**batch)[0].shape[0] == batch["node_feat"].shape[0]


def test_collator_errors():
    records = base_records()
    collate = GraphCollator(require_edges=True)
    no_edges = {"edge_index": [[], []], "num_nodes": 2, "node_feat": [[0.0] * 3] * 2, "y": [0]}
    with pytest.raises(ValueError, match="graph 1 has no edges"):
        collate([records[2], no_edges])
    with pytest.raises(ValueError, match="graph 1 has no edge_attr"):
        GraphCollator(add_self_loops=True)([records[2], no_edges])
    looped = GraphCollator(add_self_loops=True, columns=())([records[2], {**no_edges, "edge_attr": []}])
    assert looped["edge_index"].shape[1] == 6 + 4 + 2  # path edges + 4 loops, 2 loops for the edgeless graph
    assert looped["edge_attr"].shape == (12, 2) and (looped["edge_attr"][6:] == 0).all()
    assert looped["edge_index"][:, -2:].tolist() == [[4, 5], [4, 5]]  # graph 1's nodes sit at 4 + i
    with pytest.raises(ValueError, match="graph 0: edge_index holds node ids"):
        collate([{**records[2], "edge_index": [[0, 9], [1, 2]]}])
    with pytest.raises(ValueError, match="node_feat have different widths"):
        collate([records[2], {**records[1], "node_feat": [[0.0] * 5] * 7}])
    with pytest.raises(ValueError, match="edge_attr has 2 rows for 6 edges"):
        collate([{**records[2], "edge_attr": [[0.0, 0.0]] * 2}])
    with pytest.raises(ValueError, match="node_feat has 3 rows"):
        collate([{**records[2], "node_feat": [[0.0] * 3] * 3}])
    with pytest.raises(InputError, match=r"add it with hf_efficient.data.graph_transforms.shortest_path_d"):
        GraphCollator.for_config(tiny_config(graph_bias="graphormer"))([{**records[2], "spatial_pos": None}])
    with pytest.raises(InputError, match=r"dataset.map\(node_degrees\)"):  # the function and its call
        GraphCollator.for_config(tiny_config(max_degree=8))([{**records[2], "in_degree": None}])
    with pytest.raises(ValueError, match="label_level='node'"):
        collate([{**records[2], "y": [0, 1, 0, 1]}, records[1]])
    with pytest.raises(ValueError, match="spatial_pos has shape"):
        collate([{**records[2], "spatial_pos": [[0]]}])
