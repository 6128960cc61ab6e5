"""benchmarks.studies.minilm_conversion end to end at a tiny size: the cosines and the files it writes."""

import json

import pytest

from .cli import run_module


@pytest.mark.slow  # real checkpoint and data, several model loads (about 15 s)
def test_minilm_conversion_cosines(tmp_path):
    options = ["--num_sentences", "4", "--threads", "1", "--types", "full", "longformer"]
    run_module("studies.minilm_conversion", *options, "--out", str(tmp_path))
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["meta"]["num_sentences"] == 4 and len(results["sentences"]) == 4
    assert results["meta"]["tokens_max"] > 9  # the short window below does not cover the sentences
    records = {r["label"]: r for r in results["records"]}
    assert {r["status"] for r in records.values()} == {"ok"}
    assert {r["type"] for r in records.values()} == {"full", "longformer"}
    # The reference against itself, transformers' BertModel and the eager kernel are exact.
    for label in ("full", "transformers BertModel", "full (eager)"):
        assert records[label]["min_cos"] > 1 - 1e-6 and records[label]["passed"]
    # A window covering every sentence is exact attention: 1 to 1e-5, and no new parameters.
    covering = records["longformer w=512"]
    assert covering["min_cos"] >= 1 - 1e-5 and covering["passed"] and covering["new_params"] == 0
    assert len(covering["cosines"]) == 4
    # A 16-token window is an approximation: visibly below 1, but the embedding keeps its direction.
    assert 0.2 < records["longformer w=16"]["mean_cos"] < 1 - 1e-4
    summary = (tmp_path / "summary.md").read_text()
    assert "longformer w=512" in summary and "FAIL" not in summary
    assert (tmp_path / "cosine.png").stat().st_size > 1000
