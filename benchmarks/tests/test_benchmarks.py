"""Smoke runs of the attention benchmarks: every registered type goes through the harness at tiny sizes."""

import argparse
import json
import math
import subprocess
import sys

import pytest

import hf_efficient
from benchmarks import attention as bench
from benchmarks import flops, patterns, peers, roofline
from benchmarks.mechanisms import benchmark_types
from benchmarks.studies import rfa_trained_attention
from hf_efficient import get_attention_class


@pytest.mark.parametrize("attention_type", benchmark_types())
def test_attention_benchmark_point_runs_in_process(attention_type):
    args = argparse.Namespace(
        type=attention_type,
        length=48,
        mode="fwd_bwd",
        batch=1,
        heads=2,
        head_dim=8,
        threads=1,
        warmup=0,
        repeats=1,
        config=None,
        graph_degree=4,
        memory_cap_gib=0,
        error_max_length=64,
        count_ops=True,
    )
    record = roofline.add_roofline(bench.run_point(args), {"gflops": 100.0}, {"copy_gbps": 10.0})
    assert record["status"] == "ok" and record["median_s"] > 0 and record["peak_mib"] >= 0
    # Every core's forward + backward is counted: it moves bytes and runs matrix products of some kind.
    limits = record["roofline"]
    assert limits["bytes"] > 3 * 48 * 2 * 8 * 4 and limits["flops"] > 0, limits
    assert record["roofline_fraction"] == pytest.approx(limits["seconds"] / record["median_s"])
    over_edges = (
        not attention_type.startswith("full")
        and get_attention_class(attention_type).capabilities.requires_edges
    )
    if attention_type.startswith("full") or over_edges:
        assert record["rel_error"] is None  # exact, or a different operator (attention over a random graph)
    else:
        assert 0 <= record["rel_error"] < float("inf")
    if attention_type in ("linformer", "nystromformer", "linear", "performer", "rfa"):
        assert record["rel_error"] < 1.5  # low-rank and kernel methods approximate softmax, even untrained


def test_attention_benchmark_cli_writes_json_and_plots(tmp_path):
    """The CLI in process (``--in_process``: no worker per point); test_plugins.py runs it with its workers,
    an allocator setting and a plugin."""
    options = "--preset smoke --threads 1 --types full_sdpa full_eager --in_process".split()
    bench.main([*options, "--lengths", "32", "64", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    assert {r["status"] for r in results["records"]} == {"ok"}
    assert all(r["in_process"] for r in results["records"]) and results["meta"]["bandwidth"]["in_process"]
    assert len(results["records"]) == 4  # 2 types x 2 lengths
    assert (tmp_path / "time.png").stat().st_size > 1000 and (tmp_path / "memory.png").stat().st_size > 1000
    assert "full_eager" in (tmp_path / "summary.md").read_text()
    assert results["meta"]["bandwidth"]["copy_gbps"] > 0
    assert all(0 < r["roofline_fraction"] for r in results["records"])
    assert "roofline time / measured time" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "roofline.png").stat().st_size > 1000


def test_pattern_plot_covers_every_type(tmp_path):
    for attention_type in hf_efficient.list_attention_types():
        weights = patterns.effective_weights(attention_type, n=24, head_dim=4)
        assert weights.shape == (24, 24) and (weights.sum(-1) > 0).all()
    out = tmp_path / "p.png"
    patterns.main(["--length", "24", "--types", "full", "--out", str(out)])
    assert out.stat().st_size > 1000


def test_benchmark_settings_are_valid_configs_of_their_cores():
    """A core's benchmark_config is a valid attention_config of its type, read by the benchmarks over the
    type's defaults; exact attention and a name that is not registered run with none."""
    from benchmarks.mechanisms import bench_configs, benchmark_config, resolve

    for attention_type, config in bench_configs().items():
        hf_efficient.validate_attention_config(attention_type, config)
    assert bench_configs() == {"bigbird": {"block_size": 64}, "longformer": {"attention_window": 512}}
    assert benchmark_config("full_sdpa") == benchmark_config("not_a_registered_type") == {}
    bigbird = {"block_size": 64, "num_random_blocks": 1}
    assert resolve("bigbird", '{"num_random_blocks": 1}')[2] == bigbird  # --config over the settings


def test_flop_models():
    n, h, d = 256, 8, 64
    for full in ("full_sdpa", "full_eager", "full"):
        assert flops.forward_flops(full, n, h, d) == 4 * n * n * d * h
    assert flops.point_flops("full_sdpa", n, "fwd_bwd", heads=h, head_dim=d) == 3 * 4 * n * n * d * h
    assert flops.forward_flops("not_a_registered_type", n, h, d) is None  # unknown: null, no crash
    # Linear-time types: twice the tokens, twice the FLOPs (at large n, where boundaries do not matter).
    linear_time = {
        "longformer": {"attention_window": 512, "global_token_indices": [0]},
        "bigbird": {"block_size": 64},
        "linformer": {},
        "nystromformer": {},
        "linear": {},
        "performer": {},
        "rfa": {},
        "reformer_lsh": {"num_buckets": 64},  # the automatic count grows with n (hashing O(n^2 d / c))
        "long_short": {},
        "swin_window": {},
        "graph_sparse": {},
        "multi_hop": {},
    }
    for attention_type, config in linear_time.items():
        if attention_type not in hf_efficient.list_attention_types():
            continue
        small, large = (flops.forward_flops(attention_type, m, h, d, config) for m in (16384, 32768))
        assert 0 < small and 1.9 < large / small < 2.1, attention_type
    # Windowed types are cheaper than exact attention at long n; the band count is exact for a short one.
    assert flops.forward_flops("longformer", 8, 1, 1, {"attention_window": 4}) == 4 * (8 * 5 - 2 * 3)
    assert flops.forward_flops("longformer", 16384, h, d, {}) < flops.forward_flops("full", 16384, h, d) / 10
    assert all(flops.formula(t) for t in linear_time)


def test_throughput_fields_and_summary():
    args = argparse.Namespace(heads=2, head_dim=8, batch=1, graph_degree=4)
    sgemm = {"size": 64, "threads": 1, "gflops": 10.0}
    ok = {"type": "full_sdpa", "config": {}, "length": 64, "mode": "fwd", "status": "ok", "median_s": 1e-3}
    ok.update(peak_mib=1.0, rel_error=None)
    record = bench.add_throughput(ok, args, sgemm)
    assert record["flops"] == 4 * 64 * 64 * 8 * 2
    assert record["gflops"] == pytest.approx(record["flops"] / 1e-3 / 1e9)
    assert record["peak_fraction"] == pytest.approx(record["gflops"] / 10.0)
    unknown = bench.add_throughput({**ok, "type": "some_new_type"}, args, sgemm)
    assert unknown["flops"] is None and unknown["gflops"] is None and unknown["peak_fraction"] is None
    failed = bench.add_throughput(
        {"type": "full_sdpa", "length": 64, "mode": "fwd", "status": "error"}, args, None
    )
    assert failed["gflops"] is None
    table = bench.summarize([record, {**unknown, "length": 128}], ["fwd"], sgemm)
    assert "GFLOP/s" in table and "sgemm peak 10.0" in table and "4 n^2 d" in table


def test_peers_runs_ours_and_skips_missing_peers(tmp_path, monkeypatch):
    missing = [p._replace(modules=("no_such_module_for_this_test",)) for p in peers.PEERS]
    monkeypatch.setattr(peers, "PEERS", missing)
    monkeypatch.setattr(peers, "PEERS_BY_NAME", {p.name: p for p in missing})
    argv = ["--in_process", "--mechanisms", "performer", "linformer", "--lengths", "64", "--modes", "fwd_bwd"]
    argv += ["--heads", "2", "--head_dim", "8", "--repeats", "1", "--warmup", "0", "--threads", "1"]
    results = peers.main(argv + ["--out", str(tmp_path)])
    by_impl = {r["impl"]: r for r in results["records"]}
    assert by_impl["ours"]["status"] == "ok" and by_impl["ours"]["median_s"] > 0
    statuses = {r["status"] for r in results["records"] if r["impl"] != "ours"}
    assert statuses == {
        "skipped: not installed (no module no_such_module_for_this_test; "
        "pip install -e '.[bench]' after torch)"
    }
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["compared"]
    assert "performer-pytorch" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "time.png").stat().st_size > 1000


# The smallest length each mechanism's peers accept with the benchmark settings (window 512, blocks of 64).
PEER_LENGTHS = {"longformer": 512, "bigbird": 768, "reformer_lsh": 256, "nystromformer": 128}


@pytest.mark.parametrize("name", [p.name for p in peers.PEERS])
def test_peer_point_runs_when_installed(name):
    peer = peers.PEERS_BY_NAME[name]
    if peers.missing_modules(peer):
        pytest.skip(f"{name} is not installed (bench extra)")
    n = PEER_LENGTHS.get(peer.mechanism, 64)
    assert peer.unsupported(peers.our_settings(peer.mechanism), n) is None
    args = argparse.Namespace(
        impl=name, length=n, mode="fwd_bwd", batch=1, heads=2, head_dim=8, threads=1, warmup=0, repeats=1
    )
    args.memory_cap_gib = 0
    record = peers.run_peer_point(args)
    assert record["status"] == "ok" and record["median_s"] > 0


def test_peer_inputs_are_ours():
    """transformers' Longformer layer, fed through the pass-through projections, computes our operator."""
    import torch

    from hf_efficient.attention import AttentionSpec, build_attention

    b, h, n, d = 1, 2, 512, 8
    settings = peers.our_settings("longformer")
    forward, (q, k, v), _ = peers.build_hf_longformer(settings, b, h, n, d, False)
    with torch.no_grad():
        theirs = forward().view(b, n, h, d).transpose(1, 2)
        heads = lambda t: t.transpose(0, 1).reshape(b, n, h, d).transpose(1, 2)
        spec = AttentionSpec(num_heads=h, head_dim=d, max_seq_len=n)
        ours = build_attention("longformer", spec, settings)(heads(q), heads(k), heads(v)).output
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-4)


def test_rfa_trained_attention_compares_with_the_kernel_it_estimates():
    import torch

    from hf_efficient.attention import AttentionSpec, build_attention

    spec = AttentionSpec(num_heads=2, head_dim=8, max_seq_len=64)
    q, k = (torch.randn(3, 2, 20, 8, generator=torch.Generator().manual_seed(s)) for s in (0, 1))
    # many features: the estimate matches its kernel, softmax(sigma^2 q^ . k^) for a scalar sigma
    many = build_attention("rfa", spec, {"num_features": 8192, "sigma": 0.8}).eval()
    stats = rfa_trained_attention.layer_statistics(many, q, k)
    qn, kn = torch.nn.functional.normalize(q, dim=-1), torch.nn.functional.normalize(k, dim=-1)
    softmax = torch.softmax(0.64 * qn @ kn.transpose(-1, -2), dim=-1)
    assert stats["exact_entropy"] == pytest.approx(
        rfa_trained_attention.entropy(softmax).mean().item(), rel=1e-5
    )
    assert stats["exact_entropy"] < stats["uniform_entropy"] == pytest.approx(math.log(20))
    assert stats["l1_distance"] < 0.05 and stats["negative_share"] == 0.0
    # few features at a large sigma: the estimate departs from the kernel and goes negative
    few = build_attention("rfa", spec, {"num_features": 4, "sigma": 3.0}).eval()
    stats = rfa_trained_attention.layer_statistics(few, q, k)
    assert stats["l1_distance"] > 0.5 and stats["negative_share"] > 0.1


ALLOCATOR_PROBE = """
import argparse, ctypes, sys
import torch
from benchmarks import harness

class MallInfo2(ctypes.Structure):  # glibc >= 2.33
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
harness.use_allocator(argparse.Namespace(allocator=sys.argv[1]))
mapped = []
for _ in range(2):  # glibc's dynamic threshold rises to a mapped block's size once it is freed
    block = torch.ones(5 * 2**20)  # 20 MiB
    mapped.append(libc.mallinfo2().hblkhd >= 20 * 2**20)
    del block
print(mapped)
"""


@pytest.mark.slow  # a fresh interpreter per setting
@pytest.mark.parametrize(
    "allocator, mapped",
    [("glibc", [True, False]), ("lean", [True, True]), ("keep", [False, False])],
)
def test_allocator_settings_decide_which_blocks_are_mapped(allocator, mapped):
    """glibc maps a 20 MiB block, then serves the next one from its heap (its threshold grew); "lean" maps
    both (threshold fixed at 16 MiB); "keep" maps neither."""
    probe = subprocess.run(
        [sys.executable, "-c", ALLOCATOR_PROBE, allocator], capture_output=True, text=True, check=True
    )
    assert probe.stdout.strip() == str(mapped)


def test_measure_alternating_takes_turns_after_its_warmup():
    """The calls run in turn (a, b, a, b, ...), warm-up rounds untimed: each gets ``repeats`` times."""
    from benchmarks import harness

    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("a", "b")}
    times = harness.measure_alternating(calls, warmup=1, repeats=3)
    assert order == ["a", "b"] * 4
    assert {name: len(t) for name, t in times.items()} == {"a": 3, "b": 3}
