"""The attention contract over inputs no one picked: hypothesis draws the batch, the lengths (1, primes, just
past a block or window), the padding (rows of one real token, rows with none), the dtype and the memory layout
(contiguous, the encoders' transposed views, a batch expanded from one row), for every registered type within
its capabilities, and checks what must hold whatever the input:

- no NaN or inf anywhere in the output; padded query rows exactly 0;
- each row of a padded batch equals that row run alone on its real tokens (batch independence and padding
  invariance at once);
- in the settings where a type is exact (a window or its blocks covering the sequence), it equals exact
  softmax attention (to 1e-4: float32 against float64 with scores up to tens).

The examples are derandomised (the same draws on every run, so CI is reproducible) and 200 per type and
property group; a failure hypothesis finds is fixed and kept as a regular test in the type's own test file.

Slow (`make test`; about 25 CPU-seconds on a quiet 2-core machine, a tenth of the edit loop): a second layer,
over drawn inputs, of checks the fast loop runs on every type over fixed ones: test_contract.py's finite
outputs, zero padded rows, poisoned pads, batch independence and strided layouts, test_half_precision.py's
bfloat16, and each windowed or blocked type's own covering-window-equals-full test (test_longformer.py,
test_bigbird.py, test_long_short.py, test_window_2d.py).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_efficient.attention import ATTENTION_REGISTRY

from .contract import run
from .helpers import make_core, reference_attention

pytestmark = pytest.mark.slow

TYPES = sorted(ATTENTION_REGISTRY)
EXAMPLES = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
HEADS, HEAD_DIM = 2, 8


@st.composite
def batches(draw, max_length: int = 70):
    """(lengths per row, padded length n, dtype, layout, seed): some rows may be shorter than n or empty."""
    n = draw(st.integers(1, max_length))
    b = draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(0, n), min_size=b, max_size=b))
    lengths[draw(st.integers(0, b - 1))] = n  # one row fills the batch
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    layout = draw(st.sampled_from(["contiguous", "transposed", "expanded"]))
    # large scores (softmax far from uniform) in float32; in bfloat16 their rounding is amplified by design
    # (Nystromformer's pseudo-inverse of near one-hot landmark scores), so half precision draws moderate ones
    scale = draw(st.sampled_from([1.0, 10.0])) if dtype == torch.float32 else 1.0
    return lengths, n, dtype, layout, scale, draw(st.integers(0, 2**16))


def _qkv(b, n, dtype, layout, scale, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (1 if layout == "expanded" else b, n, HEADS, HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=g) * s for s in (scale, scale, 1.0))
    q, k, v = (t.to(dtype).transpose(1, 2) for t in (q, k, v))  # (b, h, n, d) views, as the encoders pass
    if layout == "expanded":
        q, k, v = (t.expand(b, -1, -1, -1) for t in (q, k, v))
    elif layout == "contiguous":
        q, k, v = (t.contiguous() for t in (q, k, v))
    return q, k, v


def _run(core, q, k, v, lengths, n, item_seeds=None):
    mask = torch.arange(n)[None] < torch.tensor(lengths)[:, None]
    return run(core, q, k, v, mask, lengths, item_seeds).output


@pytest.mark.parametrize("attention_type", TYPES)
def test_finite_zero_padding_and_each_row_as_if_alone(attention_type):
    core = make_core(attention_type, heads=HEADS, head_dim=HEAD_DIM)

    @EXAMPLES
    @given(batches())
    def check(drawn):
        lengths, n, dtype, layout, scale, seed = drawn
        q, k, v = _qkv(len(lengths), n, dtype, layout, scale, seed)
        with torch.no_grad():
            out = _run(core, q, k, v, lengths, n)
            assert out.shape == (len(lengths), HEADS, n, HEAD_DIM) and out.dtype == dtype
            assert torch.isfinite(out).all(), f"non-finite output for lengths {lengths}, n={n}, {dtype}"
            for i, m in enumerate(lengths):
                assert (out[i, :, m:] == 0).all(), "padded query rows must be exactly 0"
                if m == 0:
                    continue
                rows = (slice(i, i + 1), slice(None), slice(0, m))
                alone = _run(core, q[rows], k[rows], v[rows], [m], m, item_seeds=[i])
                tolerance = TOLERANCE[dtype]
                torch.testing.assert_close(out[i : i + 1, :, :m], alone, atol=tolerance, rtol=tolerance)

    check()


# Settings in which a type computes exact softmax attention over every real key, for any length drawn
# (Nystromformer's, one token per landmark, is exact once its pseudo-inverse iteration has converged:
# checked in float64 in test_nystromformer.py, as float32 only reaches P's conditioning).
EXACT = {
    "full": {},
    "longformer": {"attention_window": 2 * 70 + 2, "global_token_indices": []},
    "long_short": {"window_size": 2 * 70 + 2, "num_landmarks": 0, "dual_ln": False},
    "swin_window": {"window_size": 70},  # one window over the single row of a plain sequence
    "bigbird": {"block_size": 4, "num_window_blocks": 2 * 18 + 1, "num_random_blocks": 0},
}


@pytest.mark.parametrize("attention_type", sorted(EXACT))
def test_exact_limit_equals_softmax_attention(attention_type):
    core = make_core(attention_type, heads=HEADS, head_dim=HEAD_DIM, **EXACT[attention_type])

    @EXAMPLES
    @given(batches())
    def check(drawn):
        lengths, n, _, layout, scale, seed = drawn
        q, k, v = _qkv(len(lengths), n, torch.float32, layout, scale, seed)
        mask = torch.arange(n)[None] < torch.tensor(lengths)[:, None]
        with torch.no_grad():
            out = _run(core, q, k, v, lengths, n)
            want = reference_attention(q, k, v, mask=mask)
        for i, m in enumerate(lengths):
            torch.testing.assert_close(out[i, :, :m], want[i, :, :m].float(), atol=1e-4, rtol=1e-4)

    check()
