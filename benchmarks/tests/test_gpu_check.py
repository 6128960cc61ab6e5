"""benchmarks/gpu_check.sh --dry-run: on a CPU it runs the GPU check's code at tiny sizes (as CI does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hf_efficient

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a benchmark process and a pytest process
def test_gpu_check_dry_run_measures_every_type(tmp_path):
    """About a minute: the dry run is the only test of the script as CI and a GPU machine run it (its four
    parts in one process that imports torch and transformers, then pytest collecting the GPU tests). Each
    part at its smallest size: one length (two for the decoding comparison)."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu_check: passed" in done.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    records = {(r["type"], r["length"]): r for r in results["records"]}
    types = {t for t, _ in records}
    assert {"full", "full_bias_sdpa", "full_bias_flex"} <= types
    assert set(hf_efficient.list_attention_types("text")) <= types
    assert all(r["status"] == "ok" and r["median_s"] > 0 for r in records.values()), records
    # the FlexAttention types ran their flex path, forward only on the CPU; the others forward + backward
    assert records[("longformer", 256)]["mode"] == "fwd" and records[("linear", 256)]["mode"] == "fwd_bwd"
    summary = (tmp_path / "summary.md").read_text()
    assert "| full | 256 |" in summary and "x sdpa" in summary
    assert (tmp_path / "time.png").stat().st_size > 0 and (tmp_path / "environment.txt").exists()
    # the causal run: every type with a causal form, and flash-linear-attention's peers where fla imports
    causal = {
        (r["type"], r["length"]): r
        for r in json.loads((tmp_path / "causal/results.json").read_text())["records"]
    }
    assert {"full", "linear", "performer", "rfa", "longformer"} <= {t for t, _ in causal}
    assert all(causal[t, 256]["status"] == "ok" for t in ("full", "linear", "performer", "rfa")), causal
    for peer in ("fla_linear_attn", "fla_linear_attn_256", "fla_simple_gla_256"):
        assert causal[peer, 256]["status"] == "ok" or "No module named" in causal[peer, 256]["error"]
    for ours in ("linear_fla", "performer_fla", "rfa_fla"):  # our types on the fla kernel, the same way
        record = causal[ours, 256]
        assert record["status"] == "ok" or "flash-linear-attention is not" in record["error"], record
    # the whole training step of the text model, exact attention (full_sdpa) first
    step = json.loads((tmp_path / "model_step/results.json").read_text())["records"]
    assert step[0]["type"] == "full_sdpa" and {"linear", "performer", "longformer"} <= {
        r["type"] for r in step
    }
    assert all(r["status"] == "ok" and r["mode"] == "train_step" for r in step), step
    assert "tokens/s" in (tmp_path / "model_step/summary.md").read_text()
    # decoding one token after prompts of each length, with the cache each type keeps
    decoding = json.loads((tmp_path / "generation/results.json").read_text())["records"]
    assert decoding[0]["type"] == "full_sdpa" and {"linear", "rfa"} <= {r["type"] for r in decoding}
    assert all(r["status"] == "ok" and r["mode"] == "decode_step" and r["cache_mib"] > 0 for r in decoding)
    assert "constant state" in (tmp_path / "generation/summary.md").read_text()
