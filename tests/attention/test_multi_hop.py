"""multi_hop (MAGNA diffusion): exact limits (alpha = 1, K = 0, K = 1), dense float64 oracles for the
truncated sum and the K -> infinity inverse with dot-product and MAGNA's GAT scores, the returned diffusion
matrix, gradients, and errors."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from hf_efficient.attention import GraphEdges

from .helpers import (
    adjacency_to_edges,
    assert_bfloat16_keeps_dtype,
    assert_dropout_only_in_training,
    make_core,
    make_qkv,
    random_adjacency,
    reference_attention,
)

# (b, n, n) bool [graph, target, source]: random edges + self loops, node 0 without incoming edges
adjacency = partial(random_adjacency, p=0.3, isolate_first=True)


def dense_one_hop(q, k, adj) -> torch.Tensor:
    """(b, h, n, n) float64 one-hop attention A (rows of nodes without in-edges are 0)."""
    scores = q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~adj[:, None], float("-inf")), -1).nan_to_num(0.0)


def dense_magna_one_hop(q, k, adj, core, edges=None) -> torch.Tensor:
    """(b, h, n, n) float64 one-hop attention of MAGNA's score, written out densely: the softmax over in-edges
    of LeakyReLU(a_dst . tanh(q_i) + a_src . tanh(k_j) + a_e . tanh(W_e x_ij)) + log w_ij."""
    a_dst, a_src = core.att_dst.detach().double(), core.att_src.detach().double()
    target = (torch.tanh(q.double()) * a_dst[None, :, None]).sum(-1)  # (b, h, n)
    source = (torch.tanh(k.double()) * a_src[None, :, None]).sum(-1)
    scores = target[..., :, None] + source[..., None, :]  # (b, h, target, source)
    n = q.shape[2]
    if edges is not None and edges.edge_attr is not None:
        projected = torch.tanh(core.edge_projection(edges.edge_attr).detach().double())  # (E, h d)
        per_edge = (projected.view(-1, *core.att_edge.shape) * core.att_edge.detach().double()).sum(-1)
        src, tgt = edges.edge_index
        edge_term = torch.zeros_like(scores)
        edge_term[tgt // n, :, tgt % n, src % n] = per_edge
        scores = scores + edge_term
    scores = F.leaky_relu(scores, 0.2)
    if edges is not None and edges.edge_weight is not None:
        src, tgt = edges.edge_index
        log_w = torch.zeros_like(scores)
        log_w[tgt // n, :, tgt % n, src % n] = edges.edge_weight.double().log()[:, None]
        scores = scores + log_w
    return torch.softmax(scores.masked_fill(~adj[:, None], float("-inf")), -1).nan_to_num(0.0)


def diffusion_matrix(a: torch.Tensor, alpha: float, hops: int) -> torch.Tensor:
    """T = sum_{k < K} alpha (1 - alpha)^k A^k + (1 - alpha)^K A^K, with explicit matrix powers."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype).expand_as(a)
    out, power = torch.zeros_like(a), eye
    for step in range(hops):
        out = out + alpha * (1 - alpha) ** step * power
        power = a @ power  # A^{step + 1}
    return out + (1 - alpha) ** hops * power


def truncated_oracle(q, k, v, adj, alpha, hops) -> torch.Tensor:
    """sum_{k < K} alpha (1 - alpha)^k A^k V + (1 - alpha)^K A^K V, with explicit matrix powers."""
    return diffusion_matrix(dense_one_hop(q, k, adj), alpha, hops) @ v.double()


def test_alpha_one_and_zero_hops_return_values():
    q, k, v = make_qkv(b=2, n=11)
    edges = adjacency_to_edges(adjacency(2, 11, seed=0))
    torch.testing.assert_close(make_core("multi_hop", alpha=1.0, num_hops=4)(q, k, v, edges=edges).output, v)
    torch.testing.assert_close(make_core("multi_hop", alpha=0.3, num_hops=0)(q, k, v, edges=edges).output, v)


def test_one_hop_is_scaled_graph_sparse_plus_teleport():
    """K = 1: Z_1 = (1 - alpha) A V + alpha V = (1 - alpha) graph_sparse(q, k, v) + alpha V, edge features
    and weights included."""
    q, k, v = make_qkv(b=2, n=13, seed=1)
    edges = adjacency_to_edges(adjacency(2, 13, seed=2))
    g = torch.Generator().manual_seed(3)
    edges = GraphEdges(
        edges.edge_index,
        edge_weight=torch.rand(edges.num_edges, generator=g) + 0.2,
        edge_attr=torch.randn(edges.num_edges, 3, generator=g),
    )
    sparse = make_core("graph_sparse", edge_dim=3)
    torch.nn.init.normal_(sparse.edge_projection.weight, std=0.5)
    hop = make_core("multi_hop", edge_dim=3, alpha=0.25, num_hops=1)
    hop.load_state_dict(sparse.state_dict())
    expected = 0.75 * sparse(q, k, v, edges=edges).output + 0.25 * v
    torch.testing.assert_close(hop(q, k, v, edges=edges).output, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("alpha, hops", [(0.15, 3), (0.5, 6)])
def test_matches_truncated_diffusion_oracle(alpha, hops):
    q, k, v = make_qkv(b=2, n=17, seed=4)
    adj = adjacency(2, 17, seed=5)
    out = make_core("multi_hop", alpha=alpha, num_hops=hops)(q, k, v, edges=adjacency_to_edges(adj)).output
    torch.testing.assert_close(
        out.double(), truncated_oracle(q, k, v, adj, alpha, hops), atol=1e-5, rtol=1e-5
    )
    one_hop = reference_attention(q, k, v, allowed=adj[:, None])
    assert not torch.allclose(out.double(), one_hop, atol=1e-3), "hops beyond one must change the output"


def test_many_hops_converge_to_personalised_pagerank():
    """K -> infinity: alpha (I - (1 - alpha) A)^{-1} V (the tail (1 - alpha)^K A^K V vanishes)."""
    q, k, v = make_qkv(b=1, n=9, seed=6)
    adj = adjacency(1, 9, seed=7)
    alpha = 0.4
    out = make_core("multi_hop", alpha=alpha, num_hops=60)(q, k, v, edges=adjacency_to_edges(adj)).output
    a = dense_one_hop(q, k, adj)
    eye = torch.eye(9, dtype=torch.float64)
    expected = alpha * torch.linalg.solve(eye - (1 - alpha) * a, v.double())
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_isolated_node_keeps_alpha_value():
    q, k, v = make_qkv(b=1, n=8, seed=8)
    out = make_core("multi_hop", alpha=0.3, num_hops=3)(
        q, k, v, edges=adjacency_to_edges(adjacency(1, 8, seed=9))
    ).output
    torch.testing.assert_close(out[:, :, 0], 0.3 * v[:, :, 0])


def test_gradients_match_dense_oracle():
    q, k, v = make_qkv(b=2, n=10, seed=10, requires_grad=True)
    adj = adjacency(2, 10, seed=11)
    out = make_core("multi_hop", alpha=0.2, num_hops=3)(q, k, v, edges=adjacency_to_edges(adj)).output
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(12))
    grads = torch.autograd.grad((out * cotangent).sum(), [q, k, v])
    expected = truncated_oracle(q, k, v, adj, 0.2, 3)
    expected_grads = torch.autograd.grad((expected * cotangent.double()).sum(), [q, k, v])
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=1e-4)


def test_dropout_in_training_only():
    q, k, v = make_qkv(b=1, n=12, seed=13)
    edges = adjacency_to_edges(adjacency(1, 12, seed=14))
    core = make_core("multi_hop")
    core.spec = type(core.spec)(num_heads=2, head_dim=8, dropout=0.5)
    assert_dropout_only_in_training(core, q, k, v, edges=edges)


def test_bfloat16_inputs_keep_their_dtype():
    q, k, v = make_qkv(b=1, n=14, seed=16)
    edges = adjacency_to_edges(adjacency(1, 14, seed=17))
    assert_bfloat16_keeps_dtype(make_core("multi_hop"), q, k, v, edges=edges)


def test_errors_name_multi_hop():
    with pytest.raises(ValueError, match="alpha"):
        make_core("multi_hop", alpha=0.0)
    with pytest.raises(ValueError, match="num_hops"):
        make_core("multi_hop", num_hops=-1)
    q, k, v = make_qkv(b=1, n=6)
    edges = adjacency_to_edges(adjacency(1, 6, seed=15))
    with pytest.raises(ValueError, match="multi_hop was built with"):
        make_core("multi_hop", edge_dim=2)(q, k, v, edges=edges)
    with pytest.raises(ValueError, match="needs `edges`"):
        make_core("multi_hop")(q, k, v)


@pytest.mark.parametrize("alpha, hops", [(0.15, 3), (0.5, 5)])
def test_gat_score_matches_magna_oracle_with_edge_features_and_weights(alpha, hops):
    """score="gat" (MAGNA as published): the diffusion of its additive tanh scores, forward and gradients."""
    q, k, v = make_qkv(b=2, n=12, seed=18, requires_grad=True)
    adj = adjacency(2, 12, seed=19)
    edges = adjacency_to_edges(adj)
    g = torch.Generator().manual_seed(20)
    edges = GraphEdges(
        edges.edge_index,
        edge_weight=torch.rand(edges.num_edges, generator=g) + 0.2,
        edge_attr=torch.randn(edges.num_edges, 3, generator=g),
    )
    core = make_core("multi_hop", score="gat", edge_dim=3, alpha=alpha, num_hops=hops)
    out = core(q, k, v, edges=edges).output
    a = dense_magna_one_hop(q, k, adj, core, edges)
    expected = diffusion_matrix(a, alpha, hops) @ v.double()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    dot = make_core("multi_hop", alpha=alpha, num_hops=hops)(q, k, v, edges=GraphEdges(edges.edge_index))
    assert not torch.allclose(out, dot.output, atol=1e-3), "the score must matter"

    cotangent = torch.randn(out.shape, generator=g)
    grads = torch.autograd.grad((out * cotangent).sum(), [q, k, v])
    expected_grads = torch.autograd.grad((expected * cotangent.double()).sum(), [q, k, v])
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("score", ["dot", "gat"])
def test_returned_weights_are_the_diffusion_matrix(score):
    """output_attentions returns T (dense (b, h, n, n)) with out = T V; the isolated node 0 keeps alpha of
    itself and nothing else."""
    q, k, v = make_qkv(b=2, n=10, seed=21)
    adj = adjacency(2, 10, seed=22)
    core = make_core("multi_hop", score=score, alpha=0.3, num_hops=4)
    out, weights = core(q, k, v, edges=adjacency_to_edges(adj), output_attentions=True)
    a = dense_one_hop(q, k, adj) if score == "dot" else dense_magna_one_hop(q, k, adj, core)
    expected = diffusion_matrix(a, 0.3, 4)
    assert not weights.is_sparse and weights.shape == (2, 2, 10, 10)
    torch.testing.assert_close(weights.double(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out, weights @ v, atol=1e-5, rtol=1e-5)
    isolated = torch.zeros(10)
    isolated[0] = 0.3
    torch.testing.assert_close(weights[:, :, 0], isolated.expand(2, 2, 10))


def test_gat_score_errors():
    with pytest.raises(ValueError, match="score"):
        make_core("multi_hop", score="cosine")
    with pytest.raises(ValueError, match="negative_slope"):
        make_core("multi_hop", score="gat", negative_slope=float("nan"))
