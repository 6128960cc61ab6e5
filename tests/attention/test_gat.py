"""gat / gatv2: parity with PyG's GATConv / GATv2Conv given the same weights (forward and gradients, with and
without edge features), dense float64 oracles with padding and edge weights, GAT's static against GATv2's
dynamic attention, self loops, returned weights, the traced form (EdgeScatter) and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, GATv2Conv

from hf_efficient.attention import GraphEdges
from hf_efficient.attention.kernels.edges import EdgePattern

from .helpers import (
    adjacency_to_edges,
    assert_bfloat16_keeps_dtype,
    assert_dropout_only_in_training,
    make_core,
    make_qkv,
    padding_mask,
    random_adjacency,
)

HEADS, HEAD_DIM, IN_DIM, EDGE_DIM, NODES = 3, 4, 7, 5, 13


def random_graph(seed: int, num_edges: int = 40, nodes: int = NODES) -> torch.Tensor:
    """(2, E) random directed edges with duplicates, some self loops and (likely) isolated targets."""
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, nodes, (2, num_edges), generator=g)
    return torch.cat([edge_index, torch.tensor([[2, 5, 5], [2, 5, 1]])], dim=1)  # loops at 2, 5; 5->1 twice


def heads_of(x: torch.Tensor) -> torch.Tensor:
    """(N, h d) node-major projections -> (1, h, N, d), the view the encoder blocks hand over."""
    return x.view(1, x.shape[0], HEADS, HEAD_DIM).transpose(1, 2)


def concat_heads(out: torch.Tensor) -> torch.Tensor:
    """(1, h, N, d) -> (N, h d), PyG's concat=True layout."""
    return out.transpose(1, 2).reshape(out.shape[2], -1)


def pyg_and_core(kind: str, edge_dim: int | None, tied: bool):
    """A PyG layer and our core with the mapped weights (see the mapping in hf_efficient/attention/gat.py)."""
    torch.manual_seed(0)
    in_channels = IN_DIM if tied else (IN_DIM, IN_DIM)
    if kind == "gat":
        conv = GATConv(in_channels, HEAD_DIM, heads=HEADS, edge_dim=edge_dim)
        core = make_core("gat", heads=HEADS, head_dim=HEAD_DIM, edge_dim=edge_dim)
        with torch.no_grad():
            core.att_src.copy_(conv.att_src[0])
            core.att_dst.copy_(conv.att_dst[0])
            if edge_dim is not None:  # a_edge . (W_edge x) is one linear map edge_dim -> h
                lin_edge = conv.lin_edge.weight.view(HEADS, HEAD_DIM, edge_dim)
                core.edge_projection.weight.copy_(torch.einsum("hc,hcf->hf", conv.att_edge[0], lin_edge))
    else:
        conv = GATv2Conv(in_channels, HEAD_DIM, heads=HEADS, edge_dim=edge_dim, share_weights=tied)
        core = make_core("gatv2", heads=HEADS, head_dim=HEAD_DIM, edge_dim=edge_dim)
        with torch.no_grad():
            core.att.copy_(conv.att[0])
            if edge_dim is not None:
                core.edge_projection.weight.copy_(conv.lin_edge.weight)
    return conv, core


def core_forward(kind: str, conv, core, x, edge_index, edge_attr):
    """Our core on PyG's projections: query = target side, key = source side of the score, value = messages;
    PyG's output bias added as the value projection's bias would be."""
    if kind == "gat":
        source = conv.lin(x) if conv.lin is not None else conv.lin_src(x)  # (N, h d)
        target = conv.lin(x) if conv.lin is not None else conv.lin_dst(x)
    else:
        source, target = conv.lin_l(x), conv.lin_r(x)
    out = core(
        heads_of(target),
        heads_of(source),
        heads_of(source),
        edges=GraphEdges(edge_index, edge_attr=edge_attr),
    )
    return concat_heads(out.output) + conv.bias


@pytest.mark.parametrize("kind", ["gat", "gatv2"])
@pytest.mark.parametrize("edge_dim", [None, EDGE_DIM])
@pytest.mark.parametrize("tied", [True, False])
def test_matches_pyg_forward_and_gradients(kind, edge_dim, tied):
    conv, core = pyg_and_core(kind, edge_dim, tied)
    g = torch.Generator().manual_seed(1)
    edge_index = random_graph(2)
    x = torch.randn(NODES, IN_DIM, generator=g, requires_grad=True)
    edge_attr = None
    if edge_dim is not None:
        edge_attr = torch.randn(edge_index.shape[1], edge_dim, generator=g, requires_grad=True)
    expected = conv(x, edge_index, edge_attr)
    got = core_forward(kind, conv, core, x, edge_index, edge_attr)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

    cotangent = torch.randn(expected.shape, generator=g)
    inputs = [x] + ([edge_attr] if edge_attr is not None else [])
    projections = [p for name, p in conv.named_parameters() if name.startswith("lin") and "edge" not in name]
    want = torch.autograd.grad((expected * cotangent).sum(), inputs + projections + list(conv.parameters()))
    core_params = list(core.parameters())
    got_grads = torch.autograd.grad((got * cotangent).sum(), inputs + projections + core_params)
    count = len(inputs) + len(projections)
    for g_got, g_want in zip(got_grads[:count], want[:count], strict=True):  # inputs and shared projections
        torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-5)
    pyg = dict(zip([name for name, _ in conv.named_parameters()], want[count:], strict=True))
    ours = dict(zip([name for name, _ in core.named_parameters()], got_grads[count:], strict=True))
    if kind == "gat":
        torch.testing.assert_close(ours["att_src"], pyg["att_src"][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours["att_dst"], pyg["att_dst"][0], atol=1e-5, rtol=1e-5)
        if edge_dim is not None:  # d/d lin_edge[h, c, :] = att_edge[h, c] * d/d W'[h, :]
            lin_edge_grad = torch.einsum(
                "hc,hf->hcf", conv.att_edge[0].detach(), ours["edge_projection.weight"]
            )
            torch.testing.assert_close(
                lin_edge_grad.reshape(-1, edge_dim), pyg["lin_edge.weight"], atol=1e-5, rtol=1e-5
            )
    else:
        torch.testing.assert_close(ours["att"], pyg["att"][0], atol=1e-5, rtol=1e-5)
        if edge_dim is not None:
            torch.testing.assert_close(
                ours["edge_projection.weight"], pyg["lin_edge.weight"], atol=1e-5, rtol=1e-5
            )


@pytest.mark.parametrize("kind", ["gat", "gatv2"])
def test_returned_weights_match_pyg_attention_weights(kind):
    conv, core = pyg_and_core(kind, None, True)
    x = torch.randn(NODES, IN_DIM, generator=torch.Generator().manual_seed(3))
    edge_index = random_graph(4)
    _, (pyg_index, pyg_alpha) = conv(x, edge_index, return_attention_weights=True)  # loops added by PyG
    source = conv.lin(x) if kind == "gat" else conv.lin_l(x)
    target = conv.lin(x) if kind == "gat" else conv.lin_r(x)
    weights = core(
        heads_of(target),
        heads_of(source),
        heads_of(source),
        edges=GraphEdges(edge_index),
        output_attentions=True,
    ).weights
    assert weights.is_sparse and weights.shape == (1, HEADS, NODES, NODES)
    expected = torch.zeros(HEADS, NODES, NODES).index_put_(
        (torch.arange(HEADS)[:, None], pyg_index[1][None], pyg_index[0][None]),
        pyg_alpha.T.detach(),
        accumulate=True,
    )  # (h, target, source), duplicate edges summed
    torch.testing.assert_close(weights.to_dense()[0], expected, atol=1e-6, rtol=1e-5)


def dense_oracle(kind, q, k, v, adj, att, edge_term=None, weight=None, slope=0.2):
    """Float64 dense GAT / GATv2 attention over the edges of adj (b, n, n) [graph, target, source].

    att: (a_dst, a_src) for GAT, a for GATv2, each (h, d). edge_term: GAT (b, h, n, n); GATv2 (b, h, n, n, d).
    weight: (b, 1, n, n) positive edge weights."""
    q, k, v = (t.double() for t in (q, k, v))
    if kind == "gat":
        a_dst, a_src = (a.double() for a in att)
        scores = (q * a_dst[None, :, None]).sum(-1)[..., :, None] + (k * a_src[None, :, None]).sum(-1)[
            ..., None, :
        ]
        if edge_term is not None:
            scores = scores + edge_term
        scores = F.leaky_relu(scores, slope)  # (b, h, n, n)
    else:
        z = q[:, :, :, None, :] + k[:, :, None, :, :]  # (b, h, target, source, d)
        if edge_term is not None:
            z = z + edge_term
        scores = (F.leaky_relu(z, slope) * att.double()[None, :, None, None]).sum(-1)
    if weight is not None:
        scores = scores + weight.double().log()
    probs = torch.softmax(scores.masked_fill(~adj[:, None], float("-inf")), -1).nan_to_num(0.0)
    return probs @ v, probs


@pytest.mark.parametrize("kind", ["gat", "gatv2"])
def test_padded_batch_with_edge_weights_and_features_matches_dense_oracle(kind):
    """Self loops off: the graph's own edges (isolated node 0 outputs 0), edge weights, edge features,
    padding poisoned with 1e9; outputs and gradients against the float64 oracle."""
    lengths, n = [11, 8], 11
    mask = padding_mask(lengths, n)
    adj = random_adjacency(2, n, p=0.3, seed=5, mask=mask, isolate_first=True)
    edges = adjacency_to_edges(adj)
    g = torch.Generator().manual_seed(6)
    q, k, v = make_qkv(b=2, h=HEADS, n=n, d=HEAD_DIM, seed=7)
    for t in (q, k, v):
        t[1, :, 8:] = 1e9
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    attr = torch.randn(edges.num_edges, EDGE_DIM, generator=g)
    weight = torch.rand(edges.num_edges, generator=g) + 0.2
    core = make_core(kind, heads=HEADS, head_dim=HEAD_DIM, edge_dim=EDGE_DIM, add_self_loops=False)
    out = core(q, k, v, attention_mask=mask, edges=GraphEdges(edges.edge_index, weight, attr)).output

    src, tgt = edges.edge_index
    graph, target, source = tgt // n, tgt % n, src % n
    projected = core.edge_projection(attr).detach().double()  # (E, h) or (E, h d)
    if kind == "gat":
        edge_term = torch.zeros(2, HEADS, n, n, dtype=torch.float64)
        edge_term[graph, :, target, source] = projected
        att = (core.att_dst.detach(), core.att_src.detach())
    else:
        edge_term = torch.zeros(2, HEADS, n, n, HEAD_DIM, dtype=torch.float64)
        edge_term[graph, :, target, source] = projected.view(-1, HEADS, HEAD_DIM)
        att = core.att.detach()
    dense_weight = torch.ones(2, 1, n, n, dtype=torch.float64)
    dense_weight[graph, 0, target, source] = weight.double()
    qs, ks, vs = (t[:, :, :n] * 1.0 for t in (q, k, v))
    expected, _ = dense_oracle(kind, qs, ks, vs, adj, att, edge_term, dense_weight)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[real], expected[real], atol=1e-5, rtol=1e-5)
    assert (out[~real] == 0).all() and (out[:, :, 0] == 0).all()  # padding and the isolated node

    cotangent = torch.randn(out.shape, generator=g).masked_fill(~real, 0.0)
    grads = torch.autograd.grad((out * cotangent).sum(), [q, k, v])
    expected_grads = torch.autograd.grad(
        (expected * cotangent.double()).masked_fill(~real, 0).sum(), [q, k, v]
    )
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got.double()[real], want.double()[real], atol=1e-5, rtol=1e-4)
        assert torch.isfinite(got).all()


def test_gat_attention_is_static_and_gatv2_dynamic():
    """Brody et al.'s point: GAT's score is monotone in a_src . k_j for every query, so on a complete graph
    all queries rank the keys alike (the same top key); GATv2's can rank them differently per query."""
    n = 12
    adj = torch.ones(1, n, n, dtype=torch.bool)
    edges = adjacency_to_edges(adj)
    q, k, v = make_qkv(b=1, h=HEADS, n=n, d=HEAD_DIM, seed=8)
    for kind in ("gat", "gatv2"):
        core = make_core(kind, heads=HEADS, head_dim=HEAD_DIM, add_self_loops=False)
        probs = core(q, k, v, edges=edges, output_attentions=True).weights.to_dense()  # (1, h, n, n)
        top_keys = probs.argmax(-1)  # (1, h, n): each query's most attended key
        same_for_all_queries = (top_keys == top_keys[..., :1]).all().item()
        assert same_for_all_queries == (kind == "gat"), kind


@pytest.mark.parametrize("kind", ["gat", "gatv2"])
def test_uniform_attention_limit_is_neighbour_mean(kind):
    """With zero attention vectors every score is equal: each node averages its neighbours' values (plus its
    own through the added self loop), the limit in which graph attention is a mean aggregation."""
    n = 10
    adj = random_adjacency(1, n, p=0.3, seed=9, self_loops=False)
    q, k, v = make_qkv(b=1, h=HEADS, n=n, d=HEAD_DIM, seed=10)
    core = make_core(kind, heads=HEADS, head_dim=HEAD_DIM)
    for p in core.parameters():
        torch.nn.init.zeros_(p)
    out = core(q, k, v, edges=adjacency_to_edges(adj)).output
    with_loops = (adj | torch.eye(n, dtype=torch.bool)).double()  # (1, target, source)
    expected = (with_loops / with_loops.sum(-1, keepdim=True))[:, None] @ v.double()
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=1e-6)


def test_self_loops_replace_existing_ones_with_mean_edge_features():
    """add_self_loops drops the graph's loops and gives each real node one whose features are the mean of its
    incoming edges' (PyG's fill_value="mean"), zeros without incoming edges; padded nodes get none."""
    edge_index = torch.tensor([[1, 2, 0, 3, 3], [0, 0, 0, 3, 1]])  # loops at 0 and 3; node 2 has no in-edge
    attr = torch.tensor([[1.0], [3.0], [100.0], [100.0], [5.0]])
    pattern = EdgePattern(edge_index, 5, 2, loop_mask=torch.tensor([True, True, True, True, False]))
    pairs = sorted(zip(pattern.source.tolist(), pattern.target.tolist(), strict=True))
    assert pairs == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 2), (3, 1), (3, 3)]
    values = pattern.edge_values(attr, loops="mean")
    loop_attr = {
        s: values[i].item()
        for i, (s, t) in enumerate(zip(pattern.source.tolist(), pattern.target.tolist(), strict=True))
        if s == t
    }
    assert loop_attr == {
        0: 2.0,
        1: 5.0,
        2: 0.0,
        3: 0.0,
    }  # mean of 1 and 3; of 5; none; its only in-edge was a loop
    weights = pattern.edge_values(torch.full((5,), 7.0), loops="one")
    assert sorted(weights.tolist()) == [1.0] * 4 + [7.0] * 3


def test_edge_pattern_cache_keeps_cores_with_and_without_loops_apart():
    """graph_sparse (no loops) and gat (loops) in alternate layers share an edge_index tensor: each must see
    its own pattern."""
    q, k, v = make_qkv(b=1, h=2, n=9, seed=11)
    edges = adjacency_to_edges(random_adjacency(1, 9, p=0.3, seed=12, self_loops=False))
    sparse, gat = make_core("graph_sparse"), make_core("gat")
    first = [sparse(q, k, v, edges=edges).output, gat(q, k, v, edges=edges).output]
    second = [sparse(q, k, v, edges=edges).output, gat(q, k, v, edges=edges).output]
    fresh_edges = GraphEdges(edges.edge_index.clone())
    fresh = [
        sparse(q, k, v, edges=fresh_edges).output,
        gat(q, k, v, edges=GraphEdges(edges.edge_index.clone())).output,
    ]
    for a, b, c in zip(first, second, fresh, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        torch.testing.assert_close(a, c, atol=0, rtol=0)
    assert not torch.allclose(first[0], first[1])


@pytest.mark.parametrize("kind", ["gat", "gatv2"])
def test_dropout_bfloat16_and_errors(kind):
    q, k, v = make_qkv(b=1, n=15, seed=13)
    edges = adjacency_to_edges(random_adjacency(1, 15, p=0.4, seed=14))
    core = make_core(kind)
    core.spec = type(core.spec)(num_heads=2, head_dim=8, dropout=0.5)
    assert_dropout_only_in_training(core, q, k, v, edges=edges)
    assert_bfloat16_keeps_dtype(make_core(kind), q, k, v, edges=edges)
    with pytest.raises(ValueError, match="negative_slope"):
        make_core(kind, negative_slope=-0.1)
    with pytest.raises(ValueError, match=f"{kind} was built with"):
        make_core(kind, edge_dim=2)(q, k, v, edges=edges)
    with pytest.raises(ValueError, match=f"{kind} got edge_attr"):
        make_core(kind)(q, k, v, edges=GraphEdges(edges.edge_index, edge_attr=torch.ones(edges.num_edges, 2)))


@pytest.mark.parametrize(
    "attention_type, config",
    [
        ("gat", {"edge_dim": 3}),
        ("gatv2", {"edge_dim": 3}),
        ("multi_hop", {"score": "gat", "edge_dim": 3, "add_self_loops": True}),
        ("graph_sparse", {"edge_dim": 3, "edge_feature_mode": "add", "add_self_loops": True}),
    ],
)
def test_traced_form_matches_eager_with_loops_features_weights_and_shuffled_edges(
    attention_type, config, monkeypatch
):
    """The form traced graphs compute (EdgeScatter: the edges in the caller's order, self loops appended for
    every node slot and masked) gives the CSR path's outputs, returned weights and gradients, with edge
    features, edge weights, existing self loops, an isolated node, padding and edges in no order."""
    core = make_core(attention_type, **config).train()
    lengths, n = [20, 29], 29
    mask = padding_mask(lengths, n)
    adj = random_adjacency(2, n, mask=mask, self_loops=True, isolate_first=True)
    edge_index = adjacency_to_edges(adj).edge_index
    g = torch.Generator().manual_seed(3)
    edge_index = edge_index[:, torch.randperm(edge_index.shape[1], generator=g)]
    edges = GraphEdges(
        edge_index,
        edge_weight=torch.rand(edge_index.shape[1], generator=g) + 0.1,
        edge_attr=torch.randn(edge_index.shape[1], 3, generator=g),
    )

    def call():
        q, k, v = make_qkv(b=2, n=n, requires_grad=True)
        out = core(q, k, v, attention_mask=mask, edges=edges, output_attentions=True)
        weights = out.weights.to_dense() if out.weights.is_sparse else out.weights
        return out.output, weights, torch.autograd.grad(out.output.square().sum(), [q, k, v])

    expected = call()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # what is_tracing() asks
    got = call()
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], expected[1], atol=1e-5, rtol=1e-5)
    for g_got, g_expected in zip(got[2], expected[2], strict=True):
        torch.testing.assert_close(g_got, g_expected, atol=1e-5, rtol=1e-4)


def _reference_and_csr(attention_type: str, **config):
    """(reference core, forced "csr" core) with the same parameters."""
    torch.manual_seed(0)
    reference = make_core(attention_type, implementation="reference", **config)
    fast = make_core(attention_type, implementation="csr", **config)
    fast.load_state_dict(reference.state_dict())
    return reference, fast


def test_gatv2_kernel_over_many_chunks_equals_reference(monkeypatch):
    """GATv2Scores cuts the edges into chunks of GATV2_CHUNK_BYTES, far more edges than the contract tests
    reach: shrunk here to a few edges per chunk, the csr kernel still equals the reference (outputs, weights,
    gradients of q, k, v, the attention vector and the edge projection), with edge features, weights,
    padding and self loops."""
    import hf_efficient.attention.kernels.edges as kernels

    monkeypatch.setattr(kernels, "GATV2_CHUNK_BYTES", 3 * 2 * 8 * 4)  # 3 edges of (h d) float32 per chunk
    lengths, n = [20, 29], 29
    mask = padding_mask(lengths, n)
    edge_index = adjacency_to_edges(random_adjacency(2, n, mask=mask, isolate_first=True)).edge_index
    g = torch.Generator().manual_seed(5)
    edges = GraphEdges(
        edge_index,
        edge_weight=torch.rand(edge_index.shape[1], generator=g) + 0.1,
        edge_attr=torch.randn(edge_index.shape[1], 3, generator=g),
    )
    results = []
    for core in _reference_and_csr("gatv2", edge_dim=3):
        q, k, v = make_qkv(b=2, n=n, requires_grad=True)
        out = core(q, k, v, attention_mask=mask, edges=edges, output_attentions=True)
        leaves = [q, k, v, core.att, core.edge_projection.weight]
        grads = torch.autograd.grad((out.output * torch.cos(out.output)).sum(), leaves)
        results.append([out.output, out.weights.to_dense(), *grads])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention_type", ["graph_sparse", "gat", "gatv2", "multi_hop"])
def test_auto_takes_csr_in_eager_mode_and_the_reference_while_tracing(attention_type, monkeypatch):
    """implementation="auto" runs the csr kernel outside traced graphs, the reference inside them."""
    core = make_core(attention_type)
    q = make_qkv(b=1, n=9)[0]
    assert core.kernel_for(q, None).name == "csr"
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # what is_tracing() asks
    assert core.kernel_for(q, None) is None
