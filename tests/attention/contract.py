"""The attention contract as plain checks on a registered ``attention_type``: each takes the type's name,
builds its cores at their ``small_config`` and asserts one property every mechanism must have.

tests/attention/test_contract.py parametrises them over ``list_attention_types()``; a test that registers a
mechanism of its own runs them all with :func:`run_contract_matrix` (tests/attention/test_new_mechanism.py).
Cores that need edges get a random graph per batch item; cores that share queries and keys get key=query.
"""

from __future__ import annotations

import contextlib
import copy
import math
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hf_efficient
from hf_efficient.attention import AttentionSpec, GraphEdges, build_attention, get_attention_class
from hf_efficient.attention.base import ROTATE_QUERIES_AND_KEYS
from hf_efficient.attention.cache import EfficientCache
from hf_efficient.attention.packing import PackedSequences
from hf_efficient.attention.relative import RelativePositions

from .helpers import (
    adjacency_to_edges,
    make_core,
    make_qkv,
    padding_mask,
    reference_attention,
    relative_bias,
    relative_table,
    rotary_positions,
)

POISON = 1e9
STRIDED_LENGTHS = (4, 37)  # 4: one block at the small configs' sizes
# Packed sequences: many short ones (one padded call) and a long one (one call per sequence).
PACKED_LENGTHS = ((29, 5, 17), (128, 23))
PADDED_LENGTHS = (23, 40)


def graph_edges(core, lengths, n, item_seeds=None, device=None):
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
    edges = adjacency_to_edges(adj)
    edges.edge_index = edges.edge_index.to(device)
    return edges


def run(core, q, k, v, mask=None, lengths=None, item_seeds=None, **kwargs):
    """Call ``core`` honouring its declared needs: key=query if it shares them, a graph if it needs edges."""
    lengths = lengths or [q.shape[2]] * q.shape[0]
    if core.capabilities.shared_query_key:
        k = q
    edges = graph_edges(core, lengths, q.shape[2], item_seeds, q.device)
    return core(q, k, v, attention_mask=mask, edges=edges, **kwargs)


def check_shapes_finite_forward_backward(attention_type: str) -> None:
    """A padded batch in training mode: (b, h, n, d) finite outputs, no weights, finite non-zero gradients."""
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


def check_strided_inputs_same_outputs_and_gradients(attention_type: str, n: int) -> None:
    """The encoders hand over heads as (b, n, h, d) -> (b, h, n, d) views. With batch 1 a core's reshapes can
    keep such a view strided; outputs and gradients must equal those of dense inputs."""
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


def check_padding_invariance_with_poisoned_pads(attention_type: str, n_real: int) -> None:
    """Appending padding (filled with 1e9) must not move the outputs of real tokens by more than 1e-5; padded
    query rows are exactly 0."""
    core = make_core(attention_type)
    q, k, v = make_qkv(b=1, n=n_real)
    alone = run(core, q, k, v).output
    n_pad = n_real + 13
    qp, kp, vp = (torch.cat([t, torch.full((1, 2, 13, 8), POISON)], dim=2) for t in (q, k, v))
    mask = torch.arange(n_pad)[None] < n_real
    padded = run(core, qp, kp, vp, mask, lengths=[n_real]).output
    torch.testing.assert_close(padded[:, :, :n_real], alone, atol=1e-5, rtol=1e-5)
    assert (padded[:, :, n_real:] == 0).all(), "padded query rows must be exactly 0"


def check_packed_equals_each_sequence_alone(
    attention_type: str, lengths: tuple[int, ...], device: str = "cpu"
) -> None:
    """Sequences packed along one row with no padding (``AttentionInputs.packed``) give each sequence its
    outputs and gradients alone (1e-5), on ``device``; with a causal form, causally too. Long sequences run
    one call each, many short ones one padded call (PackedSequences.runs_per_sequence): ``lengths`` picks
    which."""
    packed = PackedSequences.from_lengths(lengths, device)
    q, k, v = (t.to(device).requires_grad_() for t in make_qkv(b=1, n=packed.total))
    core = make_core(attention_type)
    k = q if core.capabilities.shared_query_key else k
    pieces = [packed.split(t, 2) for t in (q, k, v)]
    alone_edges = [graph_edges(core, [n], n, [i], device=device) for i, n in enumerate(lengths)]
    edges = None
    if alone_edges[0] is not None:
        offsets = packed.cu_seqlens[:-1].tolist()
        edges = GraphEdges(
            torch.cat([e.edge_index + o for e, o in zip(alone_edges, offsets, strict=True)], 1)
        )
    causal_forms = (False, True) if get_attention_class(attention_type).capabilities.causal else (False,)
    for causal in causal_forms:
        core = make_core(attention_type, causal=causal).to(device)
        together = core(q, k, v, packed=packed, edges=edges, is_causal=causal).output
        alone = [
            core(qi, qi if k is q else ki, vi, edges=e, is_causal=causal).output
            for qi, ki, vi, e in zip(*pieces, alone_edges, strict=True)
        ]
        torch.testing.assert_close(together, torch.cat(alone, 2), atol=1e-5, rtol=1e-5)
        grad_out = torch.randn_like(together)
        used = [q, v] if k is q else [q, k, v]
        want = torch.autograd.grad((torch.cat(alone, 2) * grad_out).sum(), used)
        got = torch.autograd.grad((together * grad_out).sum(), used)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    rotary_mode = core.capabilities.rotary
    if rotary_mode is not None:  # rotary positions restart with each packed sequence, as alone

        def rotary(positions):  # (1, n) positions -> their rotation on the device
            cos_sin = rotary_positions(positions)
            return type(cos_sin)(cos_sin.cos.to(device), cos_sin.sin.to(device))

        within = torch.cat([torch.arange(n) for n in lengths])[None]  # (1, T)
        core = make_core(attention_type).to(device)
        together = core(q, k, v, packed=packed, rotary=rotary(within)).output
        alone = [
            core(qi, qi if k is q else ki, vi, rotary=rotary(torch.arange(n)[None])).output
            for qi, ki, vi, n in zip(*pieces, lengths, strict=True)
        ]
        torch.testing.assert_close(together, torch.cat(alone, 2), atol=1e-5, rtol=1e-5)


def check_batch_independence(attention_type: str) -> None:
    """Each batch item's output equals the item run alone."""
    core = make_core(attention_type)
    q, k, v = make_qkv(b=3, n=29)
    together = run(core, q, k, v).output
    for i in range(3):
        alone = run(core, q[i : i + 1], k[i : i + 1], v[i : i + 1], item_seeds=[i]).output
        torch.testing.assert_close(together[i : i + 1], alone, atol=1e-5, rtol=1e-5)


def check_eval_is_deterministic(attention_type: str) -> None:
    """In eval mode the same inputs give the same outputs, whatever the global RNG."""
    core = make_core(attention_type)
    q, k, v = make_qkv(n=33)
    first = run(core, q, k, v).output
    torch.manual_seed(123)  # a changed global RNG must not matter in eval
    second = run(core, q, k, v).output
    assert torch.equal(first, second)


def check_permutation_equivariance(attention_type: str) -> None:
    """For a type declaring ``permutation_equivariant``: permuting the tokens (and relabelling the graph's
    nodes) permutes the outputs."""
    core = make_core(attention_type)
    assert core.capabilities.permutation_equivariant, f"{attention_type} does not declare equivariance"
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


def check_save_load_identical_outputs(attention_type: str, folder: Path | None = None) -> None:
    """Round trip through safetensors into a core built on the meta device, as from_pretrained does."""
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return check_save_load_identical_outputs(attention_type, Path(tmp))
    torch.manual_seed(1)
    core = make_core(attention_type)
    q, k, v = make_qkv(n=31)
    expected = run(core, q, k, v).output
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / "core.safetensors"
    save_file({name: t.contiguous() for name, t in core.state_dict().items()}, str(path))

    torch.manual_seed(2)  # different random state at construction time
    with torch.device("meta"):
        fresh = make_core(attention_type)
    fresh = fresh.to_empty(device="cpu")
    fresh.init_weights()
    fresh.load_state_dict(load_file(str(path)), strict=True)
    fresh.eval()
    torch.testing.assert_close(run(fresh, q, k, v).output, expected, atol=0, rtol=0)


def check_same_outputs_and_gradients_on(attention_type: str, device: str) -> None:
    """The core moved to ``device`` (e.g. "cuda") gives the CPU's outputs and gradients on a padded batch,
    within float32 rounding (TF32 matmuls and convolutions are switched off for the call)."""
    core = make_core(attention_type)
    lengths = [37, 30]
    q, k, v = make_qkv(b=2, n=37, requires_grad=True)
    mask = padding_mask(lengths, 37)
    expected = run(core, q, k, v, mask, lengths=lengths).output
    grad_out = torch.randn_like(expected)
    used = [q, v] if core.capabilities.shared_query_key else [q, k, v]
    expected_grads = torch.autograd.grad((expected * grad_out).sum(), used)

    moved = copy.deepcopy(core).to(device)
    q_d, k_d, v_d = (t.detach().to(device).requires_grad_() for t in (q, k, v))
    if core.capabilities.shared_query_key:
        k_d = q_d
    edges = graph_edges(core, lengths, 37)
    edges = None if edges is None else GraphEdges(edges.edge_index.to(device))
    matmul_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            got = moved(q_d, k_d, v_d, attention_mask=mask.to(device), edges=edges).output
            used_d = [q_d, v_d] if core.capabilities.shared_query_key else [q_d, k_d, v_d]
            grads = torch.autograd.grad((got * grad_out.to(device)).sum(), used_d)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
    assert got.device.type == torch.device(device).type
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-4)
    for g, w in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-4)


def traced_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every core take the code path it takes under torch.export / torch.compile (one piece, plain
    autograd) while running eagerly: ``is_tracing()`` asks ``torch.compiler.is_compiling()``."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)


def _padded_call(core, n: int, lengths: list[int]):
    """Outputs and the gradients of q and v (and k unless shared) of one padded batch through ``core``."""
    q, k, v = make_qkv(b=len(lengths), n=n, requires_grad=True)
    mask = padding_mask(lengths, n)
    out = run(core, q, k, v, mask, lengths=lengths).output
    used = [q, v] if core.capabilities.shared_query_key else [q, k, v]
    return out, torch.autograd.grad(out.square().sum(), used)


TRACED_SIZES = ((37, [37, 30]), (61, [40, 61]))  # padded batches, several blocks / chunks / segments


def _assert_same_padded_calls(core, other, context=contextlib.nullcontext) -> None:
    """``other`` (inside ``context()``) gives ``core``'s outputs and gradients on the TRACED_SIZES batches."""
    for n, lengths in TRACED_SIZES:
        torch.manual_seed(0)  # reformer_lsh draws its training rotations from the global RNG
        expected, expected_grads = _padded_call(core, n, lengths)
        with context():
            torch.manual_seed(0)
            got, grads = _padded_call(other, n, lengths)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        for g, w in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def check_traced_form_matches_eager(attention_type: str) -> None:
    """The form a traced graph computes (every chunk at once, layouts built in the graph, no custom autograd
    Function) gives the eager form's outputs and gradients on padded batches, in training mode (dropout 0)."""

    @contextlib.contextmanager
    def traced():
        with pytest.MonkeyPatch.context() as patch:
            traced_form(patch)
            yield

    core = make_core(attention_type).train()
    _assert_same_padded_calls(core, core, traced)


def check_compiles_fullgraph(attention_type: str) -> None:
    """``torch.compile(fullgraph=True, dynamic=True)`` traces the core with no graph break, and the compiled
    call gives the eager outputs and gradients at two lengths. Backend ``eager``: dynamo's capture is what
    only this check covers; AOT autograd's trace of the same plain autograd ops (backend ``aot_eager``, four
    times the time) adds nothing of ours (the traced form is checked against eager above)."""
    import torch._dynamo

    core = make_core(attention_type).train()
    torch._dynamo.reset()
    _assert_same_padded_calls(core, torch.compile(core, fullgraph=True, dynamic=True, backend="eager"))


def check_unsupported_inputs_raise(attention_type: str) -> None:
    """Every input the core does not declare, wrong ranks, head sizes and mask shapes raise a ValueError
    naming the type or the problem."""
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
    if not caps.requires_edges:  # all padding is no error: zero rows (tests/attention/test_empty_rows.py)
        assert (core(q, k, v, attention_mask=torch.zeros(2, 16)).output == 0).all()
    if caps.requires_edges:
        with pytest.raises(ValueError, match="needs `edges`"):
            core(q, k, v)
        with pytest.raises(ValueError, match="positions"):
            core(q, k, v, edges=GraphEdges(torch.tensor([[0, 40], [1, 2]])))
        with pytest.raises(ValueError, match="no edges"):
            core(q, k, v, edges=GraphEdges(torch.zeros(2, 0, dtype=torch.long)))


DECODE_LENGTH = 23
# How the causal-decoding check feeds the sequence to a cache: a prompt (parallel form), single tokens, then
# a chunk of several tokens after a state (chunked prefill), then single tokens again.
DECODE_PIECES = ((0, 7), *((t, t + 1) for t in range(7, 12)), (12, 17), *((t, t + 1) for t in range(17, 23)))


def decode_padding_mask() -> torch.Tensor:
    """(2, DECODE_LENGTH) bool: row 0 padded on the left (5 tokens), row 1 on the right (after 17 tokens),
    so the prompt, single padded steps and a chunk all meet padding."""
    mask = torch.ones(2, DECODE_LENGTH, dtype=torch.bool)
    mask[0, :5] = False
    mask[1, 17:] = False
    return mask


def check_causal_decoding_matches_parallel(attention_type: str, relative: bool = False) -> None:
    """A causal type decodes from a cache exactly as its parallel causal form computes the whole sequence:
    prompt, single tokens and a chunk (DECODE_PIECES) against one pass, left and right padding, outputs at
    real positions equal to 1e-5 (float32), padded ones 0; the cache counts every token. Types without a
    causal form refuse a cache with the list of those that have one. ``relative``: both with BERT's relative
    position scores (``relative_key_query``; for types that declare them)."""
    core = (
        make_core(attention_type, causal=True)
        if get_attention_class(attention_type).capabilities.causal
        else None
    )
    if core is None:
        core = make_core(attention_type)
        with pytest.raises(ValueError, match="Causal attention types: .*full"):
            core.new_cache_layer()
        return
    q, k, v = make_qkv(b=2, n=DECODE_LENGTH)
    if core.capabilities.shared_query_key:
        k = q
    mask = decode_padding_mask()
    extra = {"relative_positions": RelativePositions(relative_table(), keys_too=True)} if relative else {}
    expected = core(q, k, v, attention_mask=mask, is_causal=True, **extra).output
    cache = EfficientCache.for_cores([core])
    pieces = []
    for start, stop in DECODE_PIECES:
        part = slice(start, stop)
        out = core(
            q[:, :, part],
            k[:, :, part],
            v[:, :, part],
            attention_mask=mask[:, part],
            is_causal=True,
            cache=cache,
            **extra,
        )
        pieces.append(out.output)
    decoded = torch.cat(pieces, dim=2)
    real = mask[:, None, :, None].expand_as(expected)
    torch.testing.assert_close(decoded[real], expected[real], atol=1e-5, rtol=1e-5)
    assert (decoded[~real] == 0).all()
    assert cache.get_seq_length() == DECODE_LENGTH


def check_relative_positions(attention_type: str) -> None:
    """A type declaring ``relative_positions`` adds BERT's relative position scores (``relative_key`` and
    ``relative_key_query``) to its own: in its limiting case (the length it covers whole; any length for an
    exact type) its outputs and the table's gradient equal exact attention with the scores written out as
    transformers 4's BERT forms them (1e-5), on a padded batch; its causal form decodes with them from a
    cache as in parallel. A type declaring none refuses them, naming why and the types that can."""
    core = make_core(attention_type)
    if not core.capabilities.relative_positions:
        q, k, v = make_qkv(b=2, n=16)
        relative = RelativePositions(relative_table())
        pattern = f"{attention_type} cannot add relative position scores \\(relative_key\\): .+ can: .*full"
        with pytest.raises(ValueError, match=pattern):
            run(core, q, k, v, relative_positions=relative)
        return
    n = core.covered_length() or 29
    for keys_too in (False, True):
        table = relative_table()
        q, k, v = make_qkv(b=2, n=n, requires_grad=True)
        mask = padding_mask([n, n - 2], n)
        out = run(core, q, k, v, mask, relative_positions=RelativePositions(table, keys_too)).output
        expected = reference_attention(q, k, v, mask, bias=relative_bias(table, q, k, keys_too))
        real = mask[:, None, :, None].expand_as(out)
        torch.testing.assert_close(out[real], expected.float()[real], atol=1e-5, rtol=1e-5)
        grad_out = torch.randn_like(out) * real
        got = torch.autograd.grad((out * grad_out).sum(), [table, q, k])
        want = torch.autograd.grad((expected.float() * grad_out).sum(), [table, q, k])
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    if core.capabilities.causal:
        check_causal_decoding_matches_parallel(attention_type, relative=True)


def check_rotary_positions_carried_or_refused(attention_type: str) -> None:
    """Rotary positions (RoPE) are carried or refused naming why. A type that carries them depends on relative
    positions only (every position shifted: the same outputs), on a padded batch; with every token at one
    position (no rotation between any pair) it is the type without them; and they do change its outputs.
    A type that rotates queries and keys computes what it computes on rotated ones. (Exactness: at a covered
    length against exact attention with RoPE, and for the kernelized types against RoFormer's eq. 19, in
    tests/attention/test_rotary.py.)"""
    cls = get_attention_class(attention_type)
    core = make_core(attention_type)
    lengths = [29, 21]
    q, k, v = make_qkv(b=2, n=29)
    mask = padding_mask(lengths, 29)
    positions = torch.arange(29)[None]
    rotary = rotary_positions(positions)
    if cls.capabilities.rotary is None:
        assert attention_type not in hf_efficient.rotary_attention_types()
        with pytest.raises(ValueError, match=f"{attention_type} cannot carry rotary positions: "):
            run(core, q, k, v, mask, lengths=lengths, rotary=rotary)
        return
    assert attention_type in hf_efficient.rotary_attention_types()
    out = run(core, q, k, v, mask, lengths=lengths, rotary=rotary).output
    shifted = run(core, q, k, v, mask, lengths=lengths, rotary=rotary_positions(positions + 17)).output
    torch.testing.assert_close(shifted, out, atol=1e-5, rtol=1e-5)
    plain = run(core, q, k, v, mask, lengths=lengths).output
    one_place = rotary_positions(torch.full_like(positions, 5))
    torch.testing.assert_close(run(core, q, k, v, mask, lengths=lengths, rotary=one_place).output, plain)
    assert (out - plain).abs().max() > 1e-2, "rotary positions changed nothing"
    if cls.capabilities.rotary == ROTATE_QUERIES_AND_KEYS:
        rotated = run(core, rotary.rotate(q), rotary.rotate(k), v, mask, lengths=lengths).output
        torch.testing.assert_close(out, rotated, atol=0, rtol=0)


def check_shared_query_key_enforced(attention_type: str) -> None:
    """A core that shares queries and keys refuses a separate key (nothing to check for the others)."""
    core = make_core(attention_type)
    if core.capabilities.shared_query_key:
        q, k, v = make_qkv(n=16)
        with pytest.raises(ValueError, match="key=query"):
            core(q, k, v)


def check_unknown_config_key_lists_valid_keys(attention_type: str) -> None:
    with pytest.raises(ValueError, match="Valid keys") as err:
        build_attention(attention_type, AttentionSpec(2, 8, max_seq_len=64), {"not_a_key": 1})
    assert "not_a_key" in str(err.value)


def check_no_weight_decay_names_own_parameters(attention_type: str) -> None:
    # a misspelt entry would leave its parameter decayed without a word: every name must be a parameter
    core = make_core(attention_type)
    assert set(core.no_weight_decay) <= dict(core.named_parameters(recurse=False)).keys()


def check_facts(attention_type: str) -> None:
    """The facts the docs table, model cards and benchmarks read: paper, cost, summary, a valid
    small_config, a FLOP model that is None or positive and grows with n, and the table row."""
    cls = get_attention_class(attention_type)
    assert cls.paper and cls.cost and cls.summary, f"{attention_type} lacks a fact the table shows"
    config = hf_efficient.validate_attention_config(attention_type, dict(cls.small_config))
    flops = [cls.forward_flops(n, 8, config) for n in (64, 256)]
    if flops[0] is not None:
        assert all(math.isfinite(f) and f > 0 for f in flops) and flops[1] > flops[0], flops
    assert f"| `{attention_type}` | {cls.paper} | {cls.cost} |" in hf_efficient.attention_table()


def run_contract_matrix(attention_type: str, folder: Path | None = None) -> None:
    """Every check above on ``attention_type`` (permutation equivariance only where it is declared).

    ``folder``: where the save/load check writes (a temporary folder if None).
    """
    check_facts(attention_type)
    check_unknown_config_key_lists_valid_keys(attention_type)
    check_shapes_finite_forward_backward(attention_type)
    for n in STRIDED_LENGTHS:
        check_strided_inputs_same_outputs_and_gradients(attention_type, n)
    for n_real in PADDED_LENGTHS:
        check_padding_invariance_with_poisoned_pads(attention_type, n_real)
    check_batch_independence(attention_type)
    for lengths in PACKED_LENGTHS:
        check_packed_equals_each_sequence_alone(attention_type, lengths)
    check_eval_is_deterministic(attention_type)
    if get_attention_class(attention_type).capabilities.permutation_equivariant:
        check_permutation_equivariance(attention_type)
    check_save_load_identical_outputs(attention_type, folder)
    check_unsupported_inputs_raise(attention_type)
    check_causal_decoding_matches_parallel(attention_type)
    check_relative_positions(attention_type)
    check_shared_query_key_enforced(attention_type)
    check_rotary_positions_carried_or_refused(attention_type)
    check_no_weight_decay_names_own_parameters(attention_type)
    check_traced_form_matches_eager(attention_type)
    check_compiles_fullgraph(attention_type)
