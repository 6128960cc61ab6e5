"""The PyTorch Geometric adapter: PyG graphs -> records -> collator -> model, and back."""

from __future__ import annotations

from types import SimpleNamespace

import datasets
import numpy as np
import pytest
import torch

from hf_efficient.data.pyg import from_pyg, pyg_to_records, to_pyg
from hf_efficient.models.graph import (
    EfficientGraphConfig,
    EfficientGraphForNodeClassification,
    GraphCollator,
)

EDGES = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])  # a path 0-1-2-3, both directions


def test_from_pyg_duck_typed_graph_with_a_label_mask():
    graph = SimpleNamespace(
        x=torch.arange(4.0),  # 1-D features -> (N, 1)
        edge_index=EDGES,
        edge_attr=torch.ones(6),  # 1-D -> (E, 1)
        y=torch.tensor([0, 1, 1, 0]),
        num_nodes=4,
        train_mask=torch.tensor([True, False, True, False]),
    )
    record = from_pyg(graph, label_mask="train_mask")
    assert record["node_feat"].shape == (4, 1) and record["edge_attr"].shape == (6, 1)
    assert record["edge_index"].dtype == np.int64 and record["num_nodes"] == 4
    assert record["y"].tolist() == [0, -100, 1, -100]
    assert from_pyg(graph, as_lists=True)["edge_index"] == EDGES.tolist()
    with pytest.raises(ValueError, match="no node features x.*Constant"):
        from_pyg(SimpleNamespace(x=None, edge_index=EDGES, num_nodes=4))
    with pytest.raises(ValueError, match="label_mask='val_mask' needs a boolean attribute"):
        from_pyg(graph, label_mask="val_mask")


def test_pyg_graphs_train_through_the_collator_and_round_trip():
    pyg = pytest.importorskip("torch_geometric")
    from torch_geometric.data import Batch, Data

    torch.manual_seed(0)
    graphs = [
        Data(x=torch.randn(4, 3), edge_index=EDGES, y=torch.tensor([0, 1, 1, 0])),
        Data(x=torch.randn(3, 3), edge_index=EDGES[:, :4], y=torch.tensor([1, 0, 1])),
    ]
    records = pyg_to_records(Batch.from_data_list(graphs))  # a Batch splits back into its graphs
    assert [r["num_nodes"] for r in records] == [4, 3]
    with pytest.raises(ValueError, match="pyg_to_records"):
        from_pyg(Batch.from_data_list(graphs))
    config = EfficientGraphConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        node_feature_dim=3, num_labels=2, attention_type="graph_sparse",
    )  # fmt: skip
    batch = GraphCollator.for_config(config, label_level="node", add_self_loops=True)(records)
    out = EfficientGraphForNodeClassification(config)(**batch)
    assert out.logits.shape == (2, 4, 2) and torch.isfinite(out.loss)
    out.loss.backward()
    back = to_pyg(records[0])
    assert isinstance(back, pyg.data.Data) and back.num_nodes == 4
    assert torch.equal(back.edge_index, EDGES) and torch.equal(back.x, graphs[0].x)
    table = datasets.Dataset.from_list(pyg_to_records(graphs, as_lists=True))  # Arrow, for cached maps
    assert table[1]["num_nodes"] == 3 and len(table[1]["edge_index"][0]) == 4
