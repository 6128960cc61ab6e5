"""Exact attention through HF kernels against hand-written softmax attention."""

import pytest
import torch

from hf_efficient.attention import AttentionInputs, AttentionSpec, build_attention

from .helpers import assert_dropout_only_in_training, make_qkv, reference_attention


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_full_matches_reference(impl, causal):
    core = build_attention("full", AttentionSpec(2, 8, attn_implementation=impl)).eval()
    q, k, v = make_qkv(b=2, n=21)
    mask = torch.ones(2, 21, dtype=torch.bool)
    mask[0, 15:] = False
    bias = torch.randn(2, 2, 21, 21)
    out = core(q, k, v, attention_mask=mask, attention_bias=bias, is_causal=causal).output
    ref = reference_attention(q, k, v, mask, bias, causal=causal)
    torch.testing.assert_close(out[0, :, :15].double(), ref[0, :, :15], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1].double(), ref[1], atol=1e-5, rtol=1e-5)


def test_eager_and_sdpa_agree_and_weights_are_probabilities():
    q, k, v = make_qkv(b=2, n=17)
    eager = build_attention("full", AttentionSpec(2, 8, attn_implementation="eager")).eval()
    sdpa = build_attention("full", AttentionSpec(2, 8, attn_implementation="sdpa")).eval()
    out_e, w = eager(q, k, v, output_attentions=True)
    out_s, none = sdpa(q, k, v)
    torch.testing.assert_close(out_e, out_s, atol=1e-5, rtol=1e-5)
    assert none is None and w.shape == (2, 2, 17, 17)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 17))
    # sdpa asked for weights runs the eager kernel for that call
    out_w, w2 = sdpa(q, k, v, output_attentions=True)
    torch.testing.assert_close(w2, w)


def test_bias_broadcasts_over_batch_and_heads():
    core = build_attention("full", AttentionSpec(2, 8)).eval()
    q, k, v = make_qkv(b=2, n=9)
    bias = torch.randn(1, 1, 9, 9)
    out = core(q, k, v, attention_bias=bias).output
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, bias=bias), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="attention_bias must broadcast"):
        core(q, k, v, attention_bias=torch.randn(3, 2, 9, 9))


def test_unknown_kernel_raises():
    with pytest.raises(ValueError, match="attn_implementation 'cuda_magic'"):
        build_attention("full", AttentionSpec(2, 8, attn_implementation="cuda_magic"))


def test_training_dropout_applies():
    core = build_attention("full", AttentionSpec(2, 8, dropout=0.5))
    assert_dropout_only_in_training(core, *make_qkv(n=12))


def test_auto_takes_flex_for_flex_attention_only():
    """ "auto": this core's FlexAttention kernel for attn_implementation="flex_attention" where it can serve
    the call, else HF's function (sdpa in place of transformers' flex function, eager for weights)."""
    q, k, v = make_qkv(b=2, n=9)
    plain = AttentionInputs()
    sdpa = build_attention("full", AttentionSpec(2, 8)).eval()
    flex = build_attention("full", AttentionSpec(2, 8, attn_implementation="flex_attention")).eval()
    assert sdpa.kernel_for(q, plain).name == "hf"
    assert flex.kernel_for(q, plain).name == "flex"
    assert flex.kernel_for(q, AttentionInputs(output_attentions=True)).name == "hf"
    grad_q = q.clone().requires_grad_()
    assert flex.kernel_for(grad_q, plain).name == "hf"  # FlexAttention has no CPU backward
    torch.testing.assert_close(flex(grad_q, k, v).output, sdpa(q, k, v).output)


def test_reference_is_the_eager_function():
    """implementation="reference" computes BERT's eager attention op for op (outputs and weights)."""
    q, k, v = make_qkv(b=2, n=11)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 7:] = False
    extra = dict(attention_mask=mask, attention_bias=torch.randn(2, 2, 11, 11), output_attentions=True)
    eager = build_attention("full", AttentionSpec(2, 8, attn_implementation="eager")).eval()
    reference = build_attention("full", AttentionSpec(2, 8), {"implementation": "reference"}).eval()
    for want, got in zip(eager(q, k, v, **extra), reference(q, k, v, **extra), strict=True):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
