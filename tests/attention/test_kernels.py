"""Every kernel equals its mechanism's reference (hf_efficient.attention.base: reference and kernels).

For each registered type and each of its kernels, two cores are built from the same seed, one with
``implementation="reference"`` and one forcing the kernel, and run on the same calls: a padded batch
(outputs, attention weights where the type returns them, gradients of query, key and value), the causal form
and cached decoding where the type has them, and a length that spans several blocks or chunks. Float32, to
1e-5. A kernel that cannot run a call on this machine (FlexAttention has no CPU backward) is compared
forward-only under ``torch.no_grad()``; one that cannot run it at all is compared where it can (the device
check compares the CUDA kernels on the GPU).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from hf_efficient.attention import ATTENTION_REGISTRY

from .contract import run
from .helpers import make_core, make_qkv, padding_mask

KERNELS = sorted((name, kernel.name) for name, cls in ATTENTION_REGISTRY.items() for kernel in cls.kernels)
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}


def _pair(attention_type: str, kernel: str, causal: bool = False):
    """(reference core, kernel core) with the same parameters and random state."""
    torch.manual_seed(0)
    reference = make_core(attention_type, causal=causal, implementation="reference")
    torch.manual_seed(0)
    fast = make_core(attention_type, causal=causal, implementation=kernel)
    fast.load_state_dict(reference.state_dict())
    return reference, fast


def _runs(core, q, k, v, mask, lengths, **inputs) -> str:
    """'grad' if the forced kernel computes this call with gradients, 'forward' if only without, '' if not."""
    for mode, context in (("grad", contextlib.nullcontext()), ("forward", torch.no_grad())):
        try:
            with context:
                run(core, q.detach().requires_grad_(mode == "grad"), k, v, mask, lengths, **inputs)
        except ValueError as error:
            if "cannot compute this call" not in str(error):
                raise
            continue
        return mode
    return ""


def _compare(reference, fast, n: int, lengths, **inputs) -> bool:
    """Outputs, weights and gradients of both cores on one padded batch; False if the kernel cannot run it."""
    q, k, v = make_qkv(b=len(lengths), n=n)
    mask = padding_mask(lengths, n) if min(lengths) < n else None
    mode = _runs(fast, q, k, v, mask, lengths, **inputs)
    if not mode:
        return False
    grads = mode == "grad"
    used = [0, 2] if reference.capabilities.shared_query_key else [0, 1, 2]
    results = []
    for core in (reference, fast):
        leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
        with contextlib.nullcontext() if grads else torch.no_grad():
            out = run(core, *leaves, mask, lengths, **inputs)
            grad_out = torch.randn(out.output.shape, generator=torch.Generator().manual_seed(1))
            got = [out.output, out.weights]
            if grads:
                got += torch.autograd.grad((out.output * grad_out).sum(), [leaves[i] for i in used])
        results.append(got)
    for want, got in zip(*results, strict=True):
        assert (want is None) == (got is None)
        if want is not None:
            if want.is_sparse:
                want, got = want.to_dense(), got.to_dense()
            torch.testing.assert_close(got, want, **TOLERANCE)
    return True


def _compare_decoding(reference, fast, prompt: int, steps: int) -> bool:
    """Prefill then token-by-token decoding from each core's own cache: the same outputs at every step."""
    from hf_efficient.attention.cache import EfficientCache

    q, k, v = make_qkv(b=2, n=prompt + steps)
    mask = padding_mask([prompt + steps, prompt + steps - 2], prompt + steps)
    caches = [EfficientCache.for_cores([reference]), EfficientCache.for_cores([fast])]
    bounds = [(0, prompt)] + [(i, i + 1) for i in range(prompt, prompt + steps)]
    for start, end in bounds:
        outs = []
        for core, cache in zip((reference, fast), caches, strict=True):
            k_ = q if core.capabilities.shared_query_key else k
            try:
                with torch.no_grad():
                    out = core(
                        q[:, :, start:end],
                        k_[:, :, start:end],
                        v[:, :, start:end],
                        attention_mask=mask[:, start:end],
                        is_causal=True,
                        cache=cache,
                    )
            except ValueError as error:
                if "cannot compute this call" not in str(error):
                    raise
                return False
            outs.append(out.output)
        torch.testing.assert_close(outs[1], outs[0], **TOLERANCE)
    return True


def check_kernel_equals_reference(attention_type: str, kernel: str) -> bool:
    """Every comparison above for one kernel of a registered type; False if it could run none of them here."""
    reference, fast = _pair(attention_type, kernel)
    caps = reference.capabilities
    cases = ((37, [37, 30]), (150, [150, 131]))
    ran = [_compare(reference, fast, n, lengths) for n, lengths in cases]
    if caps.output_attentions:
        ran.append(_compare(reference, fast, 37, [37, 30], output_attentions=True))
    if caps.causal:
        reference, fast = _pair(attention_type, kernel, causal=True)
        ran += [_compare(reference, fast, n, lengths, is_causal=True) for n, lengths in cases]
        ran.append(_compare_decoding(reference, fast, prompt=20, steps=3))
    return any(ran)


@pytest.mark.parametrize(("attention_type", "kernel"), KERNELS)
def test_kernel_equals_reference(attention_type, kernel):
    if not check_kernel_equals_reference(attention_type, kernel):
        pytest.skip(f"{attention_type}'s {kernel!r} kernel runs none of these calls on the CPU")


@pytest.mark.parametrize("attention_type", sorted(ATTENTION_REGISTRY))
def test_reference_is_a_choice_of_every_type(attention_type):
    """implementation='reference' builds for every type; a kernel name it lacks is refused, listing them."""
    core = make_core(attention_type, implementation="reference")
    assert core.kernel_for(make_qkv()[0], None) is None
    with pytest.raises(ValueError, match="implementation must be one of 'auto', 'reference'"):
        make_core(attention_type, implementation="no_such_kernel")
