"""The kernel "fla" (hf_efficient/attention/kernels/fla.py: flash-linear-attention's simple_gla ops, the
``gpu`` extra) equals the references of linear, performer and rfa: outputs and gradients, causal (through
fla) and non-causal, and a causal prefill cut in two, the state carried between the halves, equals one pass.

fla's Triton kernels run on a CPU only in Triton's interpreter, which must be on before triton is imported,
and importing hf_efficient imports triton (through torch and transformers): so, where fla is installed and
this process was not started with TRITON_INTERPRET=1, one test runs this file again in a fresh process with
it (``TRITON_INTERPRET=1 pytest tests/attention/test_fla_kernel.py`` runs the comparisons directly). Small
sizes: the interpreter runs every program of a kernel in Python. Where fla is not installed (the project's
own venv) only the refusal naming the extra runs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from hf_efficient.attention import AttentionInputs

from ..processes import ROOT, child_env
from .helpers import make_core, make_qkv, padding_mask

HAS_FLA = importlib.util.find_spec("fla") is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # set when this process started (module docstring)

TOLERANCE = {"atol": 1e-4, "rtol": 1e-4}
# (type, config): each gate form once: none (linear, relu), the softmax shift (performer), RFA's own gate;
# an odd number of features (padded to an even one for fla's half-precision backward) and odd d + 1 (all)
SETTINGS = [
    ("linear", {}),
    ("performer", {}),
    ("rfa", {}),
    ("performer", {"kernel": "relu"}),
    ("performer", {"num_features": 7}),
    ("rfa", {"gate": False}),
]
IDS = ["linear", "performer", "rfa", "performer_relu", "performer_odd_features", "rfa_no_gate"]


@pytest.fixture(scope="module")
def fla_kernels():
    """The kernel module, fla imported for Triton's interpreter (skips where fla is missing or this process
    was not started with TRITON_INTERPRET=1)."""
    pytest.importorskip("fla")
    from hf_efficient.attention.kernels import fla

    if not fla.interpreted():
        pytest.skip("not started with TRITON_INTERPRET=1: test_fla_in_an_interpreted_process runs these")
    return fla


@pytest.mark.slow  # a fresh interpreter
@pytest.mark.skipif(not HAS_FLA or INTERPRETED, reason="needs fla, in a process not yet interpreted")
def test_fla_in_an_interpreted_process():
    """The comparisons below, in a fresh process started with TRITON_INTERPRET=1 (module docstring)."""
    others = "not interpreted_process and not names_the_extra"  # this test, and the one for no fla
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", __file__]
    command += ["-k", others]
    result = subprocess.run(
        command,
        env={**child_env(), "TRITON_INTERPRET": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " skipped" not in result.stdout.splitlines()[-1], result.stdout[-2000:]  # every comparison ran


def _pair(attention_type: str, config: dict):
    """(reference core, core forcing "fla") of a causal model, with the same parameters."""
    torch.manual_seed(0)
    reference = make_core(attention_type, causal=True, implementation="reference", **config)
    fast = make_core(attention_type, causal=True, implementation="fla", **config)
    fast.load_state_dict(reference.state_dict())
    return reference, fast


def _outputs_and_gradients(core, q, k, v, mask, causal: bool):
    """Output and the gradients of q, k, v and the core's own parameters (RFA's sigma and gate) for one
    weighted sum."""
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = core(*leaves, attention_mask=mask, is_causal=causal).output
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    params = [p for p in core.parameters() if p.requires_grad]
    # allow_unused: RFA's non-causal form does not read its gate (None in both)
    return [out, *torch.autograd.grad((out * weights).sum(), leaves + params, allow_unused=True)]


@pytest.mark.parametrize(("attention_type", "config"), SETTINGS, ids=IDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non_causal"])
def test_fla_equals_the_reference(fla_kernels, attention_type, config, causal):
    reference, fast = _pair(attention_type, config)
    q, k, v = make_qkv(b=2, n=21)
    k = k * 3.0  # large keys: Performer's shift moves several times along the sequence
    mask = padding_mask([21, 15], 21)
    mask[0, :3] = False  # left padding too: the shift is -inf (no real key) at the start of row 0
    want = _outputs_and_gradients(reference, q, k, v, mask, causal)
    got = _outputs_and_gradients(fast, q, k, v, mask, causal)
    for got_one, want_one in zip(got, want, strict=True):
        assert (got_one is None) == (want_one is None)
        if want_one is not None:
            torch.testing.assert_close(got_one, want_one, **TOLERANCE)


@pytest.mark.parametrize(("attention_type", "config"), SETTINGS[:3], ids=IDS[:3])
def test_a_prefill_cut_in_two_carries_the_state_through_fla(fla_kernels, attention_type, config):
    """The first half's state, handed to the second half, gives the outputs, final state and gradients of
    one pass of the reference."""
    reference, fast = _pair(attention_type, config)
    q, k, v = make_qkv(b=2, n=20, requires_grad=True)
    mask = padding_mask([20, 13], 20)
    (fla_kernel,) = [kernel for kernel in fast.kernels if kernel.name == "fla"]

    def inputs(part):
        return AttentionInputs(attention_mask=mask[:, part], is_causal=True)

    whole, final = reference.reference(q, k, v, inputs(slice(None)), return_state=True)
    head, tail = slice(None, 8), slice(8, None)
    first, middle = fla_kernel.attend(
        fast, q[:, :, head], k[:, :, head], v[:, :, head], inputs(head), return_state=True
    )
    second, last = fla_kernel.attend(
        fast, q[:, :, tail], k[:, :, tail], v[:, :, tail], inputs(tail), state=middle, return_state=True
    )
    halves = torch.cat([first.output, second.output], dim=2)
    torch.testing.assert_close(halves, whole.output, **TOLERANCE)
    for got, want in zip(last, final, strict=True):  # KernelState (sums, shift) or RFA's [S | z]
        if want is not None:
            torch.testing.assert_close(got, want, **TOLERANCE)
    weights = torch.randn(whole.output.shape, generator=torch.Generator().manual_seed(1))
    for got, want in zip(
        torch.autograd.grad((halves * weights).sum(), (q, k, v)),
        torch.autograd.grad((whole.output * weights).sum(), (q, k, v)),
        strict=True,
    ):
        torch.testing.assert_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("attention_type", ["linear", "performer", "rfa"])
def test_auto_never_takes_fla_off_cuda(attention_type):
    core = make_core(attention_type, causal=True)
    assert "fla" in [kernel.name for kernel in core.kernels]
    assert "fla" not in [kernel.name for kernel in core.resolve_kernels("cpu")]
    assert [kernel.name for kernel in core.resolve_kernels("cuda")][-1] == "fla"  # after the package's own


@pytest.mark.skipif(HAS_FLA, reason="fla is installed here: the refusal is for an install without it")
@pytest.mark.parametrize("attention_type", ["linear", "performer", "rfa"])
def test_forcing_fla_without_it_names_the_extra(attention_type):
    core = make_core(attention_type, causal=True, implementation="fla")
    q, k, v = make_qkv(b=1, n=6)
    with pytest.raises(ValueError, match=r"implementation='fla' cannot compute .*hf_efficient\[gpu\]"):
        core(q, k, v, is_causal=True)
    core(q, k, v)  # the non-causal form needs no fla (the parallel engine's / RFA's own)


@pytest.mark.gpu
@pytest.mark.parametrize(("attention_type", "config"), SETTINGS[:3], ids=IDS[:3])
def test_fla_on_cuda_equals_the_reference(attention_type, config):
    """On the GPU, fla's chunked op (the CPU tests above run its fused recurrent one): outputs and gradients
    of a padded causal batch within 1e-3 of the reference in float32 (tf32 products); in bfloat16 outputs
    within 0.05 of them and finite gradients."""
    pytest.importorskip("fla")
    torch.manual_seed(0)
    reference = make_core(
        attention_type, causal=True, heads=4, head_dim=64, implementation="reference", **config
    )
    fast = make_core(attention_type, causal=True, heads=4, head_dim=64, implementation="fla", **config)
    fast.load_state_dict(reference.state_dict())
    reference, fast = reference.cuda(), fast.cuda()
    q, k, v = (t.cuda() for t in make_qkv(b=2, h=4, n=300, d=64))
    mask = padding_mask([300, 250], 300).cuda()
    want = _outputs_and_gradients(reference, q, k, v, mask, causal=True)
    got = _outputs_and_gradients(fast, q, k, v, mask, causal=True)
    for got_one, want_one in zip(got, want, strict=True):
        torch.testing.assert_close(got_one, want_one, atol=1e-3, rtol=1e-3)
    # bfloat16 forward and backward (fla's half-precision backward takes even widths only: d + 1 is padded)
    leaves = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    half = fast(*leaves, attention_mask=mask, is_causal=True).output
    assert (half.float() - want[0]).abs().max() < 0.05
    half.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)
