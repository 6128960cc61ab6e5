"""A mechanism registered outside the package reaches the benchmarks with its own settings: the toy of
tests/attention/test_new_mechanism.py, registered for the test, runs through the attention benchmark's
command line (in process; a ``--plugin`` through the benchmark's workers is test_plugins.py's) with its
class's ``benchmark_config``, no other file changed."""

from __future__ import annotations

import json

from benchmarks import attention as attention_benchmark
from benchmarks.mechanisms import bench_configs, resolve
from tests.attention.test_new_mechanism import NAME, registered_toy


def test_the_toy_runs_through_the_attention_benchmark(tmp_path):
    """Measured in process (``--in_process``) and without the machine's limits (no roofline): its FLOP
    model, its error against exact attention, and the settings its class gives."""
    out = tmp_path / "bench"
    options = ["--preset", "smoke", "--threads", "1", "--types", NAME, "--lengths", "32", "64"]
    options += ["--in_process", "--sgemm_size", "0", "--bandwidth_gib", "0", "--out", str(out)]
    with registered_toy():
        assert resolve(NAME) == (NAME, "sdpa", {"implementation": "reference"})
        assert bench_configs()[NAME] == {"implementation": "reference"}
        attention_benchmark.main(options)
    records = [r for r in json.loads((out / "results.json").read_text())["records"] if r["type"] == NAME]
    assert len(records) == 2 and all(r["status"] == "ok" and r["median_s"] > 0 for r in records)
    assert all(r["flops"] == 3 * 4.0 * r["length"] ** 2 * 16 * 2 for r in records)  # its FLOP model, fwd+bwd
    assert all(r["rel_error"] < 1e-5 for r in records)  # it is exact attention
    assert f"| {NAME} |" in (out / "summary.md").read_text()
