"""The generation benchmark: a point decodes from the cache its prompt left (in process, every causal type),
the growth table judges the bounds from the records, and the command line writes its files."""

import argparse
import json

import pytest

from benchmarks import generation

SMOKE = generation.PRESETS["smoke"]


@pytest.mark.parametrize("bench_type", generation.causal_benchmark_types())
def test_point_decodes_from_the_prompts_cache(bench_type):
    point = argparse.Namespace(
        type=bench_type,
        length=24,
        threads=1,
        warmup=1,
        repeats=2,
        model=json.dumps(SMOKE["model"]),
        config=None,
    )
    record = generation.run_point(point)
    assert record["status"] == "ok" and len(record["times_s"]) == 2 and record["median_s"] > 0
    assert record["tokens_seen"] == 24 + 3  # the prompt, the warm-up step and the timed ones
    assert record["prefill_s"] > 0 and record["cache_mib"] > 0
    window = record["config"].get("attention_window")  # longformer keeps its last `window` tokens
    if bench_type == generation.BASELINE or (window or 0) >= 27:  # every token's keys and values are kept
        assert record["cache_mib_after_steps"] == pytest.approx(record["cache_mib"] * 27 / 24)
    else:
        assert record["cache_mib_after_steps"] == record["cache_mib"]


def fake(name, length, ms, cache):
    return {
        "type": name,
        "length": length,
        "status": "ok",
        "median_s": ms / 1e3,
        "cache_mib": cache,
        "prefill_s": length / 1e4,
        "config": {},
    }


def test_summary_judges_constant_time_and_memory_from_the_records():
    """x1.3 in latency and an unchanged cache from the shortest to the longest context pass; more fails;
    exact attention grows by design and is not judged."""
    records = [
        fake("full_sdpa", 1024, 2.0, 4.0),
        fake("full_sdpa", 65536, 40.0, 256.0),
        fake("linear", 1024, 2.0, 0.5),
        fake("linear", 65536, 2.5, 0.5),
        fake("performer", 1024, 2.0, 1.0),
        fake("performer", 65536, 2.7, 1.0),
        fake("rfa", 1024, 2.0, 1.0),
        fake("rfa", 65536, 2.0, 1.5),
    ]
    meta = {"model": SMOKE["model"], "threads": 1, "repeats": 3}
    summary = generation.summarize(records, meta)
    growth = {
        line.split("|")[1].strip(): line for line in summary.splitlines() if "->" in line and "|" in line
    }
    assert "x20.00" in growth["full_sdpa"] and "(x64.0)" in growth["full_sdpa"]
    assert "grows by design" in growth["full_sdpa"]
    assert "x1.25" in growth["linear"] and growth["linear"].rstrip(" |").endswith("yes")
    assert "x1.35" in growth["performer"] and growth["performer"].rstrip(" |").endswith("NO")  # too slow
    assert growth["rfa"].rstrip(" |").endswith("NO")  # its cache grew


def test_generation_benchmark_smoke(tmp_path):
    """The CLI in process (``--in_process``; the harness's worker path is test_plugins.py's)."""
    options = ["--preset", "smoke", "--threads", "1", "--types", "full_sdpa", "linear", "--in_process"]
    generation.main([*options, "--lengths", "16", "48", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    records = results["records"]
    assert {r["status"] for r in records} == {"ok"}, records
    assert sorted((r["type"], r["length"]) for r in records) == [
        ("full_sdpa", 16),
        ("full_sdpa", 48),
        ("linear", 16),
        ("linear", 48),
    ]
    cache = {(r["type"], r["length"]): r["cache_mib"] for r in records}
    assert cache["full_sdpa", 48] == pytest.approx(3 * cache["full_sdpa", 16])  # every key and value
    assert cache["linear", 48] == cache["linear", 16]  # the running sums
    summary = (tmp_path / "summary.md").read_text()
    assert "| full_sdpa |" in summary and "from n=16 -> n=48" in summary
    assert (tmp_path / "generation.png").stat().st_size > 1000
