"""Smoke runs of the benchmark scripts: every registered type goes through the harness at tiny sizes."""

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hf_efficient
from hf_efficient import get_attention_class

ROOT = Path(__file__).resolve().parents[1]


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "attention_type",
    ["full_eager", "full_sdpa"] + [t for t in hf_efficient.list_attention_types() if t != "full"],
)
def test_attention_benchmark_point_runs_in_process(attention_type):
    bench = load_script("attention")
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
    )
    record = bench.run_point(args)
    assert record["status"] == "ok" and record["median_s"] > 0 and record["peak_mib"] >= 0
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
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "attention.py"),
        "--preset",
        "smoke",
        "--threads",
        "1",
        "--types",
        "full_sdpa",
        "full_eager",
        "--lengths",
        "32",
        "64",
        "--out",
        str(tmp_path),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    results = json.loads((tmp_path / "results.json").read_text())
    assert {r["status"] for r in results["records"]} == {"ok"}
    assert len(results["records"]) == 4  # 2 types x 2 lengths
    assert (tmp_path / "time.png").stat().st_size > 1000 and (tmp_path / "memory.png").stat().st_size > 1000
    assert "full_eager" in (tmp_path / "summary.md").read_text()


def test_pattern_plot_covers_every_type(tmp_path):
    patterns = load_script("patterns")
    for attention_type in hf_efficient.list_attention_types():
        weights = patterns.effective_weights(attention_type, n=24, head_dim=4)
        assert weights.shape == (24, 24) and (weights.sum(-1) > 0).all()
    out = tmp_path / "p.png"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "patterns.py"),
            "--length",
            "24",
            "--types",
            "full",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert out.stat().st_size > 1000
