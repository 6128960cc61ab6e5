"""Collate OGB-style graph records into the padded batch :class:`EfficientGraphModel` reads.

Shapes: b = graphs, n = most nodes in the batch, F = node features, E = edges in the batch, k = PE width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import InputError
from .configuration_efficient_graph import STRUCTURAL_INPUTS
from .records import check_graph_record

# Per-node / per-pair columns from hf_efficient.data.graph_transforms -> padding value.
PADDING = {
    "spatial_pos": -1,  # (n, n): padded pairs are "unreachable"
    "in_degree": 0,
    "out_degree": 0,
    "lap_pe": 0.0,
    "rw_pe": 0.0,
    "wl_colors": 0,
    "rnf": 0.0,
    "de": 0.0,
}


@dataclass
class GraphCollator:
    """A list of records -> a dict of tensors (a ``data_collator`` for ``Trainer``).

    Output: ``node_feat`` (b, n, F), ``node_mask`` (b, n) bool, ``edge_index`` (2, E) over flattened
    positions (graph g's node i is g * n + i), ``edge_attr`` (E, Fe) if the records have it, each structural
    column padded (``spatial_pos`` (b, n, n) with -1, per-node columns (b, n[, k]) with 0), and ``labels``
    from ``y``: (b,) or (b, C) for graphs, (b, n) (padded -100) or (b, n, C) for nodes.

    With ``Trainer``, keep the record columns the model's ``forward`` does not name (``y``, ``num_nodes``):
    ``TrainingArguments(remove_unused_columns=False)``, or rename ``y`` to ``labels``.

    Attributes:
        require_edges: refuse a graph without edges (attention along edges would leave its nodes empty).
        add_self_loops: add a self loop to every node lacking one (zero edge features), so that edge
            attention also reads the node itself and a graph of isolated nodes still has edges.
        label_level: ``"graph"`` or ``"node"``.
        columns: structural columns to collate; None = every one the records carry. ``for_config`` picks the
            columns a model reads, so a record with extra cached columns still collates.
        edge_attr: collate ``edge_attr`` (None = when the records carry it).
    """

    require_edges: bool = True
    add_self_loops: bool = False
    label_level: str = "graph"
    columns: tuple[str, ...] | None = None
    edge_attr: bool | None = None

    def __post_init__(self):
        if self.label_level not in ("graph", "node"):
            raise ValueError(f"label_level must be 'graph' or 'node', got {self.label_level!r}.")
        unknown = set(self.columns or ()) - set(PADDING)
        if unknown:
            raise ValueError(f"Unknown columns {sorted(unknown)}; structural columns: {list(PADDING)}.")

    @classmethod
    def for_config(cls, config, **kwargs) -> GraphCollator:
        """The collator for a model config: its edges requirement, structural columns and edge features."""
        columns = tuple(config.structural_inputs())
        defaults = dict(
            require_edges=config.needs_edges(), columns=columns, edge_attr=config.edge_dim is not None
        )
        return cls(**{**defaults, **kwargs})

    def __call__(self, records: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not records:
            raise ValueError("Cannot collate an empty list of graphs.")
        want_attr = self.edge_attr if self.edge_attr is not None else records[0].get("edge_attr") is not None
        graphs = [self._read(i, record, want_attr) for i, record in enumerate(records)]
        n = max(g["num_nodes"] for g in graphs)
        self._check_widths(graphs)
        batch = {
            "node_feat": _pad([g["node_feat"] for g in graphs], (n,), 0),  # (b, n, F)
            "node_mask": torch.arange(n)[None] < torch.tensor([g["num_nodes"] for g in graphs])[:, None],
            "edge_index": torch.from_numpy(
                np.concatenate([g["edge_index"] + i * n for i, g in enumerate(graphs)], axis=1)
            ),  # (2, E)
        }
        if want_attr:
            width = max(g["edge_attr"].shape[1] for g in graphs)
            attrs = [  # original edges' features (a graph without edges has none), zeros for added self loops
                np.concatenate(
                    [g["edge_attr"].reshape(-1, width), np.zeros((g["num_loops"], width), np.float32)]
                )
                for g in graphs
            ]
            batch["edge_attr"] = torch.from_numpy(np.concatenate(attrs))  # (E, Fe)
        for name in self._columns(records[0]):
            pad_value = PADDING[name]
            values = [np.asarray(record[name]) for record in records]
            for i, (value, g) in enumerate(zip(values, graphs, strict=True)):
                want = (g["num_nodes"],) * (2 if name == "spatial_pos" else 1)
                if value.shape[: len(want)] != want:
                    raise ValueError(
                        f"graph {i}: {name} has shape {value.shape}, expected {want}[...] for its nodes."
                    )
            dims = (n, n) if name == "spatial_pos" else (n,)
            batch[name] = _pad(values, dims, pad_value)
        labels = [record.get("y", record.get("labels")) for record in records]
        if all(label is not None for label in labels):
            batch["labels"] = self._labels(labels, n, [g["num_nodes"] for g in graphs])
        return batch

    def _read(self, i: int, record: dict[str, Any], want_attr: bool) -> dict[str, Any]:
        """One record's node features, edges (+ self loops) and edge features as arrays, validated."""
        try:
            edge_index, num_nodes = check_graph_record(record)
        except ValueError as err:
            raise ValueError(f"graph {i}: {err}") from None
        node_feat = np.asarray(record["node_feat"])
        if node_feat.ndim != 2:
            raise ValueError(f"graph {i}: node_feat must be [num_nodes][F], got shape {node_feat.shape}.")
        if node_feat.dtype.kind not in "biuf":
            raise ValueError(f"graph {i}: node_feat must hold numbers, got {node_feat.dtype} values.")
        if node_feat.dtype.kind == "f" and not np.isfinite(node_feat).all():
            raise ValueError(
                f"graph {i}: node_feat holds NaN or infinite values; every output they reach would be NaN."
            )
        num_edges, num_loops = edge_index.shape[1], 0
        if self.add_self_loops:
            looped = np.zeros(num_nodes, dtype=bool)
            looped[edge_index[0, edge_index[0] == edge_index[1]]] = True
            missing = np.flatnonzero(~looped).astype(np.int64)  # nodes without a self loop, in order
            edge_index = np.concatenate([edge_index, np.stack([missing, missing])], axis=1)
            num_loops = missing.size
        if self.require_edges and edge_index.shape[1] == 0:
            raise ValueError(
                f"graph {i} has no edges, but the model attends along edges (its nodes would see nothing). "
                "Add self loops (GraphCollator(add_self_loops=True)) or use a dense attention type."
            )
        edge_attr = None
        if want_attr:
            if record.get("edge_attr") is None:
                raise ValueError(
                    f"graph {i} has no edge_attr, but edge features are collated (graph 0's, edge_dim)."
                )
            edge_attr = np.asarray(record["edge_attr"], dtype=np.float32)
            if len(edge_attr) != num_edges or (num_edges and edge_attr.ndim != 2):
                raise ValueError(
                    f"graph {i}: edge_attr has {len(edge_attr)} rows for {num_edges} edges; want [E][Fe]."
                )
            if not np.isfinite(edge_attr).all():
                raise ValueError(f"graph {i}: edge_attr holds NaN or infinite values.")
            edge_attr = edge_attr.reshape(num_edges, -1 if num_edges else 0)  # (E, Fe)
        return dict(
            num_nodes=num_nodes,
            node_feat=node_feat,
            edge_index=edge_index,
            edge_attr=edge_attr,
            num_loops=num_loops,
        )

    def _check_widths(self, graphs: list[dict]) -> None:
        for key in ("node_feat", "edge_attr"):
            widths = {g[key].shape[1] for g in graphs if g[key] is not None and g[key].shape[0]}
            if len(widths) > 1:
                raise ValueError(
                    f"The graphs' {key} have different widths {sorted(widths)}; they must all match."
                )

    def _columns(self, first: dict[str, Any]) -> list[str]:
        if self.columns is None:
            return [name for name in PADDING if first.get(name) is not None]
        for name in self.columns:
            if first.get(name) is None:
                transform = STRUCTURAL_INPUTS[name][1]
                raise InputError(
                    f"The model reads {name} but the records lack it; add it with "
                    f"hf_efficient.data.graph_transforms.{transform}, once per record: "
                    f"`from hf_efficient.data.graph_transforms import {transform}`, then "
                    f"`dataset = dataset.map({transform})` before collating."
                )
        return list(self.columns)

    def _labels(self, labels: list, n: int, num_nodes: list[int]) -> torch.Tensor:
        values = [np.asarray(label) for label in labels]
        integer = all(np.issubdtype(v.dtype, np.integer) or np.issubdtype(v.dtype, np.bool_) for v in values)
        if self.label_level == "graph":
            sizes = sorted({v.size for v in values})
            if len(sizes) > 1:
                raise ValueError(
                    f"Graph labels y of different sizes {sizes}; per-node labels need "
                    "GraphCollator(label_level='node')."
                )
            stacked = np.stack([v.reshape(-1) for v in values])  # (b, C)
            if stacked.shape[1] == 1:  # one class id (int) or one regression target (float) per graph
                out = torch.from_numpy(stacked[:, 0])
                return out.long() if integer else out.float()
            return torch.from_numpy(stacked).float()  # (b, C): multi-label 0/1 or multi-target regression
        for i, (value, nodes) in enumerate(zip(values, num_nodes, strict=True)):
            if value.ndim == 0 or value.shape[0] != nodes:
                raise ValueError(
                    f"graph {i}: node labels y have shape {value.shape} but the graph has num_nodes={nodes}: "
                    "give one label per node (-100 for an unlabelled node)."
                )
        out = _pad(values, (n,), -100 if integer else 0.0)  # (b, n) or (b, n, C)
        return out.long() if integer else out.float()


def _pad(values: list[np.ndarray], dims: tuple[int, ...], pad_value) -> torch.Tensor:
    """Stack arrays of shapes (m_i, [m_i,] ...) into (b, *dims, ...) filled with ``pad_value``."""
    values = [np.asarray(v) for v in values]
    integer = all(np.issubdtype(v.dtype, np.integer) or np.issubdtype(v.dtype, np.bool_) for v in values)
    dtype = torch.long if integer and isinstance(pad_value, int) else torch.float32
    trailing = next((v.shape[len(dims) :] for v in values if v.size), values[0].shape[len(dims) :])
    out = torch.full((len(values), *dims, *trailing), pad_value, dtype=dtype)
    for i, v in enumerate(values):
        index = (i, *(slice(0, s) for s in v.shape[: len(dims)]))
        out[index] = torch.as_tensor(v.reshape(*v.shape[: len(dims)], *trailing), dtype=dtype)
    return out
