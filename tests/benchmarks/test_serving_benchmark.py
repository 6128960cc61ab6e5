"""Smoke run of the serving benchmark: one type through the three engines at one tiny length."""

import json

import pytest

from benchmarks import serving


@pytest.mark.slow  # three worker processes, one ONNX export and one inductor compile
def test_serving_benchmark_smoke(tmp_path):
    """Under a minute: each engine (eager, compile, ONNX Runtime) in its own worker, as the benchmark runs
    them (not --in_process: inductor's compile would start its own worker processes in the test's), and the
    compile and the export are the very steps the benchmark times; one type at one length, the smallest run
    there is. The command line itself runs in this process (one start-up less)."""
    options = ["--preset", "smoke", "--threads", "1", "--types", "longformer", "--lengths", "48"]
    serving.main([*options, "--profile_length", "48", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    records = {r["engine"]: r for r in results["records"]}
    assert set(records) == {"eager", "compile", "onnxruntime"}
    assert {r["status"] for r in records.values()} == {"ok"}, records
    for r in records.values():
        assert r["length"] == 48 and r["median_s"] > 0 and r["peak_mib"] >= 0
    for engine in ("compile", "onnxruntime"):  # the same outputs as eager
        assert records[engine]["max_abs_diff"] < 1e-4
    assert records["compile"]["compile_s"] > 0 and records["onnxruntime"]["export_s"] > 0
    for engine in ("eager", "onnxruntime"):  # where the time goes, at the profiled length
        profile = records[engine]["profile"]
        assert profile and all(p["ms"] >= 0 and 0 <= p["share"] <= 1 for p in profile)
    assert not (tmp_path / "onnx").exists()  # the ONNX files go to a temporary folder
    summary = (tmp_path / "summary.md").read_text()
    assert "| longformer | onnxruntime |" in summary and "#### profile: longformer, onnxruntime" in summary
    for name in ("latency.png", "memory.png"):
        assert (tmp_path / name).stat().st_size > 1000
