"""Helpers shared by the cores: padding to a block multiple and back, masks, chunk sizing, random features.

Users never pad by hand: a core that works on blocks/windows/buckets pads inside with
:func:`pad_to_multiple` + :func:`extend_padding_mask` and cuts the result back with :func:`unpad`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .inputs import is_tracing

# glibc hands every allocation above its mmap threshold straight back to the system and page-faults it in
# anew on the next call; intermediates kept under this budget stay in the malloc arena
# (benchmarks/docs/performance.md).
CHUNK_BYTES = 24 * 2**20


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int = -2, value: float = 0.0) -> torch.Tensor:
    """Right-pad ``x`` along ``dim`` with ``value`` until its length divides by ``multiple``.

    Example: (b, h, 1000, d) with multiple 64 -> (b, h, 1024, d).
    """
    n = x.shape[dim]
    dim = dim % x.dim()
    if is_tracing():
        # Pad by the constant multiple - 1 and keep the first ceil(n / multiple) multiples: lengths that
        # torch.export can follow (it cannot prove (-n) % multiple >= 0 or that n + (-n) % multiple divides).
        padded = F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, multiple - 1], value=value)
        length = (n + multiple - 1) // multiple * multiple
        return padded.index_select(dim, torch.arange(length, device=x.device))
    extra = (-n) % multiple
    if extra == 0:
        return x
    # F.pad takes (left, right) pairs from the last dimension backwards.
    pad = [0, 0] * (x.dim() - 1 - dim) + [0, extra]
    return F.pad(x, pad, value=value)


def extend_padding_mask(
    mask: torch.Tensor | None, batch: int, n: int, multiple: int, device: torch.device
) -> torch.Tensor | None:
    """Key padding mask (b, n_padded) for a sequence right-padded to a multiple; None if nothing is padded.

    Positions added by :func:`pad_to_multiple` are False (not real), so they are never attended to.
    """
    if mask is None and not is_tracing() and n % multiple == 0:
        return None
    if mask is None:
        mask = torch.ones(batch, n, dtype=torch.bool, device=device)
    return pad_to_multiple(mask, multiple, dim=-1, value=False)


def unpad(x: torch.Tensor, n: int, dim: int = -2) -> torch.Tensor:
    """Cut ``x`` back to its first ``n`` positions along ``dim`` (inverse of :func:`pad_to_multiple`); a view.

    While tracing a gather of the first n positions: torch.export cannot prove that a slice of a traced
    length, clamped to min(n, padded length), is n.
    """
    if is_tracing():
        return x.index_select(dim, torch.arange(n, device=x.device))
    return x.narrow(dim, 0, n)


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(b, n) bool key mask -> (b, 1, 1, n) additive mask (0 for real keys, dtype's min for padding)."""
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, torch.finfo(dtype).min
    )[:, None, None, :]


def zero_padded(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero positions of a (b, h, n, d) tensor where the (b, n) mask is False.

    Uses ``masked_fill`` rather than a product so that inf/NaN in padding cannot survive (NaN * 0 = NaN).
    """
    if mask is None:
        return x
    return x.masked_fill(~mask[:, None, :, None], 0.0)


# On CUDA a chunk costs a few kernel launches whatever its size, and at CPU-sized budgets the per-chunk
# Python and launch work would bound the chunked cores: their chunks are this much larger there
# (the measurement behind it: benchmarks/docs/performance.md, "Why the kernels are cut the way they are").
CUDA_CHUNK_FACTOR = 16


def device_chunk_budget(budget: int, device: torch.device) -> int:
    """``budget`` (bytes per chunk, tuned for CPU caches) for chunks of a tensor on ``device``: larger on
    CUDA (:data:`CUDA_CHUNK_FACTOR`)."""
    return budget * CUDA_CHUNK_FACTOR if device.type == "cuda" else budget


def host_reads_are_cheap(x: torch.Tensor) -> bool:
    """Whether reading values of ``x`` on the host (``.tolist()``, ``nonzero``, ``bool(...)``) is cheap: on a
    CPU it is. On an accelerator it waits for every queued kernel (a host-device sync), which stalls the
    pipeline and breaks CUDA graphs, so the CPU shortcuts that read values to skip work (which rows need a
    mask) take this and the accelerator path does the work instead. Tests patch it to False to run the
    accelerator's branches on a CPU (tests/attention/test_host_syncs.py)."""
    return x.device.type == "cpu"


def rows_per_chunk(bytes_per_row: int, total_rows: int, budget: int = CHUNK_BYTES) -> int:
    """How many rows of an intermediate fit in ``budget`` bytes (at least 1, at most ``total_rows``).

    While tracing (``torch.export`` / ``torch.compile``) all of them: a traced graph cannot loop over a
    number of chunks that depends on the input's size, so it computes in one piece."""
    if is_tracing():
        return total_rows
    return max(1, min(total_rows, budget // max(1, bytes_per_row)))


def chunk_bounds(total_rows: int, rows: int) -> list[tuple[int, int]]:
    """(start, stop) of consecutive chunks of ``rows`` rows covering ``total_rows``; one chunk of everything
    while tracing (see :func:`rows_per_chunk`)."""
    if is_tracing():
        return [(0, total_rows)]
    return [(start, min(start + rows, total_rows)) for start in range(0, total_rows, rows)]


def row_slices(total_rows: int, rows: int) -> list[slice]:
    """Slices of ``rows`` rows covering ``total_rows`` in order; one slice of everything while tracing."""
    if is_tracing():
        return [slice(None)]
    return [slice(start, stop) for start, stop in chunk_bounds(total_rows, rows)]


class ChunkBuffers:
    """Scratch tensors reused across the chunks of one loop, one per name.

    A fresh chunk-sized tensor per chunk is slow on CPU even under ``CHUNK_BYTES``: freeing several of
    them at the end of a chunk leaves more free memory at the top of the heap than glibc's trim threshold
    (twice the last mmapped size), so it goes back to the system and every tensor of the next chunk
    page-faults again (the measurement: benchmarks/docs/performance.md, "Why the kernels are cut the way they
    are"). Pass ``buffers(name, shape)`` as ``out=``; a buffer grows only
    when a larger shape asks for it, so the last, smaller chunk takes a view of it.
    """

    def __init__(self, like: torch.Tensor):
        self.dtype, self.device = like.dtype, like.device
        self.store: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        numel = 1
        for size in shape:
            numel *= size
        buffer = self.store.get(name)
        if buffer is None or buffer.numel() < numel or buffer.dtype != (dtype or self.dtype):
            buffer = self.store[name] = torch.empty(numel, dtype=dtype or self.dtype, device=self.device)
        return buffer[:numel].view(shape)


def orthogonal_gaussian_features(m: int, d: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(m, d) matrix of orthogonal random features with chi_d row norms (FAVOR+ "regular" scaling).

    Rows within each block of d are orthogonal, and each row is marginally N(0, I_d), so kernel estimates
    built on them stay unbiased with lower variance than iid rows (Yu et al. 2016, "Orthogonal Random
    Features"; Choromanski et al. 2021). Used by Performer and, with ``orthogonal_features``, by RFA.
    """
    blocks = []
    for _ in range(math.ceil(m / d)):
        gaussian = torch.randn(d, d, generator=generator, device="cpu")
        q, r = torch.linalg.qr(gaussian)  # q: (d, d) orthonormal columns
        q = q * torch.sign(torch.diagonal(r))[None, :]  # fix signs: Haar-distributed
        blocks.append(q.T)  # (d, d) orthonormal rows
    directions = torch.cat(blocks)[:m]  # (m, d)
    norms = torch.randn(m, d, generator=generator, device="cpu").norm(dim=1)  # (m,), chi_d distributed
    return directions * norms[:, None]


def band_pairs(n: int, half: int) -> int:
    """(i, j) pairs with |i - j| <= half in a sequence of n tokens (a sliding window's, for FLOP counts)."""
    half = min(half, n - 1)
    return n * (2 * half + 1) - half * (half + 1)


MASK32 = 2**32 - 1


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash of int64 values in [0, 2^32), a bijection (distinct inputs never tie): seeded
    random choices that are a pure tensor function of their sizes (BigBird's random blocks). Multipliers
    below 2^31 keep every product inside int64, so eager, export and ONNX agree bit for bit."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x31848BAB) & MASK32
    return x ^ (x >> 16)
