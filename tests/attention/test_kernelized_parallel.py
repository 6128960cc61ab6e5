"""The whole-sequence ("parallel") engine of linear / performer: where "auto" takes it, what it refuses, and
that it equals the reference where test_kernels does not reach (Performer's relu kernel causally, half
precision, lengths of many blocks) and on a GPU (marked ``gpu``: the device check runs them)."""

from __future__ import annotations

import types

import pytest
import torch

from hf_efficient.attention.kernels import kernelized_parallel

from .helpers import assert_close_with_gradients, kernel_quadratic_form, make_core, make_qkv, padding_mask


def _query(is_cuda: bool):  # what the kernels' predicates read of a query
    return types.SimpleNamespace(is_cuda=is_cuda, device=torch.device("cuda" if is_cuda else "cpu"))


def _inputs(causal: bool):
    return types.SimpleNamespace(is_causal=causal)


@pytest.mark.parametrize("attention_type", ["linear", "performer"])
def test_auto_takes_the_parallel_engine_on_cuda_and_the_chunked_one_elsewhere(attention_type):
    core = make_core(attention_type)
    assert [kernel.name for kernel in core.kernels] == ["parallel", "chunked", "fla"]
    assert core.kernel_for(_query(False), _inputs(False)).name == "chunked"
    assert core.kernel_for(_query(True), _inputs(False)).name == "parallel"
    # the causal form of a shifted feature map (Performer's softmax kernel) scans its blocks: chunked
    causal_choice = core.kernel_for(_query(True), _inputs(True)).name
    assert causal_choice == ("chunked" if attention_type == "performer" else "parallel")
    relu = make_core("performer", kernel="relu")
    assert relu.kernel_for(_query(True), _inputs(True)).name == "parallel"
    assert not kernelized_parallel.PARALLEL.traces  # while tracing: the chunked engine's one-chunk form


def test_forced_parallel_refuses_the_shifted_causal_form_and_says_why():
    core = make_core("performer", causal=True, implementation="parallel")
    q, k, v = make_qkv(n=10)
    with pytest.raises(
        ValueError, match=r"implementation='parallel' cannot compute this call: .*stabilising"
    ):
        core(q, k, v, is_causal=True)
    core(q, k, v)  # the non-causal form it computes


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("attention_type", "config"), [("linear", {}), ("performer", {"kernel": "relu"})])
def test_parallel_equals_the_explicit_quadratic_form(attention_type, config, causal):
    """float64, eps 0, 103 tokens in blocks of 8 (the last one short), padding in the middle and the end:
    outputs and gradients equal phi(Q) phi(K)^T V / normaliser written out with an (n x n) matrix."""
    core = make_core(attention_type, implementation="parallel", eps=0.0, block_size=8, **config)
    q, k, v = (t.double().requires_grad_() for t in make_qkv(b=2, n=103))
    mask = padding_mask([103, 90], 103)
    mask[1, 40] = False
    out = core(q, k, v, attention_mask=mask, is_causal=causal).output
    if attention_type == "linear":
        features = (torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1)
    else:
        w_t = core.projection_matrix.double().t() * core.config.num_features**-0.5
        features = (torch.relu(q @ w_t) + 1e-3, torch.relu(k @ w_t) + 1e-3)
    expected = kernel_quadratic_form(*features, v, mask, causal).masked_fill(~mask[:, None, :, None], 0.0)
    assert_close_with_gradients(out, expected, (q, k, v), atol=1e-9, rtol=1e-7)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("attention_type", ["linear", "performer"])
def test_parallel_in_bfloat16_stays_within_the_half_precision_tolerance(attention_type, causal):
    """Its products run in bfloat16 (the chunked engine's sums run in float32): outputs within the 0.05 that
    docs/gpu.md promises every type in bfloat16, against the float32 reference."""
    if attention_type == "performer" and causal:
        pytest.skip("performer's softmax kernel takes the chunked engine causally")
    core = make_core(attention_type, implementation="parallel", block_size=16)
    reference = make_core(attention_type, implementation="reference")
    reference.load_state_dict(core.state_dict())
    q, k, v = make_qkv(b=2, n=300, d=8)
    mask = padding_mask([300, 250], 300)
    want = reference(q, k, v, attention_mask=mask, is_causal=causal).output
    got = core(*(t.bfloat16() for t in (q, k, v)), attention_mask=mask, is_causal=causal).output
    assert got.dtype == torch.bfloat16
    assert (got.float() - want).abs().max() < 0.05


def test_parallel_causal_equals_reference_from_one_to_many_blocks():
    """Shorter than a block, exactly one, and many: the chunkwise prefix sums equal the quadratic form."""
    core = make_core("linear", implementation="parallel", block_size=16)
    reference = make_core("linear", implementation="reference")
    for n in (5, 16, 17, 160):
        q, k, v = make_qkv(b=1, n=n)
        torch.testing.assert_close(
            core(q, k, v, is_causal=True).output,
            reference(q, k, v, is_causal=True).output,
            atol=1e-5,
            rtol=1e-5,
        )


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("attention_type", "config"), [("linear", {}), ("performer", {"kernel": "relu"})])
def test_parallel_on_cuda_equals_reference_without_host_syncs(attention_type, config, causal):
    """On the GPU: "auto" takes the parallel engine, its forward + backward issue no host-device sync, and
    its outputs and gradients equal the reference's (float32) and stay within 0.05 of them in bfloat16."""
    core = make_core(attention_type, heads=4, head_dim=64, max_seq_len=4096, **config).cuda()
    reference = make_core(
        attention_type, heads=4, head_dim=64, max_seq_len=4096, implementation="reference", **config
    ).cuda()
    reference.load_state_dict(core.state_dict())
    q, k, v = (t.cuda().requires_grad_() for t in make_qkv(b=2, h=4, n=1000, d=64))
    mask = padding_mask([1000, 900], 1000).cuda()
    assert core.kernel_for(q, _inputs(causal)).name == "parallel"
    # no host sync in the engine (an unpadded call: a padding mask's values are checked once at the entry)
    torch.cuda.set_sync_debug_mode("error")
    try:
        core(q, k, v, is_causal=causal).output.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out = core(q, k, v, attention_mask=mask, is_causal=causal).output
    want = reference(q, k, v, attention_mask=mask, is_causal=causal).output
    assert_close_with_gradients(out, want, (q, k, v), atol=1e-3, rtol=1e-3)
    half = core(*(t.detach().bfloat16() for t in (q, k, v)), attention_mask=mask, is_causal=causal).output
    assert (half.float() - want).abs().max() < 0.05
