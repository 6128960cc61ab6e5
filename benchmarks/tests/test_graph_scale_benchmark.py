"""Smoke runs of benchmarks.studies.graph_scale: every setup in process at a tiny size, the CLI in process
with PyG's peers and the bandwidth test, and the CLI end to end with its workers and a point that exceeds its
address-space cap (recorded as a status, larger points skipped)."""

import argparse
import json

import pytest

from benchmarks.studies import graph_scale as bench


def test_setups_come_from_the_registry():
    # every graph type that attends along edges, the PyG peers, GraphGPS, exact attention with both kernels
    edge_types = ["gat", "gatv2", "graph_sparse", "multi_hop"]
    peers = ["pyg_transformer_conv", "pyg_gat_conv"]
    assert list(bench.setups()) == [*edge_types, *peers, "gps_performer", "full_eager", "full_sdpa"]


@pytest.mark.parametrize("bench_type", list(bench.setups()))
def test_graph_scale_point_runs_in_process(bench_type):
    args = argparse.Namespace(
        type=bench_type, nodes=48, edges_per_node=3, feature_dim=8, num_labels=3, seed=0, threads=1,
        warmup=0, repeats=1, memory_cap_gib=0,
    )  # fmt: skip
    record = bench.run_point(args)
    assert (
        record["status"] == "ok" and record["median_s"] > 0 and record["peak_mib"] > record["step_mib"] >= 0
    )
    assert (record["nodes"], record["edges"]) == (48, 144)
    if bench_type.startswith("full"):
        assert record["attended_edges"] is None  # dense attention reads no edges
    else:  # the random edges plus a self loop for every node that lacks one
        source, target = bench.synthetic_graph(48, 144, 8, 3, 0)["edge_index"]
        looped = len(set(source[source == target].tolist()))
        assert record["attended_edges"] == 144 + 48 - looped


@pytest.mark.slow  # a worker per point, each a fresh interpreter (about 20 s)
def test_graph_scale_cli_records_out_of_memory_and_writes_files(tmp_path):
    """The command line with its workers (its own process is this one: one start-up less): only a worker has
    the address-space cap that turns an over-large point into a status."""
    options = ["--preset", "smoke", "--threads", "1", "--types", "full_eager", "--memory_cap_gib", "3"]
    options += ["--bandwidth_gib", "0"]  # no bandwidth test
    bench.main([*options, "--nodes", "64", "20000", "40000", "--out", str(tmp_path)])
    records = json.loads((tmp_path / "results.json").read_text())["records"]
    status = {(r["type"], r["nodes"]): r["status"] for r in records}
    assert status["full_eager", 64] == "ok"
    # n = 20,000: the (4, n, n) eager scores alone are 6.4 GB, beyond the 3 GiB cap: fails fast, recorded.
    assert status["full_eager", 20000].startswith("out of memory")
    assert status["full_eager", 40000] == "skipped (failed at smaller n)"
    summary = (tmp_path / "summary.md").read_text()
    assert "| full_eager |" in summary and "out of memory" in summary
    assert (tmp_path / "graph_scale.png").stat().st_size > 0


def test_graph_scale_cli_with_peers_reports_time_per_edge_and_bandwidth(tmp_path):
    """As docs/graphs.md runs it, at a tiny size and in process (``--in_process``; the test above runs the
    workers): ours and PyG's layers in one run, the machine's bandwidth."""
    types = ["--types", "graph_sparse", "gat", "pyg_transformer_conv", "pyg_gat_conv"]
    bench.main(
        ["--preset", "smoke", *types, "--nodes", "64", "128", "--bandwidth_gib", "0.03125", "--in_process",
         "--out", str(tmp_path)]
    )  # fmt: skip
    results = json.loads((tmp_path / "results.json").read_text())
    records = {(r["type"], r["nodes"]): r for r in results["records"]}
    for name in ("graph_sparse", "gat", "pyg_transformer_conv", "pyg_gat_conv"):
        small, large = records[name, 64], records[name, 128]
        assert small["status"] == large["status"] == "ok"
        assert large["ns_per_edge"] == pytest.approx(large["median_s"] / large["attended_edges"] * 1e9)
        assert large["attention_gbps"] == pytest.approx(large["traffic_gb"] / large["attention_s"])
    # a peer moves what the type it stands in for moves
    assert records["pyg_gat_conv", 128]["traffic_gb"] == records["gat", 128]["traffic_gb"]
    assert records["pyg_transformer_conv", 128]["traffic_gb"] == records["graph_sparse", 128]["traffic_gb"]
    bandwidth = results["meta"]["runs"][-1]["bandwidth"]
    assert bandwidth["copy_gbps"] > 0 and bandwidth["gather_gbps"] > 0
    summary = (tmp_path / "summary.md").read_text()
    assert "nanoseconds per attended edge" in summary and "| pyg_gat_conv |" in summary
    assert "Machine bandwidth, 1 thread(s), same run: copy" in summary
