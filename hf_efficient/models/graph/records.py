"""The OGB-style graph record read by the collator and by :mod:`hf_efficient.data.graph_transforms`.

A record is a dict with ``edge_index`` [2][E] (row 0 = source, row 1 = target node ids), ``node_feat``
[N][F], optional ``edge_attr`` [E][Fe], ``num_nodes`` N (optional when ``node_feat`` is given) and a label
``y``; lists, numpy arrays and tensors all work.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def check_graph_record(example: dict[str, Any]) -> tuple[np.ndarray, int]:
    """Validate a record's structure; return (edge_index (2, E) int64, num_nodes N).

    Raises:
        ValueError: ``edge_index`` not [2][E] of integer ids, node ids outside [0, N) (a negative id would
            wrap around in indexing), no node at all, ``node_feat`` rows != N, or no way to know N.
    """
    raw = example.get("edge_index")
    if raw is None or len(raw) == 0 or (len(raw) == 2 and len(raw[0]) == 0 and len(raw[1]) == 0):
        edge_index = np.zeros((2, 0), dtype=np.int64)  # a graph without edges
    else:
        if len(raw) != 2 or len(raw[0]) != len(raw[1]):
            raise ValueError("edge_index must be [2][E] (sources, targets) with rows of equal length.")
        values = np.asarray(raw)
        if not (np.issubdtype(values.dtype, np.integer) or _whole_numbers(values)):
            raise ValueError(
                f"edge_index must hold integer node ids, got {values.dtype} values such as "
                f"{values.reshape(-1)[:3].tolist()}."
            )
        edge_index = values.astype(np.int64)  # (2, E)
    num_nodes, node_feat = example.get("num_nodes"), example.get("node_feat")
    if num_nodes is None:
        if node_feat is None:
            raise ValueError("A graph record needs num_nodes or node_feat to know its number of nodes.")
        num_nodes = len(node_feat)
    if isinstance(num_nodes, float) and not float(num_nodes).is_integer():
        raise ValueError(f"num_nodes must be a whole number, got {num_nodes!r}.")
    num_nodes = int(num_nodes)
    if num_nodes < 1:
        raise ValueError(
            f"the graph has no nodes (num_nodes={num_nodes}): there is nothing to encode. Drop such records, "
            "e.g. dataset.filter(lambda record: record['num_nodes'] > 0)."
        )
    if node_feat is not None and len(node_feat) != num_nodes:
        raise ValueError(f"node_feat has {len(node_feat)} rows but num_nodes is {num_nodes}.")
    if edge_index.size and (edge_index.min() < 0 or edge_index.max() >= num_nodes):
        raise ValueError(
            f"edge_index holds node ids in [{edge_index.min()}, {edge_index.max()}] but the graph has "
            f"num_nodes={num_nodes} (ids must be in [0, {num_nodes}))."
        )
    return edge_index, num_nodes


def _whole_numbers(values: np.ndarray) -> bool:
    """Floats that are all whole numbers (ids stored as floats by a JSON or CSV round trip)."""
    return np.issubdtype(values.dtype, np.floating) and bool(np.all(np.isfinite(values) & (values % 1 == 0)))
