"""The ModernBERT benchmark (benchmarks/studies/modernbert.py) at its smoke size: every side, mode and head
setting measured, the same model on every side, the report written."""

import json

import pytest

from benchmarks.studies import modernbert


def test_modernbert_benchmark_smoke(tmp_path):
    """In process (``--in_process``): transformers' ModernBERT, ours with the checkpoint's pattern and ours
    with linear global layers, training step and forward, sparse_prediction on and off, 64 tokens past the
    smoke model's 16-token window."""
    sides = ["transformers", "ours", "ours_linear"]
    options = ["--preset", "smoke", "--threads", "1", "--in_process", "--models", *sides]
    results = modernbert.main([*options, "--out", str(tmp_path)])
    records = results["records"]
    assert {r["status"] for r in records} == {"ok"}, records
    points = {(r["side"], r["mode"], r["sparse"]) for r in records}
    assert points == {(s, m, p) for s in sides for m in modernbert.MODES for p in (True, False)}
    for r in records:
        assert r["tokens_per_s"] == pytest.approx(64 / r["median_s"]) and r["length"] == 64
    first = {(r["side"], r["mode"], r["sparse"]): r["first_loss"] for r in records}
    for mode in modernbert.MODES:
        for sparse in (True, False):  # the checkpoint's pattern through our kernels: transformers' loss
            assert first["ours", mode, sparse] == pytest.approx(first["transformers", mode, sparse], abs=1e-5)
    assert {tuple(r["attention_types"]) for r in records if r["side"] == "ours"} == {("full", "longformer")}
    assert {tuple(r["attention_types"]) for r in records if r["side"] == "ours_linear"} == {
        ("linear", "longformer")
    }
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["sides"]["ours_linear"] == [
        "linear",
        {},
    ]
    summary = (tmp_path / "summary.md").read_text()
    assert "| transformers | True | " in summary and "(x1.00)" in summary and "### forward" in summary
    assert (tmp_path / "modernbert.png").stat().st_size > 1000
