"""Graph structure as data transforms: each function takes one OGB-style record and returns new columns.

A record (:mod:`hf_efficient.models.graph.records`) is a dict with ``edge_index`` [2][E] (row 0 = source,
row 1 = target), ``node_feat`` [N][F], optional ``edge_attr`` [E][Fe], ``num_nodes`` N and a label ``y``.
Every transform returns a dict of new columns of plain Python lists, so ``datasets.Dataset.map`` caches it::

    dataset = dataset.map(shortest_path_distances).map(node_degrees)
    dataset = dataset.map(laplacian_pe, fn_kwargs={"k": 8})

Conventions (the same for every transform, so they agree with each other):
    * the structure is the *undirected simple graph* of the edges: both directions count, duplicate edges
      collapse to one (OGB already stores both directions); only :func:`node_degrees` keeps the direction;
    * self loops are kept (a walk may stay on a node, a node is its own WL neighbour) except in the
      Laplacian, whose normalisation would otherwise change; a self loop never changes a distance;
    * nodes are matrix rows in record order, so every output is permutation-equivariant: relabelling the
      nodes of a record relabels the outputs (up to Laplacian eigenvector signs and degenerate eigenspaces,
      see :func:`laplacian_pe`).

Shapes: N = nodes, E = edges, k = encoding width.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from scipy import sparse
from scipy.sparse import csgraph

from ..models.graph.records import check_graph_record

UNREACHABLE = -1  # shortest-path distance of a pair in different connected components


def adjacency(example: dict[str, Any], directed: bool = False) -> sparse.csr_array:
    """(N, N) 0/1 CSR adjacency, A[source, target] = 1; symmetric unless ``directed``."""
    edge_index, n = check_graph_record(example)
    source, target = edge_index
    if not directed:
        source, target = np.concatenate([source, target]), np.concatenate([target, source])
    adj = sparse.csr_array((np.ones(source.size), (source, target)), shape=(n, n))
    adj.data[:] = 1.0  # duplicates were summed: collapse them
    return adj


def shortest_path_distances(example: dict[str, Any], directed: bool = False) -> dict[str, list]:
    """Hop counts between every pair of nodes (Graphormer's spatial encoding input).

    Uses ``scipy.sparse.csgraph.shortest_path`` (Dijkstra on unit weights), O(N (N + E) log N) time, O(N^2)
    output.

    Returns:
        ``{"spatial_pos": [N][N]}`` ints: spatial_pos[i][j] = hops from i to j, 0 on the diagonal,
        :data:`UNREACHABLE` (-1) between components. With ``directed`` the hops follow edge direction.
    """
    adj = adjacency(example, directed=directed)
    dist = csgraph.shortest_path(adj, method="D", directed=directed, unweighted=True)  # (N, N), inf apart
    dist[~np.isfinite(dist)] = UNREACHABLE
    return {"spatial_pos": dist.astype(np.int64).tolist()}


def node_degrees(example: dict[str, Any]) -> dict[str, list]:
    """In- and out-degree of every node (Graphormer's centrality encoding input).

    Counts distinct neighbours along the edges' direction (duplicate edges once; a self loop counts once
    in each). For an undirected graph stored in both directions (OGB) both are the degree.

    Returns:
        ``{"in_degree": [N], "out_degree": [N]}`` ints.
    """
    adj = adjacency(example, directed=True)  # A[source, target]
    return {
        "in_degree": np.asarray(adj.sum(axis=0)).astype(np.int64).tolist(),  # column sums: incoming
        "out_degree": np.asarray(adj.sum(axis=1)).astype(np.int64).tolist(),
    }


def laplacian_pe(example: dict[str, Any], k: int = 8) -> dict[str, list]:
    """Laplacian eigenvector positional encoding (Dwivedi & Bresson 2021; PyG's AddLaplacianEigenvectorPE).

    Eigenvectors of the symmetric normalised Laplacian L = I - D^-1/2 A D^-1/2 (self loops dropped, an
    isolated node has L_ii = 1), sorted by eigenvalue; the first (trivial, eigenvalue 0) is skipped and the
    next k are kept; graphs with fewer than k + 1 nodes are padded with zero columns. Dense
    ``numpy.linalg.eigh``, O(N^3): meant for molecules and other small graphs.

    Eigenvectors have no canonical sign (and no canonical basis inside a repeated eigenvalue). This
    transform fixes a sign (largest-magnitude entry positive) so the cached column is deterministic; the
    model must not rely on it, so :class:`~hf_efficient.EfficientGraphModel` flips each eigenvector of each
    graph by a random sign in training mode (``lap_pe_sign_flip``, on by default; Dwivedi & Bresson 2021).
    Because of this ambiguity a model reading ``lap_pe`` is not exactly permutation-equivariant.

    Returns:
        ``{"lap_pe": [N][k], "lap_eigvals": [k]}`` floats (zero-padded).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")
    adj = adjacency(example).toarray()  # (N, N)
    np.fill_diagonal(adj, 0.0)  # self loops dropped
    n = adj.shape[0]
    laplacian = csgraph.laplacian(adj, normed=True)  # isolated nodes: row of zeros
    laplacian[np.diag_indices(n)] = 1.0  # PyG's convention: L_ii = 1 for every node, isolated ones too
    eigvals, eigvecs = np.linalg.eigh(laplacian)  # ascending
    eigvals, eigvecs = eigvals[1 : k + 1], eigvecs[:, 1 : k + 1]  # (m,), (N, m), m = min(k, N - 1)
    if eigvecs.size:
        magnitude = np.abs(eigvecs)  # (N, m); ties (up to rounding) go to the first row
        rows = (magnitude >= magnitude.max(axis=0) - 1e-9).argmax(axis=0)  # (m,)
        eigvecs = eigvecs * np.sign(eigvecs[rows, np.arange(eigvecs.shape[1])])  # largest entry positive
    pe = np.zeros((n, k))
    pe[:, : eigvecs.shape[1]] = eigvecs
    values = np.zeros(k)
    values[: eigvals.size] = eigvals
    return {"lap_pe": pe.tolist(), "lap_eigvals": values.tolist()}


def random_walk_pe(example: dict[str, Any], k: int = 8) -> dict[str, list]:
    """Random-walk positional encoding (Dwivedi et al. 2022, RWPE): return probabilities of t-step walks.

    With P = D^-1 A (row-stochastic, undirected, self loops kept; an isolated node has a zero row),
    rw_pe[i][t - 1] = (P^t)_ii for t = 1..k, by k sparse products (P^t fills in towards N x N as t grows).

    Returns:
        ``{"rw_pe": [N][k]}`` floats.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")
    adj = adjacency(example)
    degree = np.asarray(adj.sum(axis=1)).ravel()  # (N,)
    inverse = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
    walk = adj.multiply(inverse[:, None]).tocsr()  # (N, N) row-stochastic: row i scaled by 1 / deg(i)
    power = walk
    columns = [power.diagonal()]  # (N,) for t = 1
    for _ in range(k - 1):
        power = power @ walk  # P^t
        columns.append(power.diagonal())
    return {"rw_pe": np.stack(columns, axis=1).tolist()}  # (N, k)


def _colour_hash(text: str) -> int:
    """A process-independent 31-bit hash (Python's ``hash`` of a str changes between processes)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little") & 0x7FFFFFFF


def wl_colors(
    example: dict[str, Any], num_iterations: int = 3, use_node_features: bool = True
) -> dict[str, list]:
    """Weisfeiler-Lehman colour refinement (1-WL): a structural role per node, comparable across graphs.

    Initial colour: a hash of the node's feature row (or the same colour for every node). Each iteration
    sets c_i <- hash(c_i, sorted multiset of neighbour colours) on the undirected graph (a self loop makes
    a node its own neighbour). Colours are deterministic hashes, so equal structure gives equal colours in
    any graph and any process; the model embeds them modulo its ``wl_vocab_size``.

    Returns:
        ``{"wl_colors": [N]}`` non-negative ints below 2^31.
    """
    adj = adjacency(example)
    n = adj.shape[0]
    node_feat = example.get("node_feat")
    if use_node_features and node_feat is not None:
        colours = [_colour_hash(repr([float(x) for x in np.ravel(row)])) for row in node_feat]
    else:
        colours = [_colour_hash("")] * n
    neighbours = np.split(adj.indices, adj.indptr[1:-1])  # per node, sorted CSR columns
    for _ in range(num_iterations):
        colours = [
            _colour_hash(f"{colours[i]}|{sorted(colours[j] for j in neighbours[i])}") for i in range(n)
        ]
    return {"wl_colors": colours}


def graphormer_features(example: dict[str, Any]) -> dict[str, list]:
    """Everything Graphormer's bias and centrality encoding read: shortest paths and degrees."""
    return {**shortest_path_distances(example), **node_degrees(example)}


__all__ = [
    "UNREACHABLE",
    "adjacency",
    "check_graph_record",
    "graphormer_features",
    "laplacian_pe",
    "node_degrees",
    "random_walk_pe",
    "shortest_path_distances",
    "wl_colors",
]
