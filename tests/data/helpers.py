"""Records and files the data tests (and the model and script tests) build by hand."""

from __future__ import annotations

import csv
from pathlib import Path


def graph_record(num_nodes: int, undirected_edges, self_loops=(), **columns) -> dict:
    """An OGB-style graph record storing each undirected edge in both directions (as OGB does): first every
    (a, b) as a -> b, then every b -> a, then the self loops; ``columns`` (node_feat, y, ...) are added."""
    source = [a for a, b in undirected_edges] + [b for a, b in undirected_edges] + list(self_loops)
    target = [b for a, b in undirected_edges] + [a for a, b in undirected_edges] + list(self_loops)
    return {"edge_index": [source, target], "num_nodes": num_nodes, **columns}


def write_csv(path: Path, header: list[str], rows) -> str:
    """A CSV file with a header row (quoted where a field needs it); returns its path as a string."""
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return str(path)
