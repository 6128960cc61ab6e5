"""A sequence with no real token (a batch of real data padded to a common length can hold one): every type
gives exactly 0 for that row, finite outputs and gradients for the others, and the others unchanged."""

from __future__ import annotations

import pytest
import torch

import hf_efficient

from .contract import run
from .helpers import make_core, make_qkv, padding_mask


@pytest.mark.parametrize("attention_type", hf_efficient.list_attention_types())
def test_a_fully_padded_row_is_zero_and_changes_nothing_else(attention_type):
    core = make_core(attention_type)
    q, k, v = make_qkv(b=3, n=21)
    lengths = [21, 0, 15]  # the second sequence is all padding
    mask = padding_mask(lengths, 21)

    def poisoned(poison):
        leaves = [t.clone() for t in (q, k, v)]
        for t in leaves:
            t[1] = poison  # whatever a padded row holds must not matter
            t.requires_grad_()
        out = run(core, *leaves, mask, lengths=lengths).output  # a random graph per row for edge types
        out.square().sum().backward()
        return out, [t.grad for t in leaves]

    out, grads = poisoned(1e9)
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    assert all(torch.isfinite(g).all() and (g[1] == 0).all() for g in grads if g is not None)
    other, _ = poisoned(-3.0)
    torch.testing.assert_close(out, other, atol=0, rtol=0)  # the real rows never see the empty one
    keep = [0, 2]  # and are what they are without it in the batch (the same graphs: item seeds 0 and 2)
    alone = run(core, q[keep], k[keep], v[keep], mask[keep], lengths=[21, 15], item_seeds=keep).output
    torch.testing.assert_close(out[keep], alone, atol=1e-5, rtol=1e-5)
