"""The serving benchmark: an eager point in process, and a smoke run of one type through the three engines at
one tiny length."""

import argparse
import json

import pytest

from benchmarks import serving


def test_serving_eager_point_runs_in_process(tmp_path):
    """The point function in this process: the eager engine, not at the profile length (the profile, the
    compiled and the ONNX Runtime engines are the slow smoke run's)."""
    point = argparse.Namespace(
        type="longformer", engine="eager", length=32, threads=1, warmup=0, repeats=1, max_length=32,
        model=json.dumps(serving.PRESETS["smoke"]["model"]), onnx_dir=str(tmp_path), profile_length=64,
    )  # fmt: skip
    record = serving.run_point(point)
    assert record["status"] == "ok" and record["median_s"] > 0 and record["tokens_per_s"] > 0
    assert record["attention_type"] == "longformer" and "max_abs_diff" not in record
    assert record["profile"] is None


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
