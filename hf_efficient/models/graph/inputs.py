"""The graph inputs of every graph model's ``forward``, declared once: what :class:`GraphCollator` gives
beside ``node_feat`` and the models read.

A graph forward takes them as ``**inputs: Unpack[GraphInputs]`` (as transformers' models take their common
flags, ``**kwargs: Unpack[TransformersKwargs]``), and :func:`graph_forward` makes them explicit where that
matters: the forward's signature lists them as keyword parameters (``Trainer`` keeps only the dataset columns
a forward's signature names; ``help()`` shows them), and a keyword that is none of them raises ``TypeError``
as a misspelled argument of a plain function does, never silently ignored.

Shapes: b = batch, n = nodes per graph (padded), N = nodes of a flattened batch, E = edges in the batch.
"""

from __future__ import annotations

import functools
import inspect
from typing import TypedDict

import torch


class GraphInputs(TypedDict, total=False):
    """A padded batch of graphs beside its node features, or a flattened one (``batch``: torch_geometric's
    layout, every per-node input (N, ...) and edges over the N nodes); every key is optional (None: not
    given)."""

    node_mask: torch.Tensor  # (b, n) 1 = real node, 0 = padding (None: nothing padded)
    edge_index: torch.Tensor  # (2, E) over flattened positions (graph g's node i is g * n + i), source first
    edge_attr: torch.Tensor  # (E, edge_dim) floats
    edge_weight: torch.Tensor  # (E,) positive weights for attention along edges
    spatial_pos: torch.Tensor  # (b, n, n) shortest-path hops, -1 unreachable or padded (Graphormer's bias)
    in_degree: torch.Tensor  # (b, n) ints (max_degree)
    out_degree: torch.Tensor  # (b, n) ints (max_degree)
    lap_pe: torch.Tensor  # (b, n, lap_pe_dim) Laplacian eigenvectors
    rw_pe: torch.Tensor  # (b, n, rw_pe_dim) random-walk return probabilities
    wl_colors: torch.Tensor  # (b, n) ints (wl_vocab_size)
    rnf: torch.Tensor  # (b, n, rnf_dim) random node features
    de: torch.Tensor  # (b, n, de_dim) distance-encoding counts
    batch: torch.Tensor  # (N,) a flattened batch: the graph of each node, sorted (torch_geometric's Batch)


GRAPH_INPUTS = tuple(GraphInputs.__annotations__)


def graph_forward(forward):
    """``forward(self, node_feat, ..., **inputs: Unpack[GraphInputs])`` with the keys of
    :class:`GraphInputs` as keyword-only parameters (default None) of its signature in place of ``**inputs``,
    and any other keyword refused with ``TypeError``."""
    signature = inspect.signature(forward)
    *named, _ = signature.parameters.values()  # the last is **inputs
    keyword, tensor = inspect.Parameter.KEYWORD_ONLY, "torch.Tensor | None"
    keys = [inspect.Parameter(name, keyword, default=None, annotation=tensor) for name in GRAPH_INPUTS]
    accepted = {parameter.name for parameter in (*named, *keys)}

    @functools.wraps(forward)
    def checked(*args, **kwargs):
        unknown = sorted(kwargs.keys() - accepted)
        if unknown:
            raise TypeError(
                f"{forward.__qualname__}() got an unexpected keyword argument {unknown[0]!r}; the graph "
                f"inputs are {', '.join(GRAPH_INPUTS)} (hf_efficient.models.graph.inputs.GraphInputs)."
            )
        return forward(*args, **kwargs)

    checked.__signature__ = signature.replace(parameters=[*named, *keys])
    return checked
