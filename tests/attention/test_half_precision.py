"""Half precision: every registered type runs forward and backward in bfloat16 and float16, as a core cast
to the dtype and under autocast, within a stated tolerance of float32.

The float32 reference runs on the same inputs and parameters rounded to the half dtype, so the difference
is the core's own arithmetic (for LSH, rounded inputs could otherwise move tokens between buckets).
Tolerances: the largest absolute difference of the outputs for unit-variance inputs, 0.05 in bfloat16
(8-bit mantissa: one rounding is ~0.004 relative) and 0.01 in float16 (11 bits).
"""

from __future__ import annotations

import pytest
import torch

import hf_efficient
from hf_efficient import EfficientBertConfig, EfficientBertForMaskedLM

from .contract import run
from .helpers import make_core, make_qkv, padding_mask

TOLERANCE = {torch.bfloat16: 0.05, torch.float16: 0.01}
MODES = [("cast", torch.bfloat16), ("autocast", torch.bfloat16), ("cast", torch.float16)]


def cases():
    for attention_type in hf_efficient.list_attention_types():
        causal = (
            [False, True] if hf_efficient.get_attention_class(attention_type).capabilities.causal else [False]
        )
        for mode, dtype in MODES:
            for is_causal in causal:
                yield attention_type, mode, dtype, is_causal


def run_half(attention_type, mode, dtype, is_causal, device="cpu", head_dim=8):
    """(half-precision output, float32 reference output, the inputs' gradients)."""
    reference = make_core(attention_type, head_dim=head_dim, causal=is_causal).to(device)
    rounded = {name: t.to(dtype).to(t.dtype) for name, t in reference.state_dict().items()}
    reference.load_state_dict(rounded)
    q, k, v = (t.to(device=device, dtype=dtype).float() for t in make_qkv(b=2, n=37, d=head_dim))
    lengths = [37, 30]
    mask = padding_mask(lengths, 37).to(device)

    def call(core, q, k, v):
        return run(core, q, k, v, mask, lengths=lengths, is_causal=is_causal).output

    with torch.no_grad():
        expected = call(reference, q, k, v)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    if mode == "cast":
        core = make_core(attention_type, head_dim=head_dim, causal=is_causal).to(device=device, dtype=dtype)
        core.load_state_dict(rounded)
        out = call(core, *(t.to(dtype) for t in leaves))
    else:
        with torch.autocast(device, dtype=dtype):
            out = call(reference, *leaves)
    out.float().square().sum().backward()
    return out, expected, [t.grad for t in leaves]


@pytest.mark.parametrize(("attention_type", "mode", "dtype", "is_causal"), list(cases()))
def test_forward_backward_in_half_precision(attention_type, mode, dtype, is_causal):
    out, expected, grads = run_half(attention_type, mode, dtype, is_causal)
    assert out.dtype == dtype
    error = (out.float() - expected).abs().max().item()
    assert error < TOLERANCE[dtype], f"{attention_type} {mode} {dtype}: max error {error:.3g}"
    used = grads[::2] if make_core(attention_type).capabilities.shared_query_key else grads
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in used)


@pytest.mark.parametrize("attention_type", hf_efficient.list_attention_types("text"))
@pytest.mark.parametrize("mode", ["cast", "autocast"])
def test_text_model_trains_in_bfloat16(attention_type, mode):
    """A whole MLM step: finite loss close to float32's, finite gradients everywhere."""
    config = EfficientBertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        attention_type=attention_type,
        attention_config=hf_efficient.get_attention_class(attention_type).small_config,
    )
    torch.manual_seed(0)
    model = EfficientBertForMaskedLM(config).eval()  # eval: no dropout, fixed random state
    ids = torch.randint(0, 64, (2, 24))
    labels = torch.where(torch.rand(2, 24) < 0.3, ids, -100)
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, 18:] = 0
    reference = model(ids, attention_mask=mask, labels=labels).loss.item()
    if mode == "cast":
        model = model.to(torch.bfloat16)
        loss = model(ids, attention_mask=mask, labels=labels).loss
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss) and abs(loss.item() - reference) < 0.05 * abs(reference)
    grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(("attention_type", "mode", "dtype", "is_causal"), list(cases()))
def test_forward_backward_in_half_precision_on_cuda(attention_type, mode, dtype, is_causal):
    # head size 16: the FlexAttention kernels that "auto" picks on CUDA want at least 16
    out, expected, grads = run_half(attention_type, mode, dtype, is_causal, device="cuda", head_dim=16)
    assert out.dtype == dtype
    error = (out.float() - expected).abs().max().item()
    assert error < 2 * TOLERANCE[dtype], f"{attention_type} {mode} {dtype}: max error {error:.3g}"
    assert all(torch.isfinite(g).all() for g in grads if g is not None)
