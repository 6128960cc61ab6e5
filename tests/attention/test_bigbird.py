"""BigBird (ITC) block-sparse attention: exact limits, the block pattern, the layout, the kernels against the
reference, upstream parity."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from transformers import BigBirdConfig as HFBigBirdConfig
from transformers.models.big_bird.modeling_big_bird import BigBirdBlockSparseAttention, BigBirdModel

from hf_efficient.attention import AttentionSpec, build_attention
from hf_efficient.attention.kernels import bigbird as kernels
from hf_efficient.attention.utils import ChunkBuffers

from .helpers import make_core, make_qkv, reference_attention


def token_pattern(core, lengths: list[int], n: int) -> torch.Tensor:
    """(b, h, n, n) allowed (query, key) pairs: each example's block layout expanded to tokens."""
    bs = core.config.block_size
    nb = -(-n // bs)
    patterns = []
    for length in lengths:
        m = -(-length // bs)
        layout = core.block_layout(m)
        counts = torch.zeros(core.num_heads, nb, nb, dtype=torch.long)  # (h, query block, key block)
        counts[:, :m].scatter_add_(-1, layout.index, layout.valid.long())
        assert counts.max() <= 1, "a key block is counted twice"
        blocks = counts > 0
        for g in layout.global_blocks:  # global rows see every key
            blocks[:, g, :] = True
        tokens = blocks.repeat_interleave(bs, 1).repeat_interleave(bs, 2)  # (h, nb * B, nb * B)
        patterns.append(tokens[:, :n, :n])
    return torch.stack(patterns)


def assert_real_rows_close(out, ref, lengths, atol=1e-5):
    for i, length in enumerate(lengths):
        torch.testing.assert_close(out[i, :, :length].double(), ref[i, :, :length], atol=atol, rtol=atol)


@pytest.mark.parametrize("n", [9, 37])
def test_all_blocks_global_equals_full(n):
    q, k, v = make_qkv(b=2, n=n)
    mask = torch.arange(n)[None] < torch.tensor([[n], [n - 5]])
    full = build_attention("full", AttentionSpec(2, 8)).eval()
    expected = full(q, k, v, attention_mask=mask).output
    for config in (
        dict(num_global_blocks_start=100, num_random_blocks=3),  # every block global (dense rows)
        dict(num_window_blocks=2 * 10 + 1, num_global_blocks_start=0, num_global_blocks_end=0),  # window
    ):
        out = make_core("bigbird", **config)(q, k, v, attention_mask=mask).output
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "config",
    [
        {},  # small_config: block 4, window 3, 1 + 1 global, 2 random
        dict(block_size=3, num_window_blocks=5, num_global_blocks_start=2, num_random_blocks=3),
        dict(num_global_blocks_start=0, num_global_blocks_end=0, num_random_blocks=1),
    ],
)
def test_matches_reference_on_block_pattern_with_padding_and_gradients(config):
    """Lengths not a multiple of the block, right padding, short rows where window and globals overlap."""
    core = make_core("bigbird", **config).train()  # dropout is 0: train mode must give the same maths
    lengths = [38, 27, 6]
    q, k, v = make_qkv(b=3, n=38, requires_grad=True)
    mask = torch.arange(38)[None] < torch.tensor(lengths)[:, None]
    out = core(q, k, v, attention_mask=mask).output
    allowed = token_pattern(core, lengths, 38)
    ref = reference_attention(q, k, v, mask, allowed=allowed)
    assert_real_rows_close(out, ref, lengths)
    assert not allowed[0, 0].all(), "the pattern must actually be sparse at this length"
    grad_out = torch.randn_like(out).masked_fill(~mask[:, None, :, None], 0.0)
    grads = torch.autograd.grad((out * grad_out).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * grad_out.double()).sum(), (q, k, v))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=1e-5)


def test_backward_gradcheck_with_dropout_in_chunks(monkeypatch):
    """Both recomputing backwards against finite differences: seeded dropout masks, and chunks of 4 and 2
    query blocks (6 blocks) in the sparse rows and of 4 and 1 heads in the dense global rows, so each
    last chunk works in views of the first one's reused buffers."""
    monkeypatch.setattr("hf_efficient.attention.kernels.bigbird.rows_per_chunk", lambda *args: 4)
    spec = AttentionSpec(5, 3, dropout=0.3)
    core = build_attention("bigbird", spec, dict(block_size=3, num_random_blocks=1)).train()
    q, k, v = (t.double() for t in make_qkv(b=1, h=5, n=17, d=3))
    mask = torch.arange(17)[None] < 16

    def run(q, k, v):
        torch.manual_seed(5)  # the same dropout masks on every call
        return core(q, k, v, attention_mask=mask).output

    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(run, inputs, eps=1e-6, atol=1e-5, fast_mode=True)
    assert not torch.equal(run(q, k, v), core.eval()(q, k, v, attention_mask=mask).output), (
        "dropout must act in training"
    )


@pytest.mark.parametrize(
    ("config", "budget"),
    [({}, 11000), (dict(block_size=3, num_window_blocks=5, num_global_blocks_end=0), 4000)],
)
def test_native_kernel_equals_reference_over_several_chunks(config, budget, monkeypatch):
    """The native kernels chunk only past CHUNK_BUDGET bytes, which the shared kernel tests' lengths do not
    reach: with a small budget both functions run several chunks (the dense rows' last one shorter) against
    the reference's one piece, with padding, on outputs and gradients."""
    steps, rows_per_chunk = [], kernels.rows_per_chunk

    def recorded(*args):
        steps.append(rows_per_chunk(*args))
        return steps[-1]

    monkeypatch.setattr(kernels, "CHUNK_BUDGET", budget)
    monkeypatch.setattr(kernels, "rows_per_chunk", recorded)
    lengths = [61, 44, 9]
    q, k, v = make_qkv(b=3, n=61)
    mask = torch.arange(61)[None] < torch.tensor(lengths)[:, None]
    results = []
    for implementation in ("reference", "native"):
        core = make_core("bigbird", implementation=implementation, **config)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = core(*leaves, attention_mask=mask).output
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        results.append([out, *torch.autograd.grad((out * grad_out).sum(), leaves)])
    nb = -(-61 // config.get("block_size", 4))
    assert len(steps) == 2 and steps[0] < nb and steps[1] < 3 * 2, steps  # query blocks, (example, head)s
    for want, got in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_auto_takes_flex_on_cuda_and_native_elsewhere():
    """implementation="auto": FlexAttention on CUDA (head size >= 16, no dropout), the native kernels
    elsewhere; while tracing the reference (the native kernels do not trace; test_contract compiles it)."""

    def query(is_cuda: bool, head_dim: int = 16):  # what the kernels' predicates read of a query
        return types.SimpleNamespace(
            is_cuda=is_cuda,
            device=torch.device("cuda" if is_cuda else "cpu"),
            shape=(1, 2, 8, head_dim),
            requires_grad=True,
        )

    core = make_core("bigbird")
    assert [kernel.name for kernel in core.kernels] == ["flex", "native"]
    assert core.kernel_for(query(False), None).name == "native"
    assert core.kernel_for(query(True), None).name == "flex"
    assert core.kernel_for(query(True, head_dim=8), None).name == "native"
    training = build_attention("bigbird", AttentionSpec(2, 16, dropout=0.1)).train()
    assert training.kernel_for(query(True), None).name == "native"
    assert not kernels.NATIVE.traces and kernels.FLEX.traces


def test_layout_window_global_and_random_blocks():
    core = make_core("bigbird", heads=4, num_random_blocks=3)
    m = 12
    layout = core.block_layout(m)
    assert layout.global_blocks == (0, m - 1)
    for head in range(4):
        for row in range(1, m - 1):
            keys = layout.index[head, row][layout.valid[head, row]].tolist()
            assert len(keys) == len(set(keys)), "a key block is counted twice"
            window = {row - 1, row, row + 1}
            random_blocks = set(keys) - window - {0, m - 1}
            assert window | {0, m - 1} <= set(keys)
            assert len(random_blocks) == 3
    assert not torch.equal(layout.index[0], layout.index[1]), "heads draw their own random blocks"
    # too few blocks left for the random draw: take fewer, never duplicate
    small = core.block_layout(5)
    keys = small.index[0, 2][small.valid[0, 2]].tolist()
    assert sorted(keys) == [0, 1, 2, 3, 4]


def test_layout_deterministic_per_seed_and_layer():
    def layout(seed=0, layer_idx=0):
        torch.manual_seed(seed + 17)  # the global RNG must not matter
        return make_core("bigbird", seed=seed, layer_idx=layer_idx).block_layout(16).index

    assert torch.equal(layout(), layout())
    assert not torch.equal(layout(), layout(seed=1))
    assert not torch.equal(layout(), layout(layer_idx=1))
    q, k, v = make_qkv(n=64)
    outputs = [make_core("bigbird", seed=s)(q, k, v).output for s in (0, 0, 1)]
    assert torch.equal(outputs[0], outputs[1])
    assert not torch.allclose(outputs[0], outputs[2])


def test_config_validation():
    for bad in (dict(block_size=0), dict(num_window_blocks=2), dict(num_random_blocks=-1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            build_attention("bigbird", AttentionSpec(2, 8), bad)


def hf_attention(heads, head_dim, block_size, num_random_blocks, seed=0):
    config = HFBigBirdConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        block_size=block_size,
        num_random_blocks=num_random_blocks,
        max_position_embeddings=512,
        attention_type="block_sparse",
    )
    torch.manual_seed(0)
    return BigBirdBlockSparseAttention(config, seed=seed)


def run_both(hf, core, hidden, mask):
    """transformers' layer and our core on the same q/k/v projections; outputs as (b, n, h * d)."""
    b, n, _ = hidden.shape
    h, d = core.num_heads, core.head_dim
    blocked, band, from_mask, to_mask = BigBirdModel.create_masks_for_block_sparse_attn(
        mask.float(), hf.block_size
    )
    theirs = hf(hidden, band, from_mask, to_mask, blocked, blocked)[0]
    q, k, v = (layer(hidden).view(b, n, h, d).transpose(1, 2) for layer in (hf.query, hf.key, hf.value))
    ours = core(q, k, v, attention_mask=mask).output.transpose(1, 2).reshape(b, n, h * d)
    return theirs, ours


@pytest.mark.parametrize("n, n_real", [(64, 64), (64, 61), (28, 27)])
def test_parity_with_transformers(n, n_real):
    """Same q/k/v weights, transformers' own random layout fed into ours: outputs agree.

    Where the definitions agree and where they cannot be made to:
    * Window (3 blocks), first + last block global, random blocks excluding window and global blocks, one
      softmax over their union: the same ITC pattern in both, so the outputs must match.
    * Their random layout replaces our draw (``core.random_key_blocks``), from their own sampler with their
      seed, in training mode (their forward re-seeds numpy with ``seed`` and draws exactly this; there is no
      dropout in their block-sparse path). Our own draw is uniform over all allowed blocks; theirs uses only
      the first 2r + 5 blocks and bars two more for rows 1 and -2, so our sampler cannot reproduce theirs.
    * Eval mode cannot be compared: there every random block points at block 0, which is already global,
      so block 0's keys enter their softmax r + 1 times; ours never counts a key twice.
    * num_random_blocks=0 cannot be compared: their code fails to reshape the empty random gather.
    * Padding only inside the last block: when whole blocks are padding they keep the global block at
      position nb - 1 (all padding, so no real token is global at the end) while ours moves it to the last
      real block. They mask with an additive -10000 (exp(-10000) = 0 in float32), we exclude keys.
    * n = 64 (16 blocks) and n = 28 (7 blocks) take two branches of their random-attention plan; their
      sampler itself fails (cannot fill r blocks) at e.g. 8 or 9 blocks with r = 2, so those are not used.
    """
    h, d, bs, r = 2, 8, 4, 2
    nb = n // bs
    hf = hf_attention(h, d, bs, num_random_blocks=r, seed=3).train()
    np.random.seed(3)  # what their forward does before drawing
    plan_from, plan_blocks = hf._get_rand_attn_plan(n, bs, r)
    random = hf._bigbird_block_rand_mask_with_head(n, n, bs, bs, h, plan_from, plan_blocks)
    random = torch.from_numpy(np.stack(random)).long()  # (h, nb - 2, r) for rows 1 .. nb - 2
    random = torch.cat([random[:, :1], random, random[:, :1]], 1)  # global rows: any blocks (dense there)
    core = build_attention("bigbird", AttentionSpec(h, d), dict(block_size=bs, num_random_blocks=r)).eval()
    core.random_key_blocks = lambda num_blocks, _: (  # (b, h, nb, r) and all of them drawn
        random.expand(len(num_blocks), -1, -1, -1),
        torch.ones(len(num_blocks), *random.shape, dtype=torch.bool),
    )
    layout = core.block_layout(nb)
    assert layout.valid[:, 1:-1, -r:].all(), "their random blocks never repeat window/global ones"
    hidden = torch.randn(2, n, h * d)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n_real:] = False
    with torch.no_grad():
        theirs, ours = run_both(hf, core, hidden, mask)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    del core.random_key_blocks  # our own random blocks differ from theirs, so the outputs must differ
    core.layouts.clear()
    with torch.no_grad():
        assert not torch.allclose(run_both(hf, core, hidden, mask)[1], theirs, atol=1e-3)


def test_chunk_buffers_reuse_memory_and_grow_when_asked():
    buffers = ChunkBuffers(torch.zeros(1, dtype=torch.float64))
    first = buffers("scores", (2, 3))
    smaller = buffers("scores", (1, 3))
    assert smaller.data_ptr() == first.data_ptr() and smaller.shape == (1, 3)
    assert smaller.dtype == torch.float64
    assert buffers("scores", (4, 3)).shape == (4, 3)
    assert buffers("other", (2,)).data_ptr() != buffers("scores", (2,)).data_ptr()
    assert buffers("keep", (2, 3), torch.bool).dtype == torch.bool
