"""flash-linear-attention's kernels for the causal forms of the kernelised types (``linear``, ``performer``,
``rfa``), as the kernel ``"fla"``: optional, from the ``gpu`` extra (``pip install "hf_efficient[gpu]"``,
the PyPI package ``fla-core``, module ``fla``).

After its feature maps each of these types is linear attention with a scalar gate per token and head, the
recurrence of fla's ``simple_gla`` ops (Triton kernels), written here with [V, 1] values (the column of
ones accumulates the normaliser z beside S, as everywhere in the package):

    [S | z]_t = exp(g_t) [S | z]_{t-1} + k'_t [v_t, 1]^T,      o_t = phi_q(q_t)^T [S | z]_t

- ``linear``, ``performer`` with ``kernel="relu"``: k'_t = phi_k(k_t), no gate (g_t = 0).
- ``performer`` (softmax kernel): the causal form keeps the sums relative to the running maximum c_t of the
  keys' log-features (``_kernelized``); moving them from c_{t-1} to c_t multiplies them by
  exp(c_{t-1} - c_t) <= 1, so the stabilising shift is a gate, g_t = c_{t-1} - c_t, and k'_t = phi_k(k_t)
  computed relative to c_t. Query t then reads sums relative to its own shift, so its eps is the plain one.
- ``rfa``: its recency gate, g_t = log sigmoid(w_g . k_t + b_g) and k'_t = (1 - sigmoid(...)) phi(k_t).

With a gate the fla op runs over [V, 1] and returns [numerator | denominator] rows. Without one it runs
over V alone (d columns, whole tiles, as fla's own linear attention runs), and z_t = z_0 + sum_{j <= t}
phi_k(k_j) is a float32 prefix sum beside it. The division is the type's own (phi_q z + eps, or RFA's |den|
floored at eps), in float32. The recurrent state is [S | z] (b, h, m, d + 1), the type's own
(:class:`~hf_efficient.attention._kernel_state.KernelState` with its shift, or RFA's [S | z]); fla's
``initial_state`` / final state is its S or the whole of it (layout [B, H, K, V]), so a cached prefill and
chunked training run through this kernel too. fla's half-precision backward takes no odd K or V: an odd
feature count or width is padded with a zero column, cut after.

fla's ops are causal; the non-causal form (two products over the whole sequence) is the parallel engine's
for ``linear`` / ``performer`` and RFA's own reference for ``rfa``, so every call of these types can be
forced onto this kernel.

Devices: on CUDA the chunked op (``chunk_simple_gla``). On a CPU fla's Triton kernels run only in Triton's
interpreter (``TRITON_INTERPRET=1`` set before triton is imported; slow, for tests at small sizes): there the
fused recurrent op (``fused_recurrent_simple_gla``, the same recurrence token by token), because fla 0.6's
chunked kernels call ``.to()`` on their loop counters, which the interpreter hands over as Python ints; and
autotuning has no device to time there, so the first of each kernel's configurations is taken. ``"auto"``
considers this kernel on CUDA only, after the package's own kernels.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os

import torch
import torch.nn.functional as F

from .._kernel_state import KernelState, append_ones, finite_or_zero, masked_key_maxima
from ..base import AttentionOutput, Kernel
from .kernelized_parallel import parallel_kernelized

INSTALL_HINT = "pip install 'hf_efficient[gpu]' (flash-linear-attention's fla-core)"
FLA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _fla_ops():
    """(chunk_simple_gla, fused_recurrent_simple_gla), or the ImportError's text where fla is missing."""
    try:
        from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
    except ImportError as error:  # fla absent, or triton missing under it
        return f"{type(error).__name__}: {error}"
    return chunk_simple_gla, fused_recurrent_simple_gla


def interpreted() -> bool:
    """Whether fla's kernels, and the Triton library functions they call, were built for Triton's interpreter
    (TRITON_INTERPRET=1 when triton and fla were imported): the only way they run on a CPU. False where fla
    or triton does not import."""
    # Optional imports sit in try blocks: transformers' remote-code check (dynamic_module_utils.get_imports)
    # requires every other import of a saved model's code to be installed, fla and triton included.
    try:
        import triton.language.standard
        from fla.ops.common.fused_recurrent import fused_recurrent_fwd_kernel
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:
        return False

    def built_for_interpreter(kernel) -> bool:
        while not isinstance(kernel, InterpretedFunction) and hasattr(kernel, "fn"):
            kernel = kernel.fn  # through the autotuner and heuristics wrappers
        return isinstance(kernel, InterpretedFunction)

    # triton's own library (tl.cdiv, ...) is built when triton is imported, which may be long before fla
    return built_for_interpreter(fused_recurrent_fwd_kernel) and built_for_interpreter(
        triton.language.standard.cdiv
    )


def _unsupported_device_or_install(query: torch.Tensor) -> str | None:
    problem = _device_or_install_problem(query.device.type)
    if problem is None and query.dtype not in FLA_DTYPES:
        return f"flash-linear-attention's kernels take float32, bfloat16 or float16, not {query.dtype}"
    return problem


@functools.cache
def _device_or_install_problem(device: str) -> str | None:
    """Why fla cannot run on ``device`` in this process, or None: fixed once fla and triton are imported (or
    found missing), so looked up once per device type rather than on every call of every layer."""
    if importlib.util.find_spec("fla") is None:  # looked up, not imported: cheap where it is missing
        return f"flash-linear-attention is not installed; install it with {INSTALL_HINT}"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return (
            "flash-linear-attention's Triton kernels run on a CUDA GPU; on a CPU only in Triton's "
            "interpreter (TRITON_INTERPRET=1 set before triton is imported; slow, for tests)"
        )
    if device not in ("cuda", "cpu"):
        return f"flash-linear-attention's Triton kernels run on CUDA (or a CPU, interpreted), not {device}"
    ops = _fla_ops()
    if isinstance(ops, str):
        return f"flash-linear-attention does not import ({ops}); install it with {INSTALL_HINT}"
    if device == "cpu" and not interpreted():
        return (
            "triton or fla was imported before TRITON_INTERPRET=1 was set, so their kernels were built for a "
            "GPU; set TRITON_INTERPRET=1 before anything imports triton (importing hf_efficient does)"
        )
    return None


def _unsupported(core, query, inputs) -> str | None:
    if not inputs.is_causal:  # computed without fla (module docstring): nothing to check
        return None
    return _unsupported_device_or_install(query)


@contextlib.contextmanager
def _first_config_when_interpreted(device: torch.device):
    """On a CPU (Triton's interpreter), autotuned kernels take their first configuration: the interpreter
    has no device to time the others on (triton's benchmarker asks for a GPU driver). Restored after."""
    if device.type != "cpu":
        yield
        return
    try:  # optional, in a try block for transformers' remote-code check (see ``interpreted``)
        from triton.runtime.autotuner import Autotuner
    except ImportError:  # triton missing: fla's kernels have nothing to tune either
        yield
        return
    prune = Autotuner.prune_configs
    Autotuner.prune_configs = lambda self, kwargs: prune(self, kwargs)[:1]
    try:
        yield
    finally:
        Autotuner.prune_configs = prune


def _fla_recurrence(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    values: torch.Tensor,
    log_gate: torch.Tensor | None,
    state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """S_t = exp(g_t) S_{t-1} + k'_t u_t^T and o_t = phi_q(q_t)^T S_t through fla's simple_gla op.

    Args:
        phi_q, phi_k: (b, h, n, m) query features and (gated) key features k'.
        values: (b, h, n, w), the columns u summed (V, or [V, 1]).
        log_gate: (b, h, n) log g_t <= 0 (float32), or None: no gate.
        state: (b, h, m, w) S before these tokens (float32 or wider), or None.

    Returns:
        (o (b, h, n, w) in the features' dtype, S after the last token (b, h, m, w) in float32).
    """
    chunk, recurrent = _fla_ops()
    op = recurrent if phi_q.device.type == "cpu" else chunk  # module docstring: the interpreter's choice
    m, width = phi_k.shape[-1], values.shape[-1]
    # fla's chunked backward takes only even K and V in half precision (d + 1, or an odd number of
    # features): a zero feature / zero value column changes nothing and is cut below
    phi_q, phi_k = (F.pad(t, (0, m % 2)) for t in (phi_q, phi_k))  # (b, h, n, m | m + 1)
    values = F.pad(values, (0, width % 2))  # (b, h, n, w | w + 1)
    if state is not None:
        state = F.pad(state.float(), (0, width % 2, 0, m % 2)).contiguous()  # (b, h, m | m + 1, w | w + 1)
    # fla's layout is [B, T, H, K]: (b, h, n, m) -> (b, n, h, m); fla makes its inputs contiguous
    q, k, v = (t.transpose(1, 2) for t in (phi_q, phi_k.to(phi_q.dtype), values.to(phi_q.dtype)))
    g = None if log_gate is None else log_gate.transpose(1, 2).float()  # (b, n, h)
    with _first_config_when_interpreted(phi_q.device):
        out, final = op(q, k, v, g=g, scale=1.0, initial_state=state, output_final_state=True)
    return out.transpose(1, 2)[..., :width], final[:, :, :m, :width].float()


def linear_attention_rows(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    value: torch.Tensor,
    log_gate: torch.Tensor | None,
    state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Numerators phi_q(q_t)^T S_t and denominators phi_q(q_t)^T z_t of the module docstring's recurrence.

    Args:
        phi_q, phi_k: (b, h, n, m) query features and (gated) key features k', 0 at padded keys.
        value: (b, h, n, d), 0 at padded keys.
        log_gate: (b, h, n) log g_t <= 0, or None: no gate.
        state: (b, h, m, d + 1) [S | z] before these tokens, or None.

    Returns:
        (numerators (b, h, n, d), denominators (b, h, n, 1), the [S | z] after the last token
        (b, h, m, d + 1)), all float32.
    """
    d = value.shape[-1]
    if log_gate is not None:  # z decays with S: one op over [V, 1] (d + 1 columns)
        rows, final = _fla_recurrence(phi_q, phi_k, append_ones(value), log_gate, state)
        numerator, denominator = rows.float().split([d, 1], dim=-1)
        return numerator, denominator, final
    # No gate: fla's op over V alone (d columns: whole tiles, as fla's own linear attention runs), and z as
    # a float32 prefix sum of the key features, z_t = z_0 + sum_{j <= t} phi_k(k_j): (b, h, n, m).
    numerator, final = _fla_recurrence(phi_q, phi_k, value, None, None if state is None else state[..., :d])
    running = phi_k.float().cumsum(2)
    if state is not None:
        running = running + state[:, :, None, :, d].float()  # z_0 (b, h, 1, m)
    denominator = torch.linalg.vecdot(phi_q.float(), running)[..., None]  # (b, h, n, 1)
    return numerator.float(), denominator, torch.cat([final, running[:, :, -1, :, None]], -1)


def _shift_gates(key, mask, maps, state: KernelState | None):
    """The softmax kernel's running shifts as gates (module docstring): (log gates (b, h, n), the levels the
    key features are computed relative to (b, h, n, 1), the final shift (b, h, 1, 1), -inf with no real key
    yet, as the reference's). Detached: the shift cancels out of the outputs."""
    maxima = masked_key_maxima(key, mask, maps.key_maxima)  # (b, h, n), -inf at padded keys
    running = maxima.float().cummax(-1).values  # c_t
    if state is not None:
        running = torch.maximum(running, state.shift[..., 0].float())
    # -inf (no real key yet: a prefix of each row, where every key feature is 0) -> the first finite level,
    # so every gate c_{t-1} - c_t stays finite and <= 0; 0 where a row has no real key at all
    first = torch.where(torch.isfinite(running), running, torch.inf).amin(-1, keepdim=True)  # (b, h, 1)
    level = torch.where(torch.isfinite(running), running, finite_or_zero(first))  # (b, h, n), finite
    start = level[..., :1]  # the state's own shift where finite: the first gate moves it to c_0
    if state is not None:
        carried = state.shift[..., 0].float()  # (b, h, 1)
        start = torch.where(torch.isfinite(carried), carried, start)
    previous = torch.cat([start, level[..., :-1]], -1)
    return previous - level, level[..., None], running[..., -1:, None]


def kernelized_fla(core, query, key, value, mask, state: KernelState | None = None):
    """The causal form of a kernelised core (``linear``, ``performer``) through fla: (output (b, h, n, d),
    the :class:`KernelState` after the last token)."""
    maps = core.feature_maps(query, mask)
    keep = None if mask is None else mask[:, None, :, None]  # (b, 1, n, 1)
    if keep is not None:
        value = value.masked_fill(~keep, 0.0)  # (b, h, n, d)
    shift = log_gate = None
    if maps.key_maxima is None:
        phi_k = maps.key_features(key, keep)  # (b, h, n, m), 0 at padded keys
    else:
        log_gate, level, shift = _shift_gates(key, mask, maps, state)
        phi_k = maps.key_features(key, keep, level)  # relative to each key's own level: each <= 1
    phi_q = maps.query_features(maps.query)  # (b, h, n, m)
    carried = None if state is None else state.sums
    numerator, denominator, sums = linear_attention_rows(phi_q, phi_k, value, log_gate, carried)
    output = (numerator / (denominator + core.config.eps)).to(query.dtype)
    return output, KernelState(sums.to(torch.promote_types(value.dtype, torch.float32)), shift)


def _attend_kernelized(core, query, key, value, inputs, state=None, return_state=False):
    mask = inputs.attention_mask
    if inputs.is_causal:
        output, final = kernelized_fla(core, query, key, value, mask, state)
    else:
        output, final = parallel_kernelized(core, query, key, value, mask, causal=False)
    return (AttentionOutput(output, None), final) if return_state else AttentionOutput(output, None)


def _rfa_causal(core, query, key, value, mask, state: torch.Tensor | None = None):
    """RFA's gated causal form through fla (the form of ``core.causal_in_float32``): (output (b, h, n, d),
    the [S | z] (b, h, 2m, d + 1) after the last token)."""
    keep = None if mask is None else mask[:, None, :, None]  # (b, 1, n, 1)
    if keep is not None:  # padded steps: no contribution, and g = 1 (log_gates), as the reference
        key, value = key.masked_fill(~keep, 0.0), value.masked_fill(~keep, 0.0)
    log_g, log_keep = core.log_gates(key, mask)  # (b, h, n) each
    phi_q, phi_k = core.feature_map(query), core.feature_map(key)  # (b, h, n, 2m)
    if keep is not None:  # a zeroed key's features are not 0 (cos 0 = 1): nothing of it may reach z
        phi_k = phi_k.masked_fill(~keep, 0.0)
    if core.uses_gate:  # k'_t = (1 - g_t) phi(k_t)
        phi_k, gate = phi_k * log_keep.exp()[..., None], log_g
    else:  # plain causal RFA: no gate
        gate = None
    numerator, denominator, sums = linear_attention_rows(phi_q, phi_k, value, gate, state)
    output = numerator / denominator.abs().clamp_min(core.config.eps)
    return output.to(query.dtype), sums


def _attend_rfa(core, query, key, value, inputs, state=None, return_state=False):
    if not inputs.is_causal:
        return core.reference(query, key, value, inputs, state=state, return_state=return_state)
    output, sums = core.causal_in_float32(
        functools.partial(_rfa_causal, core), query, key, value, inputs.attention_mask, state
    )
    return (AttentionOutput(output, None), sums) if return_state else AttentionOutput(output, None)


_DEVICES = frozenset({"cuda"})  # "auto" considers it on CUDA only; forced, on a CPU under the interpreter
# Listed after the types' own kernels, which "auto" keeps taking until the device check measures this one.
KERNELIZED_FLA = Kernel(
    "fla", _attend_kernelized, unsupported=_unsupported, carries_state=True, devices=_DEVICES
)
RFA_FLA = Kernel("fla", _attend_rfa, unsupported=_unsupported, carries_state=True, devices=_DEVICES)
