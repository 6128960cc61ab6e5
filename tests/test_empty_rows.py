"""A sequence with no real token (a batch of real data padded to a common length can hold one): every type
gives exactly 0 for that row, finite outputs and gradients for the others, and the others unchanged."""

from __future__ import annotations

import pytest
import torch

import hf_efficient

from .helpers import call_core, make_core, make_qkv, random_graph_edges


@pytest.mark.parametrize("attention_type", hf_efficient.list_attention_types())
def test_a_fully_padded_row_is_zero_and_changes_nothing_else(attention_type):
    core = make_core(attention_type)
    q, k, v = make_qkv(b=3, n=21)
    mask = torch.ones(3, 21, dtype=torch.bool)
    mask[1] = False  # all padding
    mask[2, 15:] = False
    edges = random_graph_edges(3, 21, mask) if core.capabilities.requires_edges else None

    def run(poison):
        leaves = [t.clone() for t in (q, k, v)]
        for t in leaves:
            t[1] = poison  # whatever a padded row holds must not matter
            t.requires_grad_()
        out = call_core(core, *leaves, mask=mask, edges=edges).output
        out.square().sum().backward()
        return out, [t.grad for t in leaves]

    out, grads = run(1e9)
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    assert all(torch.isfinite(g).all() and (g[1] == 0).all() for g in grads if g is not None)
    other, _ = run(-3.0)
    torch.testing.assert_close(out, other, atol=0, rtol=0)  # the real rows never see the empty one
    if edges is None:  # and are what they are without it in the batch
        keep = [0, 2]
        alone = call_core(core, q[keep], k[keep], v[keep], mask=mask[keep]).output
        torch.testing.assert_close(out[keep], alone, atol=1e-5, rtol=1e-5)
