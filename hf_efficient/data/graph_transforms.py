"""Graph structure as data transforms: each function takes one OGB-style record and returns new columns.

Positional encodings: Laplacian eigenvectors, random-walk return probabilities, random node features and
distance encoding (the four of the graph-transformer lecture), plus Weisfeiler-Lehman colours, degrees and
shortest paths (Graphormer).

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

from ..errors import InputError
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
        raise InputError(f"k must be >= 1, got {k}.")
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
        raise InputError(f"k must be >= 1, got {k}.")
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


def graph_fingerprint(example: dict[str, Any]) -> int:
    """A process-independent 64-bit hash of a record's graph: node count, edges and node features (equal
    records give equal fingerprints; relabelling the nodes gives another)."""
    edge_index, n = check_graph_record(example)
    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.int64(n).tobytes())
    digest.update(np.ascontiguousarray(edge_index, dtype=np.int64).tobytes())
    if example.get("node_feat") is not None:
        digest.update(np.ascontiguousarray(example["node_feat"], dtype=np.float64).tobytes())
    return int.from_bytes(digest.digest(), "little")


def random_node_features(example: dict[str, Any], k: int = 8, seed: int = 0) -> dict[str, list]:
    """Random node features (Sato et al. 2021, Random Features Strengthen Graph Neural Networks; Abboud et al.
    2021): k standard-normal values per node, fixed per graph.

    A message-passing or attention layer cannot tell apart nodes whose neighbourhoods look alike (1-WL);
    a random identity per node can, and the model learns what is invariant across draws. The draw is
    a function of ``seed`` and the graph (:func:`graph_fingerprint`), so ``datasets.map`` caches it and
    every run sees the same values: *fixed per graph*. For a *fresh* draw each time a graph is seen in
    training (every epoch), keep ``rnf_resample=True`` in :class:`~hf_efficient.EfficientGraphConfig`
    (the default): the model then replaces the column by new standard-normal values in training mode
    (from torch's generator, which ``Trainer`` seeds) and reads this fixed draw in evaluation.

    Not permutation-equivariant by design: a relabelled graph gets other features (the model is only
    equivariant in distribution).

    Returns:
        ``{"rnf": [N][k]}`` floats.
    """
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}.")
    _, n = check_graph_record(example)
    rng = np.random.default_rng([seed, graph_fingerprint(example)])
    return {"rnf": rng.standard_normal((n, k)).tolist()}


def distance_encoding(
    example: dict[str, Any], max_distance: int = 3, target_nodes: list[int] | None = None
) -> dict[str, list]:
    """Distance encoding (Li et al. 2020, Distance Encoding: Design Provably More Powerful Neural Networks
    for Graph Representation Learning): each node's shortest-path distances to a target node set S.

    For a link (u, v), S = {u, v}; for a node task, S = the node to classify, on its ego graph
    (:func:`ego_graph` builds those records with ``target_nodes=[0]``). DE-GNN's encoding of node w is
    the sum over s in S of a one-hot of the hop count d(w, s) capped at ``max_distance``, with one more
    bucket for "farther or unreachable": a row of counts of width ``max_distance + 2`` that the model
    projects linearly (``de_dim``), i.e. the sum of one learned vector per (target, distance) bucket.
    Distances follow edges in both directions (undirected, as the other transforms).

    Args:
        max_distance: the largest hop count with a bucket of its own (>= 0).
        target_nodes: S; None reads the record's ``target_nodes`` column.

    Returns:
        ``{"de": [N][max_distance + 2]}`` floats (counts; each row sums to |S|).
    """
    if max_distance < 0:
        raise InputError(f"max_distance must be >= 0, got {max_distance}.")
    targets = target_nodes if target_nodes is not None else example.get("target_nodes")
    if targets is None or len(targets) == 0:
        raise InputError(
            "distance_encoding needs a target node set: a 'target_nodes' column (the two ends of a link, or "
            "the centre of an ego graph from ego_graph) or target_nodes=[...]."
        )
    _, n = check_graph_record(example)
    targets = np.asarray(targets, dtype=np.int64)
    if targets.min() < 0 or targets.max() >= n:
        raise InputError(f"target_nodes must be node ids in [0, {n}), got {targets.tolist()}.")
    adj = adjacency(example)
    dist = csgraph.shortest_path(adj, method="D", unweighted=True, indices=targets)  # (|S|, N), inf apart
    buckets = np.where(np.isfinite(dist), np.minimum(dist, max_distance + 1), max_distance + 1).astype(
        np.int64
    )
    counts = np.zeros((n, max_distance + 2))
    np.add.at(counts, (np.broadcast_to(np.arange(n), buckets.shape), buckets), 1.0)
    return {"de": counts.tolist()}


def ego_graph(example: dict[str, Any], node: int, num_hops: int = 2) -> dict[str, Any]:
    """The subgraph within ``num_hops`` hops (either direction) of ``node``, as a record whose node 0 is
    ``node`` (``target_nodes=[0]``): a node task as graph classification of ego graphs (DE-GNN's setting).

    Node ids keep their order after the centre; edges between kept nodes are kept with their features;
    ``y`` becomes the centre's label when the record has a label per node.

    Returns:
        A record: ``edge_index``, ``num_nodes``, ``node_feat``, ``edge_attr`` (if any), ``y`` (if any),
        ``target_nodes`` [0] and ``nodes`` (the kept nodes' ids in the original graph).
    """
    edge_index, n = check_graph_record(example)
    if not 0 <= node < n:
        raise InputError(f"node must be in [0, {n}), got {node}.")
    dist = csgraph.shortest_path(adjacency(example), method="D", unweighted=True, indices=[node])[0]
    others = np.flatnonzero((dist <= num_hops) & (np.arange(n) != node))
    kept = np.concatenate([[node], others]).astype(np.int64)  # (M,): centre first
    new_id = np.full(n, -1, dtype=np.int64)
    new_id[kept] = np.arange(kept.size)
    inside = (new_id[edge_index[0]] >= 0) & (new_id[edge_index[1]] >= 0)  # (E,)
    record: dict[str, Any] = {
        "edge_index": new_id[edge_index[:, inside]].tolist(),
        "num_nodes": int(kept.size),
        "target_nodes": [0],
        "nodes": kept.tolist(),
    }
    if example.get("node_feat") is not None:
        record["node_feat"] = np.asarray(example["node_feat"])[kept].tolist()
    if example.get("edge_attr") is not None:
        record["edge_attr"] = np.asarray(example["edge_attr"])[inside].tolist()
    label = example.get("y")
    if label is not None:
        label = np.asarray(label)
        record["y"] = label[node].tolist() if label.ndim >= 1 and label.shape[0] == n else label.tolist()
    return record


def graphormer_features(example: dict[str, Any]) -> dict[str, list]:
    """Everything Graphormer's bias and centrality encoding read: shortest paths and degrees."""
    return {**shortest_path_distances(example), **node_degrees(example)}


__all__ = [
    "UNREACHABLE",
    "adjacency",
    "check_graph_record",
    "distance_encoding",
    "ego_graph",
    "graph_fingerprint",
    "graphormer_features",
    "laplacian_pe",
    "node_degrees",
    "random_node_features",
    "random_walk_pe",
    "shortest_path_distances",
    "wl_colors",
]
