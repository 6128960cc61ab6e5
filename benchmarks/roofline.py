"""Roofline of eager code: the aten ops a call runs, their matrix FLOPs and the bytes they read and write,
and the time the machine's two limits allow for them.

Eager PyTorch runs one op after another and every op streams its operands from memory (the tensors of long
inputs do not fit in cache), so an op cannot take less than ``max(FLOPs / sgemm peak, bytes / bandwidth)``;
the call's *roofline time* is the sum over its ops, both limits measured in the same run. The measured time
over it (``roofline_fraction``) says how close the code runs to the machine *for the ops it runs*; the share
of the roofline time spent in ops whose bytes, not FLOPs, set their bound (``memory_bound_share``) says
which limit binds. A fused kernel that keeps intermediates in cache could go below this time: the roofline
is of the code as written, which is what a faster kernel of the same ops could reach.

What counts, per op (``Traffic``, a ``TorchDispatchMode`` that sees the forward and the backward):
- bytes: every distinct tensor argument read (an ``out=`` buffer, and what ``copy_`` / ``fill_`` /
  ``zero_`` overwrite, is only written) plus every output written; a tensor counts the bytes of the
  elements it spans, at most its storage (an expanded tensor reads its storage once). Ops that only make
  views (all outputs alias an input, nothing mutated) and ``empty`` move nothing.
- FLOPs: ``torch.utils.flop_counter``'s formulas (2 per multiply-add of matrix products and attention
  kernels; elementwise ops count 0), plus CPU's fused attention kernel, which that registry lacks, and
  products with a sparse operand (2 per stored entry per column, where the registry counts them dense).
- the limits: sgemm's peak, and the bandwidth of a large copy; random gathers (graph attention's rows)
  run below the copy bandwidth, so for them the roofline is a bound the machine cannot reach.

    with Traffic() as traffic:
        call()
    counts = traffic.records()  # JSON: [op, flops, bytes, calls] per distinct call
    roofline(counts, peak_gflops=170.0, bandwidth_gbps=18.0)  # {"seconds", "memory_bound_share", ...}

Counting runs in a point's process; the roofline is computed where the limits are known (after the run's
last sgemm measurement).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten
NO_TRAFFIC = {aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty, aten.new_empty_strided}
OVERWRITE_FIRST = {aten.copy_, aten.fill_, aten.zero_}  # write their first argument without reading it


def _cpu_sdpa_flops(func, args, out) -> int | None:
    """FLOPs of CPU's fused attention kernel (forward and backward), which torch's registry lacks."""
    packet = func._overloadpacket
    if packet is aten._scaled_dot_product_flash_attention_for_cpu:
        return sdpa_flop_count(args[0].shape, args[1].shape, args[2].shape)
    if packet is aten._scaled_dot_product_flash_attention_for_cpu_backward:
        return sdpa_backward_flop_count(args[0].shape, args[1].shape, args[2].shape, args[3].shape)
    return None


def _sparse_product_flops(func, args: tuple, out) -> int | None:
    """FLOPs of a product with a sparse operand: 2 per stored entry per column it meets (torch's registry
    would count the dense product); None when no input is sparse."""
    sparse = [t for t in args if isinstance(t, torch.Tensor) and t.layout != torch.strided]
    if not sparse:
        return None
    if func._overloadpacket is aten.sparse_sampled_addmm:  # (self: the pattern, mat1 (n, k), mat2 (k, m))
        return 2 * sparse[0]._nnz() * args[1].shape[-1]
    dense_out = isinstance(out, torch.Tensor) and out.layout == torch.strided
    if func._overloadpacket in flop_registry and dense_out:  # sparse (n, m) @ dense (m, d): out (n, d)
        return 2 * sparse[0]._nnz() * out.shape[-1]
    return 0  # elementwise work on the stored entries


def op_flops(func, args: tuple, kwargs: dict, out) -> int:
    """Matrix FLOPs of one op call (0 for ops without a formula: elementwise, reductions, copies)."""
    sparse = _sparse_product_flops(func, args, out)
    if sparse is not None:
        return sparse
    packet = func._overloadpacket
    formula = flop_registry.get(packet)
    if formula is None and packet.__name__.endswith("_"):  # in place (addmm_, baddbmm_): as functional
        formula = flop_registry.get(getattr(aten, packet.__name__.removesuffix("_"), None))
    if formula is not None:
        return int(formula(*args, **kwargs, out_val=out))
    return int(_cpu_sdpa_flops(func, args, out) or 0)


def _parts(t: torch.Tensor) -> list[torch.Tensor]:
    """A sparse tensor's dense parts (indices and values); a dense tensor itself."""
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout == torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    if t.layout == torch.sparse_csc:
        return [t.ccol_indices(), t.row_indices(), t.values()]
    return [t]


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes an op reads or writes for ``t``: its elements, at most its storage (an expanded tensor); a
    sparse tensor's indices and values."""
    if t.layout != torch.strided:
        return sum(map(tensor_bytes, _parts(t)))
    storage = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
    return min(t.numel() * t.element_size(), max(storage, 0))


def _distinct(tensors) -> list[torch.Tensor]:
    """The tensors of a flattened argument list, each counted once (the same tensor passed twice)."""
    seen, kept = set(), []
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            key = (t.data_ptr(), t.numel(), t.stride()) if t.layout == torch.strided else id(t)
            if key not in seen:
                seen.add(key)
                kept.append(t)
    return kept


def op_bytes(func, args: tuple, kwargs: dict, out) -> int:
    """Bytes one op call reads and writes (0 for views and ``empty``)."""
    outputs = _distinct(tree_flatten(out)[0])
    inputs = args[1:] if func._overloadpacket in OVERWRITE_FIRST else args
    read = _distinct(tree_flatten((inputs, {k: v for k, v in kwargs.items() if k != "out"}))[0])
    if func._overloadpacket in NO_TRAFFIC:
        return 0
    if not func._schema.is_mutable and all(t.layout == torch.strided for t in read + outputs):
        storages = {t.untyped_storage().data_ptr() for t in read}
        if outputs and all(t.untyped_storage().data_ptr() in storages for t in outputs):
            return 0  # a view (or detach, _unsafe_view...): no data moves
    return sum(map(tensor_bytes, read)) + sum(map(tensor_bytes, outputs))


class Traffic(TorchDispatchMode):
    """Counts every aten op run inside it, forward and backward: per distinct (op, FLOPs, bytes), how many
    calls. Repeated layers make the same calls, so a training step has a few hundred distinct ones."""

    def __init__(self):
        super().__init__()
        self.calls: Counter[tuple[str, int, int]] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func._overloadpacket).removeprefix("aten.")
        self.calls[name, op_flops(func, args, kwargs, out), op_bytes(func, args, kwargs, out)] += 1
        return out

    def records(self) -> list[list]:
        """The counts as JSON: ``[op, flops, bytes, calls]`` per distinct call, largest traffic first."""
        return [[*key, count] for key, count in sorted(self.calls.items(), key=lambda kv: -kv[0][2] * kv[1])]


def count_ops(call) -> dict:
    """``{"op_counts": Traffic.records()}`` of one ``call()``; a count that fails (an op this module cannot
    read) gives ``{"op_counts": None, "op_counts_error": why}`` instead: it must not cost the point its
    measurement."""
    try:
        with Traffic() as traffic:
            call()
    except Exception as error:
        return {"op_counts": None, "op_counts_error": f"{type(error).__name__}: {error}"[:200]}
    return {"op_counts": traffic.records()}


def roofline(records: list[list], peak_gflops: float, bandwidth_gbps: float, top: int = 5) -> dict:
    """The roofline of counted calls (:meth:`Traffic.records`) against the machine's limits (GFLOP/s, GB/s):
    its seconds, the share of them in calls bound by bytes, bytes, FLOPs, and the ``top`` ops by roofline
    time (name, calls, seconds, GB moved, the bound of most of its time)."""
    if not (peak_gflops and peak_gflops > 0 and bandwidth_gbps and bandwidth_gbps > 0):
        raise ValueError(
            f"roofline needs the machine's limits measured: got peak_gflops={peak_gflops}, "
            f"bandwidth_gbps={bandwidth_gbps}; measure both (benchmarks.harness) and pass them"
        )
    per_op: dict[str, dict] = defaultdict(lambda: {"calls": 0, "seconds": 0.0, "bytes": 0, "memory_s": 0.0})
    for op, flops, moved, calls in records:
        compute_s, memory_s = calls * flops / (peak_gflops * 1e9), calls * moved / (bandwidth_gbps * 1e9)
        tally = per_op[op]
        tally["calls"] += calls
        tally["seconds"] += max(compute_s, memory_s)
        tally["bytes"] += calls * moved
        tally["memory_s"] += memory_s if memory_s > compute_s else 0.0
    seconds = sum(t["seconds"] for t in per_op.values())
    ranked = sorted(per_op.items(), key=lambda item: -item[1]["seconds"])[:top]
    return {
        "seconds": seconds,
        "memory_bound_share": sum(t["memory_s"] for t in per_op.values()) / seconds if seconds else 0.0,
        "bytes": sum(calls * moved for _, _, moved, calls in records),
        "flops": sum(calls * flops for _, flops, _, calls in records),
        "ops": [
            {
                "op": op,
                "calls": t["calls"],
                "seconds": t["seconds"],
                "gb": t["bytes"] / 1e9,
                "bound": "memory" if t["memory_s"] > t["seconds"] / 2 else "compute",
            }
            for op, t in ranked
        ],
    }


def add_roofline(record: dict, sgemm: dict | None, bandwidth: dict | None) -> dict:
    """Add the roofline of a point's counted ops (:func:`count_ops`) against the run's limits (sgemm peak,
    copy bandwidth), and its measured time's fraction of it; null without counts or limits."""
    fields = {"roofline": None, "roofline_fraction": None}
    if record.get("status") == "ok" and record.get("op_counts") and sgemm and bandwidth:
        fields["roofline"] = roofline(record["op_counts"], sgemm["gflops"], bandwidth["copy_gbps"])
        fields["roofline_fraction"] = fields["roofline"]["seconds"] / record["median_s"]
    return {**record, **fields}


def largest_ops(limits: dict, count: int) -> str:
    """A summary cell: the ``count`` ops that take most of a roofline's time, each with its share of it and
    the limit that binds it, e.g. "bmm 39% (compute), mul 16% (memory)"."""
    return ", ".join(
        f"{o['op']} {100 * o['seconds'] / limits['seconds']:.0f}% ({o['bound']})"
        for o in limits["ops"][:count]
    )


def plot_fractions(points: list[tuple[str, dict, float]], title: str, path) -> None:
    """Horizontal bars, one per ``(label, roofline, measured seconds)``: the measured time's fraction of the
    roofline time, split into its compute-bound and memory-bound parts; lines at 100% (the machine's limit
    for those ops) and 50% (within 2x of it)."""
    from benchmarks.report import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.35 * len(points) + 1.6))
    labels = [label for label, _, _ in points]
    fractions = [limits["seconds"] / measured for _, limits, measured in points]
    memory = [f * limits["memory_bound_share"] for f, (_, limits, _) in zip(fractions, points, strict=True)]
    compute = [f - m for f, m in zip(fractions, memory, strict=True)]
    ax.barh(labels, compute, label="bound by the sgemm peak")
    ax.barh(labels, memory, left=compute, label="bound by the copy bandwidth")
    for x, style in ((1.0, "-"), (0.5, ":")):
        ax.axvline(x, color="black", linestyle=style, linewidth=1)
    ax.invert_yaxis()
    ax.set(xlabel="roofline time / measured time (1 = at the machine's limit for its ops)", title=title)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
