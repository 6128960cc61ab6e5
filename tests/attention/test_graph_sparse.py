"""graph_sparse: softmax over graph edges against dense float64 oracles, gradients, and error cases."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from hf_efficient.attention import AttentionSpec, GraphEdges, build_attention
from hf_efficient.attention.kernels.edges import EdgePattern, _EdgeAggregate, _EdgeScores, _EdgeSoftmax

from .helpers import (
    adjacency_to_edges,
    assert_bfloat16_keeps_dtype,
    assert_dropout_only_in_training,
    make_core,
    make_qkv,
    random_adjacency,
    reference_attention,
)

# (b, n, n) bool [graph, target, source], self loops except on node 0 of each graph (kept isolated)
random_graph = partial(random_adjacency, isolate_first=True)


def dense_oracle(q, k, v, adj, weight=None, feature=None, mode="multiply"):
    """Float64 dense graph attention. weight, feature: (b, h|1, n, n) values on the edges of adj."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5  # (b, h, n, n)
    if feature is not None:
        scores = scores * feature if mode == "multiply" else scores + feature
    if weight is not None:
        scores = scores + weight.log()
    scores = scores.masked_fill(~adj[:, None], float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0) @ v


def edge_values_to_dense(edges: GraphEdges, values: torch.Tensor, b: int, n: int) -> torch.Tensor:
    """(E, c) per-edge values -> (b, c, n, n) dense [graph, channel, target, source] (1 off the edges)."""
    src, tgt = edges.edge_index
    dense = torch.ones(b, values.shape[1], n, n, dtype=values.dtype)
    dense[tgt // n, :, tgt % n, src % n] = values
    return dense


def test_complete_graph_equals_full_attention_with_padding():
    q, k, v = make_qkv(b=2, n=21)
    mask = torch.ones(2, 21, dtype=torch.bool)
    mask[1, 14:] = False
    adj = mask[:, :, None] & mask[:, None, :]  # all pairs of real nodes
    out = make_core("graph_sparse")(q, k, v, attention_mask=mask, edges=adjacency_to_edges(adj)).output
    full = build_attention("full", AttentionSpec(2, 8)).eval()(q, k, v, attention_mask=mask).output
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-5)
    real = mask[:, None, :, None].expand_as(out)
    expected = reference_attention(q, k, v, mask)
    torch.testing.assert_close(out.double()[real], expected[real], atol=1e-5, rtol=1e-5)
    assert (out[~real] == 0).all()


def test_random_graph_with_edge_weights_matches_oracle():
    q, k, v = make_qkv(b=2, n=19, seed=3)
    adj = random_graph(2, 19, seed=1)
    edges = adjacency_to_edges(adj)
    out = make_core("graph_sparse")(q, k, v, edges=edges).output
    torch.testing.assert_close(
        out.double(), reference_attention(q, k, v, allowed=adj[:, None]), atol=1e-5, rtol=1e-5
    )
    weight = torch.rand(edges.num_edges, generator=torch.Generator().manual_seed(2)) + 0.1
    weighted = GraphEdges(edges.edge_index, edge_weight=weight)
    out_w = make_core("graph_sparse")(q, k, v, edges=weighted).output
    expected = dense_oracle(q, k, v, adj, weight=edge_values_to_dense(edges, weight[:, None].double(), 2, 19))
    torch.testing.assert_close(out_w.double(), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out_w, out, atol=1e-3), "edge weights must change the result"


def test_unsorted_and_duplicate_edges_equal_summed_weights():
    """Edge order is irrelevant and a doubled edge with weights w1, w2 acts as one edge of weight w1 + w2."""
    q, k, v = make_qkv(b=1, n=15, seed=4)
    edges = adjacency_to_edges(random_graph(1, 15, seed=5))
    e = edges.num_edges
    weight = torch.rand(e, generator=torch.Generator().manual_seed(6)) + 0.5
    extra = torch.arange(0, e, 3)  # duplicate every third edge
    split = torch.full((extra.numel(),), 0.3)
    dup_index = torch.cat([edges.edge_index, edges.edge_index[:, extra]], dim=1)
    dup_weight = torch.cat([weight.index_add(0, extra, -split), split])
    shuffle = torch.randperm(dup_index.shape[1], generator=torch.Generator().manual_seed(7))
    core = make_core("graph_sparse")
    out = core(q, k, v, edges=GraphEdges(edges.edge_index, edge_weight=weight)).output
    out_dup = core(q, k, v, edges=GraphEdges(dup_index[:, shuffle], edge_weight=dup_weight[shuffle])).output
    torch.testing.assert_close(out_dup, out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["multiply", "add"])
def test_edge_features_match_oracle(mode):
    q, k, v = make_qkv(b=2, n=17, seed=8)
    adj = random_graph(2, 17, seed=9)
    edges = adjacency_to_edges(adj)
    g = torch.Generator().manual_seed(10)
    attr, weight = (
        torch.randn(edges.num_edges, 5, generator=g),
        torch.rand(edges.num_edges, generator=g) + 0.2,
    )
    core = make_core("graph_sparse", edge_dim=5, edge_feature_mode=mode)
    torch.nn.init.normal_(core.edge_projection.weight, std=0.5)  # make the features matter
    out = core(q, k, v, edges=GraphEdges(edges.edge_index, edge_weight=weight, edge_attr=attr)).output
    projected = core.edge_projection(attr).double().detach()  # (E, h)
    expected = dense_oracle(
        q,
        k,
        v,
        adj,
        weight=edge_values_to_dense(edges, weight[:, None].double(), 2, 17),
        feature=edge_values_to_dense(edges, projected, 2, 17),
        mode=mode,
    )
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    plain = make_core("graph_sparse")(q, k, v, edges=GraphEdges(edges.edge_index, edge_weight=weight)).output
    assert not torch.allclose(out, plain, atol=1e-3), "edge features must change the result"


def test_isolated_node_outputs_zero_and_gets_no_gradient():
    q, k, v = make_qkv(b=2, n=12, requires_grad=True)
    edges = adjacency_to_edges(random_graph(2, 12, seed=11))  # node 0 of each graph has no in-edge
    isolated_source = ~torch.isin(torch.arange(24), edges.edge_index[0]).view(2, 12)
    out = make_core("graph_sparse")(q, k, v, edges=edges).output
    assert (out[:, :, 0] == 0).all()
    assert (out[:, :, 1:].abs().sum(-1) > 0).all()
    out.sum().backward()
    assert (q.grad[:, :, 0] == 0).all()
    assert (v.grad.abs().sum(-1)[isolated_source[:, None].expand(2, 2, 12)] == 0).all()


def test_gradients_match_dense_oracle():
    q, k, v = make_qkv(b=2, n=13, seed=12, requires_grad=True)
    adj = random_graph(2, 13, seed=13)
    edges = adjacency_to_edges(adj)
    g = torch.Generator().manual_seed(14)
    attr = torch.randn(edges.num_edges, 3, generator=g)
    weight = (torch.rand(edges.num_edges, generator=g) + 0.2).requires_grad_()
    core = make_core("graph_sparse", edge_dim=3)
    out = core(q, k, v, edges=GraphEdges(edges.edge_index, edge_weight=weight, edge_attr=attr)).output
    cotangent = torch.randn(out.shape, generator=g)
    params = [q, k, v, weight, core.edge_projection.weight, core.edge_projection.bias]
    grads = torch.autograd.grad((out * cotangent).sum(), params)

    dense_w = edge_values_to_dense(edges, weight[:, None].double(), 2, 13)
    dense_f = edge_values_to_dense(edges, core.edge_projection(attr.double().float()).double(), 2, 13)
    expected = dense_oracle(q, k, v, adj, weight=dense_w, feature=dense_f)
    expected_grads = torch.autograd.grad((expected * cotangent.double()).sum(), params)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("self_loops", [False, True])
def test_autograd_functions_pass_gradcheck(self_loops):
    """The three Functions on (n h, d) slot matrices and (E h,) entries, on an unsorted pattern with a
    duplicate edge, an isolated target and (optionally) self loops added to all but one node."""
    g = torch.Generator().manual_seed(15)
    n, h, d = 6, 2, 3
    q, k, v = (torch.randn(n * h, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    edge_index = torch.tensor([[1, 0, 2, 2, 3, 5, 4, 1, 1], [0, 3, 1, 3, 2, 2, 4, 0, 5]])  # unsorted, dup
    loops = torch.tensor([True, True, False, True, True, True]) if self_loops else None
    pattern = EdgePattern(edge_index, n, h, loops)
    probs = torch.rand(pattern.num_entries, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: _EdgeScores.apply(q, k, pattern, 0.7), (q, k))
    assert torch.autograd.gradcheck(lambda s: _EdgeSoftmax.apply(s, pattern), (probs,))
    assert torch.autograd.gradcheck(lambda p, v: _EdgeAggregate.apply(p, v, pattern), (probs, v))


def test_cached_pattern_follows_in_place_edits():
    """The edge pattern is reused across layers for the same edge_index, but never after it changed."""
    q, k, v = make_qkv(b=1, n=11, seed=23)
    edges = adjacency_to_edges(random_graph(1, 11, seed=24))
    core = make_core("graph_sparse")
    before = core(q, k, v, edges=edges).output
    assert EdgePattern.of(edges.edge_index, 11) is EdgePattern.of(edges.edge_index, 11)
    edges.edge_index[0] = edges.edge_index[0].flip(0)  # same tensor, new sources
    after = core(q, k, v, edges=edges).output
    fresh = core(q, k, v, edges=GraphEdges(edges.edge_index.clone())).output
    torch.testing.assert_close(after, fresh, atol=0, rtol=0)
    assert not torch.allclose(after, before)


def test_nan_padding_does_not_leak():
    q, k, v = make_qkv(b=2, n=16, requires_grad=False)
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[0, 10:] = False
    for t in (q, k, v):
        t[0, :, 10:] = float("nan")
    adj = random_graph(2, 16, seed=16, mask=mask)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = make_core("graph_sparse")(q, k, v, attention_mask=mask, edges=adjacency_to_edges(adj)).output
    assert torch.isfinite(out).all() and (out[0, :, 10:] == 0).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_batch_items_are_independent_with_their_own_edges():
    q, k, v = make_qkv(b=3, n=14, seed=17)
    adj = random_graph(3, 14, seed=18)
    core = make_core("graph_sparse")
    together = core(q, k, v, edges=adjacency_to_edges(adj)).output
    for i in range(3):
        alone = core(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], edges=adjacency_to_edges(adj[i : i + 1])
        ).output
        torch.testing.assert_close(together[i : i + 1], alone, atol=1e-6, rtol=1e-6)


def test_dropout_in_training_only():
    spec = AttentionSpec(2, 8, dropout=0.5)
    core = build_attention("graph_sparse", spec)
    q, k, v = make_qkv(b=1, n=20)
    edges = adjacency_to_edges(random_graph(1, 20, p=0.5, seed=19))
    assert_dropout_only_in_training(core, q, k, v, edges=edges)


def test_bfloat16_inputs_keep_their_dtype():
    q, k, v = make_qkv(b=1, n=18, seed=20)
    edges = adjacency_to_edges(random_graph(1, 18, seed=21))
    assert_bfloat16_keeps_dtype(make_core("graph_sparse"), q, k, v, edges=edges)


def test_edge_projection_survives_meta_device_init():
    with torch.device("meta"):
        core = make_core("graph_sparse", edge_dim=4, edge_feature_mode="add")
    core = core.to_empty(device="cpu")
    core.init_weights()
    assert torch.isfinite(core.edge_projection.weight).all()
    assert (core.edge_projection.bias == 0).all()


def test_edge_feature_errors():
    q, k, v = make_qkv(b=1, n=10)
    edges = adjacency_to_edges(random_graph(1, 10, seed=22))
    attr = torch.randn(edges.num_edges, 4)
    with pytest.raises(ValueError, match="edge_dim'] is None"):
        make_core("graph_sparse")(q, k, v, edges=GraphEdges(edges.edge_index, edge_attr=attr))
    with pytest.raises(ValueError, match="width 4 .* must match"):
        make_core("graph_sparse", edge_dim=3)(q, k, v, edges=GraphEdges(edges.edge_index, edge_attr=attr))
    with pytest.raises(ValueError, match="no edge_attr"):
        make_core("graph_sparse", edge_dim=4)(q, k, v, edges=edges)
    with pytest.raises(ValueError, match="positions"):
        make_core("graph_sparse")(q, k, v, edges=GraphEdges(torch.tensor([[0, 10], [1, 2]])))
    with pytest.raises(ValueError, match="edge_feature_mode"):
        make_core("graph_sparse", edge_feature_mode="concat")
    with pytest.raises(ValueError, match="edge_dim"):
        make_core("graph_sparse", edge_dim=0)


@pytest.mark.parametrize("block_bytes", [2_000, 700])
def test_column_blocked_products_equal_the_plain_ones(monkeypatch, block_bytes):
    """Large dense operands go through column blocks (EdgePattern._blocked_product); forced here on a small
    graph: the pattern's and its transpose's products, and the core's gradients, equal the one-block path."""
    import hf_efficient.attention.kernels.edges as edges

    torch.manual_seed(0)
    n, h, d = 60, 2, 4
    edge_index = torch.randint(0, n, (2, 400))
    pattern = EdgePattern.of(edge_index, n, h, None)
    values = torch.rand(pattern.num_entries, dtype=torch.float64)
    dense = torch.randn(n * h, d, dtype=torch.float64)
    left = torch.randn(n * h, d, dtype=torch.float64)
    plain_target, plain_source = pattern.by_target(values) @ dense, pattern.by_source(values) @ dense
    plain_dots = pattern.sampled_dot(left, dense)
    monkeypatch.setattr(edges, "COLUMN_BLOCK_BYTES", block_bytes)  # 3-6 blocks of the 3,840-byte operand
    assert len(pattern._column_blocks("target", -(-dense.numel() * 8 // block_bytes))) > 1
    torch.testing.assert_close(pattern.target_product(values, dense), plain_target, rtol=0, atol=1e-12)
    torch.testing.assert_close(pattern.source_product(values, dense), plain_source, rtol=0, atol=1e-12)
    torch.testing.assert_close(pattern.sampled_dot(left, dense), plain_dots, rtol=0, atol=1e-12)

    query, key, value = (torch.randn(n * h, d, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def gradients():
        probs = _EdgeSoftmax.apply(_EdgeScores.apply(query, key, pattern, 0.5), pattern)
        out = _EdgeAggregate.apply(probs, value, pattern)
        return torch.autograd.grad(out.pow(2).sum(), (query, key, value))

    blocked = gradients()
    monkeypatch.setattr(edges, "COLUMN_BLOCK_BYTES", 10**9)
    for got, expected in zip(blocked, gradients(), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attention_type", ["graph_sparse", "multi_hop"])
def test_csr_kernel_over_column_blocks_equals_reference(monkeypatch, attention_type):
    """With COLUMN_BLOCK_BYTES shrunk, every product of the csr kernel runs over several column blocks (as
    large graphs do): outputs, weights and gradients still equal the reference's."""
    import hf_efficient.attention.kernels.edges as edges

    monkeypatch.setattr(edges, "COLUMN_BLOCK_BYTES", 700)  # (48 h, 8) float32 operands: 5 blocks
    adj = random_graph(2, 24, seed=25)
    graph = adjacency_to_edges(adj)
    weight = torch.rand(graph.num_edges, generator=torch.Generator().manual_seed(26)) + 0.1
    results = []
    for implementation in ("reference", "csr"):
        core = make_core(attention_type, implementation=implementation, add_self_loops=True)
        q, k, v = make_qkv(b=2, n=24, seed=27, requires_grad=True)
        out = core(q, k, v, edges=GraphEdges(graph.edge_index, edge_weight=weight), output_attentions=True)
        weights = out.weights.to_dense() if out.weights.is_sparse else out.weights
        results.append([out.output, weights, *torch.autograd.grad(out.output.square().sum(), [q, k, v])])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
