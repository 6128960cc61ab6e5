"""Graph transforms: exact values on tiny hand-built graphs (path, cycle, two cliques, disconnected parts,
isolated nodes, self loops), equivariance under relabelling, datasets.map, and clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf_efficient.data.graph_transforms import (
    check_graph_record,
    distance_encoding,
    ego_graph,
    graphormer_features,
    laplacian_pe,
    node_degrees,
    random_node_features,
    random_walk_pe,
    shortest_path_distances,
    wl_colors,
)

from .helpers import graph_record


def graph(num_nodes: int, undirected_edges, self_loops=(), node_feat=None) -> dict:
    """An OGB-style record (both directions of each edge) with constant node features unless given."""
    node_feat = node_feat if node_feat is not None else [[1.0]] * num_nodes
    return graph_record(num_nodes, undirected_edges, self_loops, node_feat=node_feat, y=[0])


PATH4 = graph(4, [(0, 1), (1, 2), (2, 3)])
CYCLE5 = graph(5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)])
TWO_CLIQUES = graph(6, [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5), (2, 3)])  # two triangles + bridge 2-3
DISCONNECTED = graph(4, [(0, 1), (2, 3)])
ISOLATED = graph(3, [(0, 1)])  # node 2 has no edge
SELF_LOOP = graph(2, [(0, 1)], self_loops=[0])


def partition(colours) -> list[set[int]]:
    """Nodes grouped by colour, as a sorted list of sets (colour values themselves are hashes)."""
    groups: dict[int, set[int]] = {}
    for node, colour in enumerate(colours):
        groups.setdefault(colour, set()).add(node)
    return sorted(groups.values(), key=min)


def assert_eigenpairs(record, pe, eigvals):
    """Every returned column is a unit eigenvector of L = I - D^-1/2 A D^-1/2 (no self loops), orthogonal."""
    n = record["num_nodes"]
    adj = np.zeros((n, n))
    for s, t in zip(*record["edge_index"], strict=True):
        if s != t:
            adj[s, t] = adj[t, s] = 1
    deg = adj.sum(1)
    inv = np.divide(1, np.sqrt(deg), out=np.zeros(n), where=deg > 0)
    lap = np.eye(n) - inv[:, None] * adj * inv[None]
    pe = np.asarray(pe)
    for column, value in zip(pe.T, eigvals, strict=True):
        np.testing.assert_allclose(lap @ column, value * column, atol=1e-12)
    np.testing.assert_allclose(pe.T @ pe, np.eye(pe.shape[1]), atol=1e-12)


# ---- shortest paths --------------------------------------------------------------------------------------
def test_shortest_paths_path_cycle_cliques():
    assert shortest_path_distances(PATH4)["spatial_pos"] == [[abs(i - j) for j in range(4)] for i in range(4)]
    cycle = [[min(abs(i - j), 5 - abs(i - j)) for j in range(5)] for i in range(5)]
    assert shortest_path_distances(CYCLE5)["spatial_pos"] == cycle
    assert shortest_path_distances(TWO_CLIQUES)["spatial_pos"] == [
        [0, 1, 1, 2, 3, 3],
        [1, 0, 1, 2, 3, 3],
        [1, 1, 0, 1, 2, 2],
        [2, 2, 1, 0, 1, 1],
        [3, 3, 2, 1, 0, 1],
        [3, 3, 2, 1, 1, 0],
    ]


def test_shortest_paths_disconnected_isolated_self_loops():
    far = -1
    assert shortest_path_distances(DISCONNECTED)["spatial_pos"] == [
        [0, 1, far, far],
        [1, 0, far, far],
        [far, far, 0, 1],
        [far, far, 1, 0],
    ]
    assert shortest_path_distances(ISOLATED)["spatial_pos"] == [[0, 1, far], [1, 0, far], [far, far, 0]]
    assert shortest_path_distances(SELF_LOOP)["spatial_pos"] == [[0, 1], [1, 0]]  # a loop is no shortcut


def test_shortest_paths_directed():
    chain = {"edge_index": [[0, 1], [1, 2]], "num_nodes": 3}  # 0 -> 1 -> 2 only
    assert shortest_path_distances(chain, directed=True)["spatial_pos"] == [
        [0, 1, 2],
        [-1, 0, 1],
        [-1, -1, 0],
    ]
    assert shortest_path_distances(chain)["spatial_pos"] == [[0, 1, 2], [1, 0, 1], [2, 1, 0]]


# ---- degrees -----------------------------------------------------------------------------------------------
def test_degrees():
    assert node_degrees(PATH4) == {"in_degree": [1, 2, 2, 1], "out_degree": [1, 2, 2, 1]}
    assert node_degrees(CYCLE5)["in_degree"] == [2] * 5
    assert node_degrees(TWO_CLIQUES)["in_degree"] == [2, 2, 3, 3, 2, 2]
    assert node_degrees(ISOLATED)["in_degree"] == [1, 1, 0]
    assert node_degrees(SELF_LOOP) == {"in_degree": [2, 1], "out_degree": [2, 1]}  # the loop counts once
    directed = {"edge_index": [[0, 0, 0, 1], [1, 2, 2, 2]], "num_nodes": 3}  # duplicate 0 -> 2 counted once
    assert node_degrees(directed) == {"in_degree": [0, 1, 2], "out_degree": [2, 1, 0]}


# ---- random-walk PE ----------------------------------------------------------------------------------------
def test_random_walk_pe_exact():
    np.testing.assert_allclose(
        random_walk_pe(PATH4, k=3)["rw_pe"],
        [[0, 0.5, 0], [0, 0.75, 0], [0, 0.75, 0], [0, 0.5, 0]],
        atol=1e-12,
    )
    # C5: returns after 2 steps 1/2, 3 steps impossible, 4 steps 6/16, 5 steps only all-one-way: 2/32
    np.testing.assert_allclose(
        random_walk_pe(CYCLE5, k=5)["rw_pe"], [[0, 0.5, 0, 3 / 8, 1 / 16]] * 5, atol=1e-12
    )
    two_step = [5 / 12, 5 / 12, 4 / 9, 4 / 9, 5 / 12, 5 / 12]  # e.g. node 0: 1/2 * 1/2 + 1/2 * 1/3
    np.testing.assert_allclose(
        np.asarray(random_walk_pe(TWO_CLIQUES, k=2)["rw_pe"])[:, 1], two_step, atol=1e-12
    )


def test_random_walk_pe_isolated_disconnected_self_loop():
    np.testing.assert_allclose(random_walk_pe(ISOLATED, k=2)["rw_pe"], [[0, 1], [0, 1], [0, 0]], atol=1e-12)
    np.testing.assert_allclose(random_walk_pe(DISCONNECTED, k=2)["rw_pe"], [[0, 1]] * 4, atol=1e-12)
    # A = [[1, 1], [1, 0]]: P = [[1/2, 1/2], [1, 0]], P^2 = [[3/4, 1/4], [1/2, 1/2]]
    np.testing.assert_allclose(random_walk_pe(SELF_LOOP, k=2)["rw_pe"], [[0.5, 0.75], [0, 0.5]], atol=1e-12)


# ---- Laplacian PE ------------------------------------------------------------------------------------------
def test_laplacian_pe_path_exact_vectors():
    out = laplacian_pe(PATH4, k=3)
    np.testing.assert_allclose(out["lap_eigvals"], [0.5, 1.5, 2.0], atol=1e-12)  # 1 - cos(pi m / 3)
    pe = np.asarray(out["lap_pe"])
    r = math.sqrt(2) / 2
    np.testing.assert_allclose(pe[:, 0], np.array([1, r, -r, -1]) / math.sqrt(3), atol=1e-12)
    np.testing.assert_allclose(pe[:, 2], np.array([-1, 2 * r, -2 * r, 1]) / math.sqrt(6), atol=1e-12)
    assert_eigenpairs(PATH4, pe, out["lap_eigvals"])


def test_laplacian_pe_cycle_cliques_degenerate():
    out = laplacian_pe(CYCLE5, k=4)
    first, second = 1 - math.cos(2 * math.pi / 5), 1 - math.cos(4 * math.pi / 5)
    np.testing.assert_allclose(out["lap_eigvals"], [first, first, second, second], atol=1e-12)
    assert_eigenpairs(CYCLE5, out["lap_pe"], out["lap_eigvals"])
    cliques = laplacian_pe(TWO_CLIQUES, k=5)
    assert_eigenpairs(TWO_CLIQUES, cliques["lap_pe"], cliques["lap_eigvals"])
    assert cliques["lap_eigvals"][0] > 0  # connected: one zero eigenvalue, skipped


def test_laplacian_pe_disconnected_isolated_self_loop_padding():
    out = laplacian_pe(DISCONNECTED, k=3)
    np.testing.assert_allclose(out["lap_eigvals"], [0, 2, 2], atol=1e-12)  # second component's zero remains
    assert_eigenpairs(DISCONNECTED, out["lap_pe"], out["lap_eigvals"])
    isolated = laplacian_pe(ISOLATED, k=4)  # L_22 = 1; 3 nodes give 2 vectors, padded to 4
    np.testing.assert_allclose(isolated["lap_eigvals"], [1, 2, 0, 0], atol=1e-12)
    np.testing.assert_allclose(np.asarray(isolated["lap_pe"])[:, 0], [0, 0, 1], atol=1e-12)
    np.testing.assert_allclose(np.asarray(isolated["lap_pe"])[:, 2:], 0)
    loop = laplacian_pe(SELF_LOOP, k=1)  # the self loop is dropped: a single edge, eigenvalues 0, 2
    np.testing.assert_allclose(loop["lap_eigvals"], [2.0], atol=1e-12)
    np.testing.assert_allclose(loop["lap_pe"], [[1 / math.sqrt(2)], [-1 / math.sqrt(2)]], atol=1e-12)


# ---- Weisfeiler-Lehman -------------------------------------------------------------------------------------
def test_wl_colours_partitions():
    assert partition(wl_colors(PATH4)["wl_colors"]) == [{0, 3}, {1, 2}]
    assert partition(wl_colors(CYCLE5)["wl_colors"]) == [{0, 1, 2, 3, 4}]
    assert partition(wl_colors(TWO_CLIQUES)["wl_colors"]) == [{0, 1, 4, 5}, {2, 3}]
    assert partition(wl_colors(DISCONNECTED)["wl_colors"]) == [{0, 1, 2, 3}]
    assert partition(wl_colors(ISOLATED)["wl_colors"]) == [{0, 1}, {2}]
    assert partition(wl_colors(SELF_LOOP)["wl_colors"]) == [
        {0},
        {1},
    ]  # the loop makes node 0 its own neighbour
    assert partition(wl_colors(graph(2, [(0, 1)]))["wl_colors"]) == [{0, 1}]


def test_wl_colours_features_iterations_and_cross_graph():
    features = graph(4, [(0, 1), (1, 2), (2, 3)], node_feat=[[1.0], [2.0], [2.0], [1.0]])
    assert partition(wl_colors(features)["wl_colors"]) == [{0, 3}, {1, 2}]
    lopsided = graph(4, [(0, 1), (1, 2), (2, 3)], node_feat=[[1.0], [2.0], [1.0], [1.0]])
    assert partition(wl_colors(lopsided)["wl_colors"]) == [{0}, {1}, {2}, {3}]
    assert partition(wl_colors(lopsided, use_node_features=False)["wl_colors"]) == [{0, 3}, {1, 2}]
    path6 = graph(6, [(i, i + 1) for i in range(5)])
    assert len(partition(wl_colors(path6, num_iterations=1)["wl_colors"])) == 2  # ends vs inner nodes
    assert partition(wl_colors(path6, num_iterations=2)["wl_colors"]) == [{0, 5}, {1, 4}, {2, 3}]
    # equal structure, equal colours, in any graph: the path inside DISCONNECTED matches a lone edge
    assert wl_colors(DISCONNECTED)["wl_colors"][0] == wl_colors(graph(2, [(0, 1)]))["wl_colors"][0]
    assert all(0 <= c < 2**31 for c in wl_colors(TWO_CLIQUES)["wl_colors"])


# ---- random node features, distance encoding, ego graphs ----------------------------------------------
def test_random_node_features_fixed_per_graph_and_seed():
    first = np.asarray(random_node_features(TWO_CLIQUES, k=5, seed=3)["rnf"])
    assert first.shape == (6, 5)
    np.testing.assert_array_equal(random_node_features(TWO_CLIQUES, k=5, seed=3)["rnf"], first)  # fixed
    assert not np.allclose(random_node_features(TWO_CLIQUES, k=5, seed=4)["rnf"], first)  # the seed matters
    assert not np.allclose(random_node_features(CYCLE5, k=5, seed=3)["rnf"][:5], first[:5])  # and the graph
    relabelled = {**TWO_CLIQUES, "edge_index": np.asarray(TWO_CLIQUES["edge_index"])[::-1].tolist()}
    assert not np.allclose(random_node_features(relabelled, k=5, seed=3)["rnf"], first)
    many = np.asarray(random_node_features(graph(2000, [(0, 1)]), k=4, seed=0)["rnf"])
    assert abs(many.mean()) < 0.05 and abs(many.std() - 1) < 0.05  # standard normal
    with pytest.raises(ValueError, match="k must be"):
        random_node_features(PATH4, k=0)


def test_distance_encoding_counts_capped_hops_to_the_targets():
    """PATH4 0-1-2-3 with buckets 0, 1, 2 and "farther": one target (a node task's centre), then a link."""
    de = distance_encoding(PATH4, max_distance=2, target_nodes=[0])["de"]
    assert de == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    link = distance_encoding(PATH4, max_distance=2, target_nodes=[0, 3])["de"]
    assert link == [[1, 0, 0, 1], [0, 1, 1, 0], [0, 1, 1, 0], [1, 0, 0, 1]]  # rows sum to |S| = 2
    apart = distance_encoding({**DISCONNECTED, "target_nodes": [1]}, max_distance=3)["de"]  # column read
    assert apart == [[0, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 1], [0, 0, 0, 0, 1]]  # unreachable: last
    perm = np.array([3, 1, 0, 2])  # new node i is old node perm[i]; target 0 becomes node 2
    inverse = np.argsort(perm)
    relabelled = {"edge_index": inverse[np.asarray(PATH4["edge_index"])].tolist(), "num_nodes": 4}
    moved = distance_encoding(relabelled, max_distance=2, target_nodes=[int(inverse[0])])["de"]
    assert moved == np.asarray(de)[perm].tolist()  # equivariant when the targets move with the nodes
    with pytest.raises(ValueError, match="target node set"):
        distance_encoding(PATH4)
    with pytest.raises(ValueError, match="target_nodes must be"):
        distance_encoding(PATH4, target_nodes=[4])
    with pytest.raises(ValueError, match="max_distance"):
        distance_encoding(PATH4, max_distance=-1, target_nodes=[0])


def test_ego_graph_keeps_the_neighbourhood_with_its_centre_first():
    record = {
        **TWO_CLIQUES,
        "y": [10, 11, 12, 13, 14, 15],
        "edge_attr": [[float(i)] for i in range(len(TWO_CLIQUES["edge_index"][0]))],
    }
    one_hop = ego_graph(record, node=2, num_hops=1)
    assert one_hop["nodes"] == [2, 0, 1, 3] and one_hop["target_nodes"] == [0] and one_hop["y"] == 12
    pairs = list(zip(*TWO_CLIQUES["edge_index"], strict=True))  # each directed edge once
    kept = [(one_hop["nodes"][s], one_hop["nodes"][t]) for s, t in zip(*one_hop["edge_index"], strict=True)]
    assert sorted(kept) == sorted((s, t) for s, t in pairs if s in (0, 1, 2, 3) and t in (0, 1, 2, 3))
    assert one_hop["edge_attr"] == [
        record["edge_attr"][pairs.index(pair)] for pair in kept
    ]  # features follow
    assert ego_graph(record, node=0, num_hops=2)["nodes"] == [0, 1, 2, 3]
    assert distance_encoding(one_hop, max_distance=1)["de"][0] == [1, 0, 0]  # the centre is the target
    with pytest.raises(ValueError, match="node must be"):
        ego_graph(record, node=6)


# ---- equivariance, datasets.map, errors ----------------------------------------------------------------
def test_transforms_are_permutation_equivariant():
    perm = np.array([4, 2, 0, 5, 1, 3])  # new node i is old node perm[i]
    inverse = np.argsort(perm)
    relabelled = {
        "edge_index": inverse[np.asarray(TWO_CLIQUES["edge_index"])].tolist(),
        "num_nodes": 6,
        "node_feat": np.asarray(TWO_CLIQUES["node_feat"])[perm].tolist(),
    }
    spd = np.asarray(shortest_path_distances(TWO_CLIQUES)["spatial_pos"])
    assert shortest_path_distances(relabelled)["spatial_pos"] == spd[perm][:, perm].tolist()
    assert (
        node_degrees(relabelled)["in_degree"]
        == np.asarray(node_degrees(TWO_CLIQUES)["in_degree"])[perm].tolist()
    )
    rw = np.asarray(random_walk_pe(TWO_CLIQUES, k=4)["rw_pe"])
    np.testing.assert_allclose(random_walk_pe(relabelled, k=4)["rw_pe"], rw[perm], atol=1e-12)
    assert (
        wl_colors(relabelled)["wl_colors"] == np.asarray(wl_colors(TWO_CLIQUES)["wl_colors"])[perm].tolist()
    )


def test_dataset_map_adds_columns():
    datasets = pytest.importorskip("datasets")
    records = [{key: PATH4[key] for key in ("edge_index", "num_nodes", "node_feat", "y")}] * 2
    dataset = datasets.Dataset.from_list(records).map(graphormer_features)
    dataset = (
        dataset.map(laplacian_pe, fn_kwargs={"k": 2}).map(random_walk_pe, fn_kwargs={"k": 3}).map(wl_colors)
    )
    dataset = dataset.map(random_node_features, fn_kwargs={"k": 3, "seed": 7}).map(
        distance_encoding, fn_kwargs={"max_distance": 1, "target_nodes": [1]}
    )
    row = dataset[1]
    assert row["rnf"] == dataset[0]["rnf"] == random_node_features(PATH4, k=3, seed=7)["rnf"]
    assert row["de"] == [[0, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert row["spatial_pos"][0] == [0, 1, 2, 3] and row["in_degree"] == [1, 2, 2, 1]
    assert len(row["lap_pe"]) == 4 and len(row["lap_pe"][0]) == 2 and len(row["rw_pe"][0]) == 3
    assert row["wl_colors"] == wl_colors(PATH4)["wl_colors"]


def test_malformed_records_raise():
    with pytest.raises(ValueError, match="node ids in"):
        shortest_path_distances({"edge_index": [[0, 3], [1, 0]], "num_nodes": 3})
    with pytest.raises(ValueError, match="node_feat has 2 rows"):
        check_graph_record({"edge_index": [[0], [1]], "num_nodes": 3, "node_feat": [[1.0], [1.0]]})
    with pytest.raises(ValueError, match="edge_index must be"):
        node_degrees({"edge_index": [[0], [1], [2]], "num_nodes": 3})
    with pytest.raises(ValueError, match="num_nodes or node_feat"):
        node_degrees({"edge_index": [[0], [1]]})
    with pytest.raises(ValueError, match="k must be"):
        laplacian_pe(PATH4, k=0)
    empty = {"edge_index": [[], []], "num_nodes": 2}
    assert shortest_path_distances(empty)["spatial_pos"] == [[0, -1], [-1, 0]]
