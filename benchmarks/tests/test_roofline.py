"""benchmarks.roofline: what each aten op is counted to move and compute, and the roofline it adds up to."""

import warnings

import pytest
import torch

from benchmarks.roofline import Traffic, count_ops, roofline

FLOAT = 4  # bytes


class Tally:
    def __init__(self):
        self.calls = self.flops = self.bytes = 0


def counted(call) -> dict[str, Tally]:
    """Per op: calls, FLOPs and bytes of everything ``call`` runs."""
    with Traffic() as traffic:
        call()
    ops = {}
    for op, flops, moved, calls in traffic.records():
        tally = ops.setdefault(op, Tally())
        tally.calls, tally.flops, tally.bytes = (
            tally.calls + calls,
            tally.flops + calls * flops,
            tally.bytes + calls * moved,
        )
    return ops


def test_elementwise_ops_read_their_inputs_and_write_their_output():
    a, b = torch.randn(1000), torch.randn(1000)
    assert counted(lambda: a + b)["add"].bytes == 3 * 1000 * FLOAT
    assert counted(lambda: a.add_(b))["add_"].bytes == 3 * 1000 * FLOAT  # read, modify, write
    assert counted(lambda: a.copy_(b))["copy_"].bytes == 2 * 1000 * FLOAT  # the target is not read
    assert counted(lambda: a.zero_())["zero_"].bytes == 1000 * FLOAT
    assert counted(lambda: a * a)["mul"].bytes == 2 * 1000 * FLOAT  # one tensor passed twice is read once
    # An expanded row is read once, not once per row it stands for.
    row, full = torch.randn(1, 1000), torch.randn(50, 1000)
    assert counted(lambda: full + row.expand(50, 1000))["add"].bytes == (50 + 1 + 50) * 1000 * FLOAT


def test_views_and_empty_move_nothing():
    a = torch.randn(10, 100)
    ops = counted(lambda: (a.t(), a.view(100, 10), a[2:5], a.detach(), torch.empty(10**6)))
    assert ops and all(tally.bytes == 0 for tally in ops.values()), list(ops)


def test_matrix_products_and_cpu_attention_have_flops():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    mm = counted(lambda: a @ b)["mm"]
    assert mm.flops == 2 * 64 * 32 * 16 and mm.bytes == (64 * 32 + 32 * 16 + 64 * 16) * FLOAT
    c = torch.zeros(64, 16)
    in_place = counted(lambda: c.addmm_(a, b))["addmm_"]  # as a chunked loss accumulates a weight's gradient
    assert in_place.flops == 2 * 64 * 32 * 16 and in_place.bytes == (2 * 64 * 16 + 64 * 32 + 32 * 16) * FLOAT
    q = torch.randn(1, 2, 128, 8)
    sdpa = counted(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    (name,) = [n for n in sdpa if "attention" in n]
    assert sdpa[name].flops == 2 * 4 * 128 * 128 * 8  # heads x (QK^T + PV), 2 per multiply-add
    # A product with a sparse operand: 2 per stored entry per column, not the dense n x n x d.
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        pattern = torch.eye(100).to_sparse_csr()  # 100 stored entries
    dense = torch.randn(100, 8)
    sparse_mm = sum(t.flops for t in counted(lambda: pattern @ dense).values())
    assert sparse_mm == 2 * 100 * 8


def test_each_op_is_bound_by_the_slower_of_its_two_limits():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    # 1 GFLOP/s and 1 GB/s: the product's 33.5 MFLOP take longer than its 0.8 MB; the add is all bytes.
    with Traffic() as traffic:
        (a @ b) + a
    summary = roofline(traffic.records(), peak_gflops=1.0, bandwidth_gbps=1.0)
    mm, add = 2 * 256**3 / 1e9, 3 * 256 * 256 * FLOAT / 1e9
    assert summary["seconds"] == pytest.approx(mm + add)
    assert summary["memory_bound_share"] == pytest.approx(add / (mm + add))
    assert [(op["op"], op["bound"]) for op in summary["ops"]] == [("mm", "compute"), ("add", "memory")]


def test_backward_ops_are_counted():
    w = torch.randn(32, 32, requires_grad=True)
    x = torch.randn(64, 32)
    mm = counted(lambda: (x @ w).sum().backward())["mm"]
    assert mm.calls == 2 and mm.flops == 2 * (2 * 64 * 32 * 32)


def test_limits_must_be_measured():
    with pytest.raises(ValueError, match="peak_gflops=0.*measure both"):
        roofline([["mm", 10, 10, 1]], peak_gflops=0.0, bandwidth_gbps=10.0)


def test_repeated_calls_are_counted_once_with_their_number():
    a = torch.randn(100)
    with Traffic() as traffic:
        for _ in range(4):
            a + a
    assert traffic.records() == [["add", 0, 2 * 100 * FLOAT, 4]]


def test_a_count_that_fails_costs_nothing_but_its_counts():
    def call():
        raise RuntimeError("an op the counter cannot read")

    assert count_ops(call) == {
        "op_counts": None,
        "op_counts_error": "RuntimeError: an op the counter cannot read",
    }
    a = torch.ones(3)
    assert count_ops(lambda: a + a)["op_counts"] == [["add", 0, 2 * 3 * FLOAT, 1]]
