"""chunked_cross_entropy: the dense head's loss and gradients, without its (N, V) tensors."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from hf_efficient.modeling import heads
from hf_efficient.modeling.heads import mean_cross_entropy
from hf_efficient.modeling.losses import chunked_cross_entropy


def inputs(n=37, hidden=16, vocab=300, ignored=0.3, dtype=torch.float32, seed=0):
    """(2, n, D) hidden states, a (V, D) decoder and (V,) bias needing gradients, (2, n) labels with
    ``ignored`` of them -100."""
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(2, n, hidden, generator=generator, dtype=dtype).requires_grad_()
    weight = torch.randn(vocab, hidden, generator=generator, dtype=dtype).requires_grad_()
    bias = torch.randn(vocab, generator=generator, dtype=dtype).requires_grad_()
    labels = torch.randint(0, vocab, (2, n), generator=generator)
    labels = labels.masked_fill(torch.rand(2, n, generator=generator) < ignored, -100)
    return h, weight, bias, labels


def loss_and_grads(loss_fn, h, weight, bias, labels):
    tensors = [t for t in (h, weight, bias) if t is not None]
    loss = loss_fn(h, weight, bias, labels)
    return loss, torch.autograd.grad(3.0 * loss, tensors)  # an outer factor: backward scales by it


def dense(h, weight, bias, labels):
    return mean_cross_entropy(F.linear(h, weight, bias), labels)


@pytest.mark.parametrize("chunk_size", [None, 1, 7, 1000])
@pytest.mark.parametrize("with_bias", [True, False])
def test_equals_the_dense_loss_and_gradients(chunk_size, with_bias):
    h, weight, bias, labels = inputs()
    bias = bias if with_bias else None
    loss, grads = loss_and_grads(
        lambda *a: chunked_cross_entropy(*a, chunk_size=chunk_size), h, weight, bias, labels
    )
    expected, expected_grads = loss_and_grads(dense, h, weight, bias, labels)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want, atol=1e-5, rtol=1e-5)


def test_no_target_gives_zero_loss_and_zero_gradients():
    h, weight, bias, labels = inputs()
    loss, grads = loss_and_grads(chunked_cross_entropy, h, weight, bias, torch.full_like(labels, -100))
    assert loss.item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads)


def test_bfloat16_is_close_to_float32():
    h, weight, bias, labels = inputs(ignored=0.0)
    half = [t.detach().bfloat16().requires_grad_() for t in (h, weight, bias)]
    loss, grads = loss_and_grads(chunked_cross_entropy, *half, labels)
    expected, expected_grads = loss_and_grads(dense, h, weight, bias, labels)
    assert loss.dtype == torch.float32 and all(g.dtype == torch.bfloat16 for g in grads)
    torch.testing.assert_close(loss, expected, atol=0.05, rtol=0.02)
    torch.testing.assert_close(grads[1].float(), expected_grads[1], atol=0.02, rtol=0.05)


def test_no_grad_forward_computes_the_loss_only():
    h, weight, bias, labels = inputs()
    with torch.no_grad():
        loss = chunked_cross_entropy(h, weight, bias, labels)
    torch.testing.assert_close(loss, dense(h, weight, bias, labels).detach(), atol=1e-5, rtol=1e-5)


def test_saves_nothing_vocabulary_by_tokens():
    """Autograd keeps the inputs' sizes only: nothing of N x V (the dense loss saves its log-softmax)."""
    n, vocab = 512, 2048
    h, weight, bias, labels = inputs(n=n, vocab=vocab, ignored=0.0)

    def saved_numel(loss_fn):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss_fn(h, weight, bias, labels).backward()
        return max(saved)

    assert saved_numel(dense) >= 2 * n * vocab
    assert saved_numel(chunked_cross_entropy) <= weight.numel()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda h, w, b, y: (h, w.T, b, y), "must end in the decoder weight's D"),
        (lambda h, w, b, y: (h, w, b[:-1], y), "bias must have shape"),
        (lambda h, w, b, y: (h, w, b, y[:, :-1]), "labels must have shape"),
        (lambda h, w, b, y: (h, w, b, y.float()), "labels must be integer"),
        (lambda h, w, b, y: (h, w, b, y + 300), r"ids in \[30\d, .*V=300"),  # no -100 here: all >= 300
    ],
)
def test_bad_arguments_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        chunked_cross_entropy(*change(*inputs(vocab=300, ignored=0.0)))
    with pytest.raises(ValueError, match="chunk_size must be a positive"):
        chunked_cross_entropy(*inputs(), chunk_size=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_hidden_in_half_and_float32_decoder(dtype):
    """A model under torch.autocast hands half-precision hidden states to a float32 decoder: the loss and
    gradients are those of F.linear + F.cross_entropy under the same autocast, each gradient in its input's
    dtype (this raised "Expected out tensor to have dtype float" before the casts left the fused op)."""
    h, weight, bias, labels = inputs()
    h = h.to(dtype).detach().requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        got, got_grads = loss_and_grads(chunked_cross_entropy, h, weight, bias, labels)
        want, want_grads = loss_and_grads(dense, h, weight, bias, labels)
    torch.testing.assert_close(got, want.float(), atol=2e-2, rtol=2e-2)
    for g, w, t in zip(got_grads, want_grads, (h, weight, bias), strict=True):
        assert g.dtype == t.dtype
        torch.testing.assert_close(g.float(), w.float(), atol=2e-2, rtol=5e-2)


def test_mixed_dtypes_outside_autocast_name_the_fix():
    h, weight, bias, labels = inputs()
    with pytest.raises(ValueError, match=r"must share one dtype.*torch.autocast"):
        chunked_cross_entropy(h.to(torch.bfloat16), weight, bias, labels)


class LargestOutput(TorchDispatchMode):
    """Records the most elements of a new tensor any aten op inside it returns (views of an input are not
    new)."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        inputs = {t.untyped_storage().data_ptr() for t in tensors}
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in inputs:
                self.numel = max(self.numel, tensor.numel())
        return out


@pytest.mark.parametrize("ignored", [0.0, 0.85])  # a causal LM's targets everywhere, a masked LM's 15%
def test_evaluation_loss_reads_the_labelled_rows_a_chunk_at_a_time(ignored, monkeypatch):
    """Without autograd, mean_cross_entropy equals F.cross_entropy over the labelled rows and never builds a
    tensor of more rows than a chunk (it gathered every labelled row, then took their log-softmax: two
    (rows, V) tensors of fresh pages)."""
    vocab, chunk_rows = 300, 7
    monkeypatch.setattr(heads, "NO_GRAD_LOSS_CHUNK_BYTES", chunk_rows * vocab * 4)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 41, vocab, generator=generator)
    labels = torch.randint(0, vocab, (3, 41), generator=generator)
    labels = labels.masked_fill(torch.rand(3, 41, generator=generator) < ignored, -100)
    with torch.no_grad(), LargestOutput() as largest:
        loss = mean_cross_entropy(logits, labels)
    expected = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)
    assert largest.numel <= chunk_rows * vocab
    with torch.no_grad():  # nothing labelled: 0, not NaN
        assert mean_cross_entropy(logits, torch.full_like(labels, -100)).item() == 0.0
