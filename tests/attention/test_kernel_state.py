"""A cached prefill (several new tokens after a recurrent state) and chunked training (gradients through the
state from one chunk to the next) run through the kernel chosen for the call, by the one signature of the
reference and the kernels (``state=``, ``return_state=``): each implementation is forced in turn, a record
says which form ran, and outputs and gradients match the parallel form over the whole sequence."""

import pytest
import torch

from hf_efficient.attention import AttentionInputs, causal_attention_types, get_attention_class
from hf_efficient.attention.cache import EfficientCache, RecurrentStateLayer

from .helpers import make_core, make_qkv

N = 20
# a prompt (parallel form from no state), a chunk after a state, then single tokens (the recurrent step)
PIECES = ((0, 9), (9, 16), *((t, t + 1) for t in range(16, N)))
RECURRENT = [
    name
    for name in causal_attention_types()
    if isinstance(make_core(name, causal=True).new_cache_layer(), RecurrentStateLayer)
]
CASES = [
    (name, implementation)
    for name in RECURRENT
    for implementation in ("reference", *(kernel.name for kernel in get_attention_class(name).kernels))
]


def record_forms(core) -> list[str]:
    """Make ``core`` note the name of every form that computes a call: its reference or a kernel."""
    ran = []

    def noting(name, attend):
        def attend_noted(*args, **kwargs):
            ran.append(name)
            return attend(*args, **kwargs)

        return attend_noted

    core.kernels = tuple(k._replace(attend=noting(k.name, k.attend)) for k in core.kernels)
    core.reference = noting("reference", core.reference)
    return ran


def padding() -> torch.Tensor:
    """(2, N): row 0 padded on the left (3 tokens), row 1 on the right (after 13): both chunks meet it."""
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[0, :3] = False
    mask[1, 13:] = False
    return mask


def test_every_recurrent_type_and_kernel_is_covered():
    assert {"linear", "performer", "rfa"} <= set(RECURRENT)
    assert ("linear", "parallel") in CASES and ("rfa", "chunked") in CASES


@pytest.mark.parametrize(("attention_type", "implementation"), CASES)
def test_cached_prefill_and_chunked_training_run_the_forced_kernel(attention_type, implementation):
    core = make_core(attention_type, causal=True, implementation=implementation)
    parallel = make_core(attention_type, causal=True, implementation="reference")
    parallel.load_state_dict(core.state_dict())
    ran = record_forms(core)
    mask = padding()
    q, k, v = make_qkv(b=2, n=N, requires_grad=True)
    cache = EfficientCache.for_cores([core])

    def run(a, b):
        part = slice(a, b)
        return core(
            q[:, :, part],
            k[:, :, part],
            v[:, :, part],
            attention_mask=mask[:, part],
            is_causal=True,
            cache=cache,
        )

    kernel = next((kernel for kernel in core.kernels if kernel.name == implementation), None)
    causal = AttentionInputs(attention_mask=mask, is_causal=True)
    if kernel is not None and kernel.unsupported(core, q, causal):
        with pytest.raises(ValueError, match=f"implementation={implementation!r} cannot compute this call"):
            run(*PIECES[0])
        return
    pieces = [run(a, b) for a, b in PIECES]
    decoded = torch.cat([piece.output for piece in pieces], dim=2)
    assert ran == [implementation, implementation]  # the prompt and the chunk; single tokens: the step
    expected = parallel(q, k, v, attention_mask=mask, is_causal=True).output
    real = mask[:, None, :, None].expand_as(expected)
    torch.testing.assert_close(decoded[real], expected[real], atol=1e-5, rtol=1e-5)
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    chunked = torch.autograd.grad((decoded * weights).sum(), (q, k, v))
    whole = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for got, want in zip(chunked, whole, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_kernel_that_carries_no_state_is_passed_over_or_refused():
    core = make_core("linear", causal=True)
    core.kernels = tuple(kernel._replace(carries_state=False) for kernel in core.kernels)
    ran = record_forms(core)
    q, k, v = make_qkv(b=1, n=6)
    core(q, k, v, is_causal=True)  # no state: the kernel auto picks
    core(q, k, v, is_causal=True, cache=EfficientCache.for_cores([core]))  # a carried state: the reference
    assert ran == ["chunked", "reference"]
    core.config.implementation = "chunked"
    with pytest.raises(ValueError, match="does not start from a carried state"):
        core(q, k, v, is_causal=True, cache=EfficientCache.for_cores([core]))
