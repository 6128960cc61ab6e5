"""PyG-style flattened batches: the N nodes of all graphs one after another, ``batch`` (N,) naming each
node's graph (torch_geometric's ``Batch``: ``x``, ``edge_index`` over the N nodes, ``batch``), read by the
graph models as the padded batch of the same graphs.

The model turns a flattened batch into the padded layout its blocks read (a copy of the per-node inputs,
nothing computed on padding under ``config.padding_free``) and returns the node states in the flattened
order, so both layouts give every node the same outputs.

Shapes: N = nodes in the batch, b = graphs, n = most nodes in a graph, E = edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...attention.inputs import check_edge_index, is_tracing
from ...errors import InputError
from ...modeling.checks import checking_values
from .collator import PADDING  # the per-node columns and their padding values


@dataclass(frozen=True, eq=False)
class FlattenedGraphs:
    """Where the N nodes of a flattened batch sit in the padded (b, n) batch.

    Attributes:
        positions: (N,) each node's flat position g * n + i in the padded batch.
        node_mask: (b, n) bool, True at real nodes.
    """

    positions: torch.Tensor
    node_mask: torch.Tensor

    @classmethod
    def from_batch(cls, batch: torch.Tensor, num_nodes: int, owner: str) -> FlattenedGraphs:
        """From ``batch`` (N,), each node's graph, sorted (torch_geometric's ``Batch.batch``)."""
        if is_tracing():
            raise InputError(
                f"{owner}: a flattened batch (batch=) cannot be traced: its number of graphs and nodes per "
                "graph are values of batch. Export with a padded batch (GraphCollator's node_mask)."
            )
        if batch.dim() != 1 or batch.numel() != num_nodes or batch.is_floating_point():
            raise InputError(
                f"{owner}: batch must be an integer tensor (N,) = ({num_nodes},), the graph of each row of "
                f"node_feat (N, F), got {tuple(batch.shape)} {batch.dtype}. Pass torch_geometric's "
                "Batch.batch."
            )
        batch = batch.long()
        if checking_values() and (int(batch[0]) < 0 or bool((batch[1:] < batch[:-1]).any())):
            raise InputError(
                f"{owner}: batch must count graphs from 0 in order (non-decreasing: each graph's nodes "
                "together, as torch_geometric's Batch gives), got "
                f"{batch[:8].tolist()}{'...' if num_nodes > 8 else ''}. Sort the nodes by graph."
            )
        counts = torch.bincount(batch)  # (b,) nodes per graph (0 for a graph id with none)
        n = int(counts.max())
        starts = counts.cumsum(0) - counts  # (b,) where each graph's nodes start
        within = torch.arange(num_nodes, device=batch.device) - starts[batch]  # (N,)
        node_mask = torch.arange(n, device=batch.device)[None] < counts[:, None]  # (b, n)
        return cls(batch * n + within, node_mask)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.node_mask.shape)

    def to_padded(self, x: torch.Tensor, pad_value=0) -> torch.Tensor:
        """(N, ...) per-node values -> (b, n, ...), ``pad_value`` at padding."""
        b, n = self.shape
        out = x.new_full((b * n, *x.shape[1:]), pad_value)
        return out.index_copy(0, self.positions, x).view(b, n, *x.shape[1:])

    def from_padded(self, y: torch.Tensor) -> torch.Tensor:
        """(b, n, ...) -> (N, ...): the nodes in their flattened order."""
        return y.reshape(-1, *y.shape[2:])[self.positions]

    def padded_inputs(self, node_feat: torch.Tensor, inputs: dict, owner: str) -> tuple[torch.Tensor, dict]:
        """The flattened batch's node features and graph inputs in the padded layout (GraphCollator's)."""
        if inputs.get("node_mask") is not None:
            raise InputError(
                f"{owner}: node_mask was given with batch; a flattened batch has no padding (batch names "
                "each node's graph). Drop node_mask, or pass a padded batch without batch."
            )
        if inputs.get("spatial_pos") is not None:
            raise InputError(
                f"{owner}: spatial_pos is a (graphs, nodes, nodes) matrix per padded batch, not a per-node "
                "column of a flattened one; collate Graphormer's inputs with GraphCollator (padded)."
            )
        padded = {name: value for name, value in inputs.items() if name != "batch"}
        edge_index = inputs.get("edge_index")
        if edge_index is not None:  # node j of the flattened batch -> its padded position
            nodes = self.positions.numel()
            check_edge_index(edge_index, 1, nodes, None, owner, read_values=checking_values())
            padded["edge_index"] = self.positions[edge_index]
        for name, pad_value in PADDING.items():
            if padded.get(name) is not None:
                padded[name] = self.to_padded(padded[name], pad_value)
        padded["node_mask"] = self.node_mask
        return self.to_padded(node_feat), padded


__all__ = ["FlattenedGraphs"]
