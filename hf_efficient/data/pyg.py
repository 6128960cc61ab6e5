"""PyTorch Geometric adapter: ``torch_geometric.data.Data`` <-> the OGB-style records this package reads.

PyG is optional: :func:`from_pyg` reads any object with PyG's attribute names (``edge_index``, ``x``,
``edge_attr``, ``y``, ``num_nodes``) and never imports it; :func:`to_pyg` and batches need
``torch_geometric`` (``pip install torch_geometric``).

    records = pyg_to_records(dataset)                    # e.g. a torch_geometric.datasets.TUDataset
    collator = GraphCollator.for_config(config)          # then as any record: collate, datasets.map...
    ds = datasets.Dataset.from_list(pyg_to_records(dataset, as_lists=True))   # cached transforms

Mapping: ``x`` -> ``node_feat`` (N, F) (a 1-D ``x`` becomes (N, 1)), ``edge_index`` -> ``edge_index``
(2, E), ``edge_attr`` -> ``edge_attr`` (E, Fe) (1-D becomes (E, 1)), ``y`` -> ``y``, ``num_nodes`` ->
``num_nodes``. ``edge_weight`` and other attributes are not carried (the collator has no column for them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

PYG_INSTALL = "pip install torch_geometric"


def _numpy(value) -> np.ndarray:
    """A tensor (any device, with or without grad) or array-like -> numpy."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def from_pyg(data, label_mask: str | None = None, as_lists: bool = False) -> dict[str, Any]:
    """One PyG graph (``Data`` or anything with its attributes) -> a record.

    Args:
        data: the graph; ``x`` is required (node features; ``torch_geometric.transforms.Constant()`` adds a
            column of ones to a featureless graph).
        label_mask: for node labels, the name of a boolean node mask (``"train_mask"``...): ``y`` is -100 (no
            label) outside it, as the collator and losses expect.
        as_lists: nested Python lists instead of numpy arrays (for ``datasets.Dataset.from_list``).

    Raises:
        ValueError: a batch of several graphs (use :func:`pyg_to_records`), no ``x``, or a bad mask.
    """
    if hasattr(data, "to_data_list"):  # a torch_geometric Batch
        raise ValueError("from_pyg takes one graph; for a Batch or a dataset use pyg_to_records().")
    if getattr(data, "x", None) is None:
        raise ValueError(
            "The PyG graph has no node features x; add some (torch_geometric.transforms.Constant() adds a "
            "column of ones, OneHotDegree the degrees) before converting."
        )
    node_feat = _numpy(data.x)
    node_feat = node_feat[:, None] if node_feat.ndim == 1 else node_feat  # (N, F)
    num_nodes = int(data.num_nodes) if getattr(data, "num_nodes", None) is not None else len(node_feat)
    edge_index = getattr(data, "edge_index", None)
    edge_index = np.zeros((2, 0), np.int64) if edge_index is None else _numpy(edge_index).astype(np.int64)
    record: dict[str, Any] = {"edge_index": edge_index, "node_feat": node_feat, "num_nodes": num_nodes}
    edge_attr = getattr(data, "edge_attr", None)
    if edge_attr is not None:
        edge_attr = _numpy(edge_attr)
        record["edge_attr"] = edge_attr[:, None] if edge_attr.ndim == 1 else edge_attr  # (E, Fe)
    y = getattr(data, "y", None)
    if y is not None:
        y = _numpy(y)
        if label_mask is not None:
            mask = getattr(data, label_mask, None)
            if mask is None or _numpy(mask).shape != (num_nodes,) or y.shape[:1] != (num_nodes,):
                raise ValueError(
                    f"label_mask={label_mask!r} needs a boolean attribute of shape ({num_nodes},) and a "
                    "label per node."
                )
            y = np.where(_numpy(mask).astype(bool).reshape((-1,) + (1,) * (y.ndim - 1)), y, -100)
        record["y"] = y
    if as_lists:
        record = {
            key: value.tolist() if isinstance(value, np.ndarray) else value for key, value in record.items()
        }
    return record


def pyg_to_records(graphs: Iterable, label_mask: str | None = None, as_lists: bool = False) -> list[dict]:
    """A PyG dataset, a ``Batch`` (split with ``to_data_list``) or any iterable of graphs -> records."""
    if hasattr(graphs, "to_data_list"):
        graphs = graphs.to_data_list()
    return [from_pyg(graph, label_mask, as_lists) for graph in graphs]


def to_pyg(record: dict[str, Any]):
    """A record -> ``torch_geometric.data.Data`` with ``x``, ``edge_index``, ``edge_attr``, ``y``,
    ``num_nodes``."""
    try:
        import torch
        from torch_geometric.data import Data
    except ImportError as err:
        raise ImportError(f"to_pyg needs PyTorch Geometric: `{PYG_INSTALL}`.") from err
    from ..models.graph.records import check_graph_record

    edge_index, num_nodes = check_graph_record(record)
    fields: dict[str, Any] = {"edge_index": torch.from_numpy(edge_index), "num_nodes": num_nodes}
    if record.get("node_feat") is not None:
        fields["x"] = torch.as_tensor(np.asarray(record["node_feat"]))
    if record.get("edge_attr") is not None:
        fields["edge_attr"] = torch.as_tensor(np.asarray(record["edge_attr"], dtype=np.float32))
    label = record.get("y", record.get("labels"))
    if label is not None:
        fields["y"] = torch.as_tensor(np.asarray(label))
    return Data(**fields)
