"""The dropout benchmark (benchmarks/dropout.py) at its smoke size: every case timed on both sides, the
report written."""

import json

from benchmarks import dropout


def test_dropout_benchmark_smoke(tmp_path):
    records = dropout.main(["--preset", "smoke", "--out", str(tmp_path)])
    assert [r["case"].split(" (")[0] for r in records] == ["dropout", "dropout", "sdpa with dropout"]
    for r in records:
        assert r["torch_ms"] > 0 and r["ours_ms"] > 0 and r["speedup"] == r["torch_ms"] / r["ours_ms"]
    assert 0 < records[0]["fraction_of_copy_bandwidth"] < 1
    assert json.loads((tmp_path / "results.json").read_text())["meta"]["p"] == dropout.P
    assert "| dropout (2, 2, 16, 16) | 1 |" in (tmp_path / "summary.md").read_text()
    assert (tmp_path / "speedup.png").stat().st_size > 1000
