"""Reformer LSH attention against dense oracles, HF's LSHSelfAttention, and its randomness rules."""

import math

import pytest
import torch
import torch.nn.functional as F

from hf_efficient.attention import AttentionSpec, build_attention
from hf_efficient.attention.kernels import reformer_lsh as lsh_kernel

from .helpers import make_core, make_qkv, padding_mask, reference_attention


def not_self(n):
    return ~torch.eye(n, dtype=torch.bool)


def lsh(q, v, mask=None, core=None, **config):
    core = core if core is not None else make_core("reformer_lsh", **config)
    return core(q, q, v, attention_mask=mask).output


def union_of_windows(core, q, mask=None):
    """Brute-force (b, h, n, n) pattern: j in the window of i in any round (same bucket, <= 1 chunk back)."""
    b, h, n, _ = q.shape
    chunk = core.config.chunk_length
    big_n = n + (-n) % chunk
    num_buckets = core.num_buckets_for(n if mask is None else int(mask.sum(-1).max()))
    rotations = core.rotations(num_buckets, q.device, q.dtype)
    padded = F.pad(q, (0, 0, 0, big_n - n))
    full_mask = None if mask is None else F.pad(mask, (0, big_n - n))
    rows = padded.reshape(b * h, big_n, -1)
    heads = torch.arange(b * h) % h
    row_mask = None if mask is None else full_mask.repeat_interleave(h, 0)
    buckets = core.hash_buckets(rows, rotations, heads, num_buckets, row_mask).view(b, h, -1, big_n)
    allowed = torch.zeros(b, h, big_n, big_n, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for bucket_ids in buckets[bi, hi]:
                order = sorted(range(big_n), key=lambda t: (int(bucket_ids[t]), t))
                chunk_of = {t: slot // chunk for slot, t in enumerate(order)}
                for i in range(big_n):
                    for j in range(big_n):
                        same = bucket_ids[i] == bucket_ids[j]
                        if same and 0 <= chunk_of[i] - chunk_of[j] <= 1:
                            allowed[bi, hi, i, j] = True
    allowed = allowed[..., :n, :n] & not_self(n)
    alone = ~allowed.any(-1, keepdim=True)  # no other key: the token attends to itself
    return allowed | (alone & ~not_self(n))


@pytest.mark.parametrize("num_hashes", [1, 3])
@pytest.mark.parametrize("num_buckets", [1, None])
def test_one_bucket_one_chunk_is_dense_attention_without_self(num_hashes, num_buckets):
    # num_buckets=None picks one bucket because the 37 tokens fit in one chunk of 64
    q, _, v = make_qkv(n=37)
    out = lsh(q, v, num_hashes=num_hashes, num_buckets=num_buckets, chunk_length=64)
    ref = reference_attention(q, F.normalize(q, dim=-1), v, allowed=not_self(37))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_hash_rounds_with_one_bucket_agree():
    """With one bucket every round sees the same windows; de-duplication keeps the answer unchanged."""
    q, _, v = make_qkv(n=29)
    one = lsh(q, v, num_hashes=1, num_buckets=1, chunk_length=4)
    four = lsh(q, v, num_hashes=4, num_buckets=1, chunk_length=4)
    torch.testing.assert_close(four, one, atol=1e-6, rtol=1e-6)
    # and that is local attention over the own and previous chunk of 4 (not dense attention)
    chunk_index = torch.arange(29) // 4
    gap = chunk_index[:, None] - chunk_index[None, :]
    allowed = (gap >= 0) & (gap <= 1) & not_self(29)
    ref = reference_attention(q, F.normalize(q, dim=-1), v, allowed=allowed)
    torch.testing.assert_close(one.double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_hashes", [1, 2, 3])
def test_matches_softmax_over_union_of_hashed_windows(num_hashes):
    """Multi-round output == exact softmax over the union of all rounds' windows (paper's de-duplication)."""
    core = make_core("reformer_lsh", num_hashes=num_hashes, chunk_length=3, num_buckets=4)
    q, _, v = make_qkv(b=2, n=22, seed=3)
    mask = torch.ones(2, 22, dtype=torch.bool)
    mask[1, 17:] = False
    out = lsh(q, v, mask, core=core)
    allowed = union_of_windows(core, q, mask)
    ref = reference_attention(q, F.normalize(q, dim=-1), v, mask, allowed=allowed)
    torch.testing.assert_close(out[0].double(), ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1, :, :17].double(), ref[1, :, :17], atol=1e-5, rtol=1e-5)
    assert not allowed[0].all(), "the hashed windows must actually restrict attention"


def test_buckets_are_argmax_over_rotations_and_their_negation():
    core = make_core("reformer_lsh", num_buckets=6)
    q, _, _ = make_qkv(b=1, n=20)
    rotations = core.rotations(6, q.device, q.dtype)  # (h, d, R, 3)
    buckets = core.hash_buckets(q[0], rotations, torch.arange(2), 6, None)  # (h, R, n)
    projected = torch.einsum("hnd,hdrk->hrnk", q[0], rotations)
    expected = torch.cat([projected, -projected], -1).argmax(-1)
    assert torch.equal(buckets, expected)
    assert buckets.unique().numel() > 2


def test_uneven_batch_matches_each_sequence_alone():
    core = make_core("reformer_lsh", chunk_length=5, num_buckets=4, num_hashes=3)
    q, _, v = make_qkv(b=2, n=31)
    mask = torch.ones(2, 31, dtype=torch.bool)
    mask[0, 19:] = False
    together = lsh(q, v, mask, core=core)
    alone = lsh(q[:1, :, :19], v[:1, :, :19], core=core)
    torch.testing.assert_close(together[:1, :, :19], alone, atol=1e-5, rtol=1e-5)
    assert (together[0, :, 19:] == 0).all()
    torch.testing.assert_close(together[1:], lsh(q[1:], v[1:], core=core), atol=1e-5, rtol=1e-5)


def test_auto_buckets_follow_the_real_length_so_padding_is_invisible():
    core = make_core("reformer_lsh", chunk_length=4, num_buckets=None)
    assert [core.num_buckets_for(n) for n in (3, 4, 5, 37, 16384)] == [1, 1, 2, 18, 8192]
    q, _, v = make_qkv(b=1, n=30)
    padded_q, padded_v = (torch.cat([t, torch.full((1, 2, 11, 8), 1e9)], 2) for t in (q, v))
    mask = torch.arange(41)[None] < 30
    torch.testing.assert_close(lsh(padded_q, padded_v, mask, core=core)[:, :, :30], lsh(q, v, core=core))


def test_eval_is_deterministic_and_depends_on_seed_and_layer():
    q, _, v = make_qkv(n=40)
    base = lsh(q, v)
    torch.manual_seed(7)
    assert torch.equal(lsh(q, v), base)  # a rebuilt core (as after reloading) gives identical outputs
    assert not torch.allclose(lsh(q, v, seed=1), base)
    other_layer = make_core("reformer_lsh", layer_idx=1)
    assert not torch.allclose(lsh(q, v, core=other_layer), base)


def test_training_draws_fresh_rotations_from_the_global_rng():
    core = make_core("reformer_lsh").train()
    q, _, v = make_qkv(n=40)
    torch.manual_seed(0)
    first, second = lsh(q, v, core=core), lsh(q, v, core=core)
    assert not torch.allclose(first, second)
    torch.manual_seed(0)
    assert torch.equal(lsh(q, v, core=core), first)  # reproducible like dropout
    assert not torch.allclose(first, lsh(q, v, core=core.eval()))


@pytest.mark.parametrize("implementation", ["reference", "chunked"])
def test_gradients_match_finite_differences(implementation):
    config = {"chunk_length": 3, "num_buckets": 4, "num_hashes": 2}
    core = make_core("reformer_lsh", implementation=implementation, **config)
    q, _, v = make_qkv(b=1, n=11, seed=1)
    q, v = q.double().requires_grad_(), v.double().requires_grad_()
    mask = torch.arange(11)[None] < 9
    assert torch.autograd.gradcheck(
        lambda q, v: core(q, q, v, attention_mask=mask).output, (q, v), fast_mode=True
    )


@pytest.mark.parametrize("num_hashes", [1, 2, 3])
@pytest.mark.parametrize("training", [False, True])
def test_chunked_kernel_equals_reference_over_several_slices_and_tiles(monkeypatch, num_hashes, training):
    """The kernel slices heads and tiles chunks only past sizes the contract tests reach: shrink both budgets
    to one head per slice and one chunk per tile. Training draws the rotations from the pinned global RNG."""
    monkeypatch.setattr(lsh_kernel, "CHUNK_BYTES", 1)
    monkeypatch.setattr(lsh_kernel, "TILE_BYTES", 1)
    config = {"num_hashes": num_hashes, "chunk_length": 3, "num_buckets": 4}
    q, _, v = make_qkv(b=2, n=29, seed=2)
    mask = padding_mask([29, 20], 29)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for implementation in ("reference", "chunked"):
        core = make_core("reformer_lsh", implementation=implementation, **config).train(training)
        leaves = [t.clone().requires_grad_() for t in (q, v)]
        torch.manual_seed(0)
        out = core(leaves[0], leaves[0], leaves[1], attention_mask=mask).output
        results.append([out, *torch.autograd.grad(out, leaves, grad)])
    for got, want in zip(*results[::-1], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_auto_runs_the_chunked_kernel_outside_tracing():
    core = make_core("reformer_lsh")
    assert core.kernel_for(make_qkv()[0], None) is lsh_kernel.CHUNKED


def test_matches_transformers_lsh_self_attention_in_one_chunk():
    """HF runs plain attention (keys q/|q|, no self) when the sequence fits a chunk; ours then has 1 bucket.

    HF scores are q . k without 1/sqrt(d): dividing its query_key weight by sqrt(d) matches our scaling.
    """
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import LSHSelfAttention

    h, d, n = 2, 8, 37
    config = ReformerConfig(
        hidden_size=h * d,
        num_attention_heads=h,
        attention_head_size=d,
        lsh_attn_chunk_length=64,
        num_hashes=1,
        num_buckets=2,
        lsh_num_chunks_before=1,
        lsh_num_chunks_after=0,
        is_decoder=False,
        lsh_attention_probs_dropout_prob=0.0,
        attn_layers=["lsh"],
        max_position_embeddings=64,
    )
    upstream = LSHSelfAttention(config).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, n, h * d, generator=g)
    w_query, w_value = (torch.randn(h * d, h * d, generator=g) * 0.5 for _ in range(2))
    with torch.no_grad():
        upstream.query_key.weight.copy_(w_query / math.sqrt(d))
        upstream.value.weight.copy_(w_value)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, 30:] = 0
    with torch.no_grad():
        expected = upstream(x, attention_mask=mask).hidden_states  # (b, n, h * d)
    q, v = ((x @ w.T).view(2, n, h, d).transpose(1, 2) for w in (w_query, w_value))  # (b, h, n, d)
    ours = lsh(q, v, mask.bool(), chunk_length=64, num_buckets=None).transpose(1, 2).reshape(2, n, h * d)
    torch.testing.assert_close(ours[0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours[1, :30], expected[1, :30], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"num_buckets": 3}, "num_buckets"),
        ({"num_buckets": 0}, "num_buckets"),
        ({"chunk_length": 0}, "chunk_length"),
        ({"num_hashes": 0}, "num_hashes"),
        ({"num_buckets": 2.5}, "num_buckets"),
    ],
)
def test_bad_config_raises(bad, field):
    with pytest.raises(ValueError, match=field):
        build_attention("reformer_lsh", AttentionSpec(2, 8), bad)


def test_dropout_only_in_training():
    core = build_attention("reformer_lsh", AttentionSpec(2, 8, dropout=0.5), {"chunk_length": 4})
    q, _, v = make_qkv(n=20)
    core.eval()
    assert torch.equal(lsh(q, v, core=core), lsh(q, v, core=core))
    core.train()
    torch.manual_seed(0)
    with_dropout = lsh(q, v, core=core)
    core.spec = AttentionSpec(2, 8)
    torch.manual_seed(0)
    assert not torch.allclose(with_dropout, lsh(q, v, core=core))
