"""Registry-wide contract tests: every registered attention type is checked the moment it registers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hf_efficient
from hf_efficient.attention import (
    AttentionInputs,
    AttentionSpec,
    GraphEdges,
    build_attention,
    get_attention_class,
)

from .helpers import adjacency_to_edges, make_core, make_qkv

ALL_TYPES = hf_efficient.list_attention_types()
POISON = 1e9


def graph_edges(core, lengths, n, item_seeds=None):
    """Edges for a padded batch whose item g has lengths[g] real nodes; the same graph for any n >= lengths.

    Only for cores that need edges; None otherwise. Random directed graph + self loops on the real nodes;
    item g's graph depends only on (item_seeds[g], lengths[g]), so slicing a batch keeps each graph.
    """
    if not core.capabilities.requires_edges:
        return None
    item_seeds = item_seeds or list(range(len(lengths)))
    adj = torch.zeros(len(lengths), n, n, dtype=torch.bool)
    for i, m in enumerate(lengths):
        g = torch.Generator().manual_seed(item_seeds[i])
        sub = (torch.rand(m, m, generator=g) < 0.3) | torch.eye(m, dtype=torch.bool)
        adj[i, :m, :m] = sub
    return adjacency_to_edges(adj)


def run(core, q, k, v, mask=None, lengths=None, item_seeds=None, **kwargs):
    lengths = lengths or [q.shape[2]] * q.shape[0]
    if core.capabilities.shared_query_key:
        k = q
    edges = graph_edges(core, lengths, q.shape[2], item_seeds)
    return core(q, k, v, attention_mask=mask, edges=edges, **kwargs)


def test_registry_lists_types():
    assert "full" in ALL_TYPES
    assert ALL_TYPES == sorted(ALL_TYPES)
    assert set(hf_efficient.list_attention_types("text")) <= set(ALL_TYPES)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_shapes_finite_forward_backward(attention_type):
    core = make_core(attention_type).train()
    q, k, v = make_qkv(b=2, n=37, requires_grad=True)
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, 30:] = False
    out = run(core, q, k, v, mask, lengths=[37, 30])
    assert out.output.shape == (2, 2, 37, 8)
    assert out.weights is None
    assert torch.isfinite(out.output).all()
    out.output.square().sum().backward()
    used = [q, v] if core.capabilities.shared_query_key else [q, k, v]
    for t in used:
        assert t.grad is not None and torch.isfinite(t.grad).all()
        assert t.grad.abs().sum() > 0


@pytest.mark.parametrize("attention_type", ALL_TYPES)
@pytest.mark.parametrize("n", [4, 37])
def test_strided_inputs_same_outputs_and_gradients(attention_type, n):
    """The encoders hand over heads as (b, n, h, d) -> (b, h, n, d) views. With batch 1 a core's reshapes can
    keep such a view strided; outputs and gradients must equal those of dense inputs (n=4: one block at the
    small configs' sizes)."""
    core = make_core(attention_type)
    dense = make_qkv(b=1, n=n, requires_grad=True)
    strided = [t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in dense]
    assert not strided[0].is_contiguous()
    outs = [run(core, *qkv).output for qkv in (dense, strided)]
    torch.testing.assert_close(outs[1], outs[0])
    grad_out = torch.randn_like(outs[0])
    used = [0, 2] if core.capabilities.shared_query_key else [0, 1, 2]
    want = torch.autograd.grad((outs[0] * grad_out).sum(), [dense[i] for i in used])
    got = torch.autograd.grad((outs[1] * grad_out).sum(), [strided[i] for i in used])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
@pytest.mark.parametrize("n_real", [23, 40])
def test_padding_invariance_with_poisoned_pads(attention_type, n_real):
    """Appending padding (filled with 1e9) must not move the outputs of real tokens by more than 1e-5."""
    core = make_core(attention_type)
    q, k, v = make_qkv(b=1, n=n_real)
    alone = run(core, q, k, v).output
    n_pad = n_real + 13
    qp, kp, vp = (torch.cat([t, torch.full((1, 2, 13, 8), POISON)], dim=2) for t in (q, k, v))
    mask = torch.arange(n_pad)[None] < n_real
    padded = run(core, qp, kp, vp, mask, lengths=[n_real]).output
    torch.testing.assert_close(padded[:, :, :n_real], alone, atol=1e-5, rtol=1e-5)
    assert (padded[:, :, n_real:] == 0).all(), "padded query rows must be exactly 0"


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_batch_independence(attention_type):
    core = make_core(attention_type)
    q, k, v = make_qkv(b=3, n=29)
    together = run(core, q, k, v).output
    for i in range(3):
        alone = run(core, q[i : i + 1], k[i : i + 1], v[i : i + 1], item_seeds=[i]).output
        torch.testing.assert_close(together[i : i + 1], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_eval_is_deterministic(attention_type):
    core = make_core(attention_type)
    q, k, v = make_qkv(n=33)
    first = run(core, q, k, v).output
    torch.manual_seed(123)  # a changed global RNG must not matter in eval
    second = run(core, q, k, v).output
    assert torch.equal(first, second)


@pytest.mark.parametrize(
    "attention_type", [t for t in ALL_TYPES if get_attention_class(t).capabilities.permutation_equivariant]
)
def test_permutation_equivariance(attention_type):
    core = make_core(attention_type)
    q, k, v = make_qkv(b=1, n=19)
    perm = torch.randperm(19)
    edges = graph_edges(core, [19], 19)
    if edges is not None:
        # node perm[i] becomes node i: relabel edge endpoints with the inverse permutation
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(19)
        edges_perm = GraphEdges(inverse[edges.edge_index])
    else:
        edges_perm = None
    kq = (lambda t: t) if core.capabilities.shared_query_key else (lambda t: None)
    out = core(q, kq(q) if kq(q) is not None else k, v, edges=edges).output
    qp, kp, vp = q[:, :, perm], k[:, :, perm], v[:, :, perm]
    out_perm = core(qp, kq(qp) if kq(qp) is not None else kp, vp, edges=edges_perm).output
    torch.testing.assert_close(out_perm, out[:, :, perm], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_save_load_identical_outputs(attention_type, tmp_path):
    """Round trip through safetensors into a core built on the meta device, as from_pretrained does."""
    torch.manual_seed(1)
    core = make_core(attention_type)
    q, k, v = make_qkv(n=31)
    expected = run(core, q, k, v).output
    path = tmp_path / "core.safetensors"
    save_file({name: t.contiguous() for name, t in core.state_dict().items()}, str(path))

    torch.manual_seed(2)  # different random state at construction time
    with torch.device("meta"):
        fresh = make_core(attention_type)
    fresh = fresh.to_empty(device="cpu")
    fresh.init_weights()
    fresh.load_state_dict(load_file(str(path)), strict=True)
    fresh.eval()
    torch.testing.assert_close(run(fresh, q, k, v).output, expected, atol=0, rtol=0)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_unsupported_inputs_raise(attention_type):
    core = make_core(attention_type)
    caps = core.capabilities
    q, k, v = make_qkv(b=2, n=16)
    if caps.shared_query_key:
        k = q
    edges = graph_edges(core, [16, 16], 16)
    checks = []
    if not caps.attention_bias:
        checks.append(dict(attention_bias=torch.zeros(2, 2, 16, 16)))
    if not caps.output_attentions:
        checks.append(dict(output_attentions=True))
    if not caps.causal:
        checks.append(dict(is_causal=True))
    if not caps.edges:
        e = torch.stack([torch.arange(16), torch.arange(16)])
        checks.append(dict(edges=GraphEdges(e)))
    if not caps.global_attention_mask:
        checks.append(dict(global_attention_mask=torch.ones(2, 16, dtype=torch.bool)))
    for extra in checks:
        kwargs = {"edges": edges, **extra}
        with pytest.raises(ValueError, match=attention_type):
            core(q, k, v, **kwargs)
    # wrong ranks, head sizes, mask shapes
    with pytest.raises(ValueError, match="batch, heads, seq, head_dim"):
        core(q[0], k[0], v[0], edges=edges)
    with pytest.raises(ValueError, match="heads of size"):
        bad = torch.randn(2, 2, 16, 4)
        core(bad, bad, bad, edges=edges)
    with pytest.raises(ValueError, match="attention_mask must be"):
        core(q, k, v, attention_mask=torch.ones(2, 15), edges=edges)
    with pytest.raises(ValueError, match="no real token"):
        core(q, k, v, attention_mask=torch.zeros(2, 16), edges=edges)
    if caps.requires_edges:
        with pytest.raises(ValueError, match="needs `edges`"):
            core(q, k, v)
        with pytest.raises(ValueError, match="positions"):
            core(q, k, v, edges=GraphEdges(torch.tensor([[0, 40], [1, 2]])))
        with pytest.raises(ValueError, match="no edges"):
            core(q, k, v, edges=GraphEdges(torch.zeros(2, 0, dtype=torch.long)))


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_unknown_config_key_lists_valid_keys(attention_type):
    with pytest.raises(ValueError, match="Valid keys") as err:
        build_attention(attention_type, AttentionSpec(2, 8, max_seq_len=64), {"not_a_key": 1})
    assert "not_a_key" in str(err.value)


def test_unknown_attention_type_lists_registered():
    with pytest.raises(ValueError, match="Registered types: .*full"):
        build_attention("flash_magic", AttentionSpec(2, 8))


def test_shared_query_key_enforced():
    for attention_type in ALL_TYPES:
        core = make_core(attention_type)
        if core.capabilities.shared_query_key:
            q, k, v = make_qkv(n=16)
            with pytest.raises(ValueError, match="key=query"):
                core(q, k, v)


@pytest.mark.parametrize("attention_type", ALL_TYPES)
def test_no_weight_decay_names_own_parameters(attention_type):
    # a misspelt entry would leave its parameter decayed without a word: every name must be a parameter
    core = make_core(attention_type)
    assert set(core.no_weight_decay) <= dict(core.named_parameters(recurse=False)).keys()


def test_inputs_as_object_or_keywords_and_clear_errors():
    core = make_core("full")
    q, k, v = make_qkv(b=2, n=10)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 7:] = False
    by_object = core(q, k, v, AttentionInputs(attention_mask=mask, is_causal=True)).output
    torch.testing.assert_close(core(q, k, v, attention_mask=mask, is_causal=True).output, by_object)
    with pytest.raises(TypeError, match="attention_mask=mask"):
        core(q, k, v, mask)  # the v1 positional padding mask
    with pytest.raises(TypeError, match="unknown attention input.*padding_mask.*valid: attention_mask"):
        core(q, k, v, padding_mask=mask)
    with pytest.raises(TypeError, match="not both"):
        core(q, k, v, AttentionInputs(), attention_mask=mask)


def test_prepare_checks_once_and_replace_keeps_what_needs_no_check():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    inputs = AttentionInputs(attention_mask=mask).prepare(2, 3)
    assert inputs.prepared_for == (2, 3) and inputs.attention_mask.dtype == torch.bool
    assert inputs.prepare(2, 3) is inputs  # no second check for the same shape
    assert inputs.replace(edges=None, output_attentions=True).prepared_for == (2, 3)
    assert inputs.replace(attention_mask=torch.ones(2, 3)).prepared_for is None  # a new tensor: check again
    assert AttentionInputs(attention_mask=torch.ones(2, 3)).prepare(2, 3).attention_mask is None  # unpadded


def test_model_builds_inputs_once_for_every_layer():
    """The text model hands every core the same prepared AttentionInputs object; the specs never change."""
    config = hf_efficient.EfficientBertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32
    )
    model = hf_efficient.EfficientBertModel(config).eval()
    specs = [core.spec for core in model.attention_cores()]
    seen = []
    for core in model.attention_cores():
        core.register_forward_pre_hook(lambda core, args: seen.append(args[3]))
    model(torch.randint(0, 50, (2, 9)), attention_mask=torch.tensor([[1] * 9, [1] * 6 + [0] * 3]))
    assert len(seen) == 3 and all(inputs is seen[0] for inputs in seen)
    assert seen[0].prepared_for == (2, 9) and seen[0].attention_mask.dtype == torch.bool
    assert [core.spec for core in model.attention_cores()] == specs


def test_readme_attention_table_is_the_registry_table():
    """README's table is generated (python -m hf_efficient.attention --update README.md): it lists exactly the
    registered types with each core's facts."""
    from hf_efficient.attention.__main__ import with_table

    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    assert with_table(readme, hf_efficient.attention_table()) == readme
    for name in ALL_TYPES:
        cls = get_attention_class(name)
        assert cls.paper and cls.cost and cls.summary, f"{name} lacks a fact the table shows"
        assert f"| `{name}` | {cls.paper} | {cls.cost} |" in readme
